"""A logical dump chunk's rows read by ``COPY (SELECT ...) TO STDOUT`` and encoded by the
fast path (``_transcode.transcode_copy_rows``): the thin I/O shell of
``LogicalDumpSource.read_chunk`` and ``read_keys``.

Why COPY: psycopg2 makes a Python str of every value of a SELECT (and a tuple of every
row) that the encoder then reads again; COPY's text format is the same text output
(pgoutput's), escaped, in one buffer that the compiled twin reads in place
(benchmarks/README.md, "PostgreSQL dump chunk reads"). The statement is the chunk's
SELECT with its parameters inlined by the driver (COPY takes no parameters), in the
caller's transaction (REPEATABLE READ, READ ONLY).

COPY's bytes are in the connection's client encoding: the fast path reads UTF-8 only, so
a connection in another encoding reads the SELECT's values as before (psycopg2 decodes
them) and encodes them by the reference path, row by row. So does an install without
the compiled twin (or with ``DATABUS_PURE_PYTHON=1``): unescaping COPY in Python costs
more than psycopg2's own decoding (benchmarks/README.md), and the reference twin of
``transcode_copy_rows`` is there to be the reference, not to be fast.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from databus.fetchers._api import DumpRow
from databus.fetchers.postgres import _transcode
from databus.fetchers.postgres._changes import TableCodec
from databus.fetchers.postgres._transcode import transcode_copy_rows
from databus.fetchers.postgres._transcode_python import reference_row

__all__ = ["EncodedRows", "read_encoded"]

# The rows (key, Avro body, fingerprint), and the last row's key columns as text (the
# cursor).
EncodedRows = tuple[list[DumpRow], list[Any] | None]

_UTF8 = frozenset({"UTF8", "UNICODE"})
COPY_READS = _transcode.IMPLEMENTATION == "native"


class _Sink:
    """The file psycopg2 writes COPY's data to: one ``write`` per row, kept as is."""

    __slots__ = ("parts", "write")

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.write = self.parts.append


def read_encoded(cur: Any, query: Any, params: Sequence[Any], codec: TableCodec
                 ) -> EncodedRows:
    """The rows of ``query`` (a SELECT of every column of ``codec``'s table, in order)
    encoded, and the cursor: by COPY in a UTF-8 session with the compiled twin, else by
    the SELECT itself."""
    if COPY_READS and str(cur.connection.encoding).upper() in _UTF8:
        statement = b"COPY (" + cur.mogrify(query, list(params)) + b") TO STDOUT"
        sink = _Sink()
        cur.copy_expert(statement.decode("utf-8"), sink)
        return transcode_copy_rows(b"".join(sink.parts), codec, DumpRow)
    cur.execute(query, list(params))
    rows = cur.fetchall()
    encoded = [DumpRow(*reference_row(row, codec), codec.fingerprint) for row in rows]
    return encoded, ([rows[-1][i] for i in codec.key_positions] if rows else None)

"""The reference twin of ``_avrorow_native.row``: the Avro bytes of an event decoded as
the client decodes them (fastavro, the writer schema) and laid out as the replicator's
row (``_avrorow.py``)."""

from __future__ import annotations

from io import BytesIO
from typing import Any

from fastavro import parse_schema, schemaless_reader

IMPLEMENTATION = "python"

_PARSED: dict[int, Any] = {}


def row(data: bytes, plan: Any) -> tuple[Any, ...] | None:
    """The row of ``data`` by ``plan`` (``_avrorow.Plan``), or None where the compiled
    twin declines (a value the plan's checks refuse: the caller decodes the value the
    general way then, which says what is wrong with it)."""
    schema, names, nul_checks, zero_texts = plan.reference
    parsed = _PARSED.get(id(schema))
    if parsed is None:
        parsed = _PARSED[id(schema)] = parse_schema(schema)
    buf = BytesIO(data)
    try:
        value: Any = schemaless_reader(buf, parsed, None)
    except Exception:
        return None
    if buf.tell() != len(data):
        return None
    out = [None if name is None else value.get(name) for name in names]
    for i in nul_checks:
        if isinstance(out[i], str) and "\x00" in out[i]:
            return None
    for i in zero_texts:  # MySQL's zero dates, as text: NULL (the converter's rule)
        if isinstance(out[i], str):
            out[i] = None
    return tuple(out)

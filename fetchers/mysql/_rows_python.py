"""The reference twin of ``_rows_native``: a dump chunk's rows, as the driver returned
them, to event keys and Avro bodies through the fetcher's own conversions
(``_select``'s ``convert`` per column, ``encode_row``, ``row_key_function``), the path
every dumped row took before the compiled one. It never declines."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from databus.fetchers._api import DumpRow
from databus.fetchers.mysql._avro_writers import encode_row

if TYPE_CHECKING:
    from databus.fetchers.mysql._rows import RowPlan

IMPLEMENTATION = "python"



def encode_rows(rows: list[tuple[Any, ...]], plan: RowPlan) -> tuple[list[Any], list[bytes]]:
    """(keys, values) of ``rows``, one each per row."""
    keys: list[Any] = []
    values: list[bytes] = []
    for row in rows:
        key, value = encode_row_reference(row, plan)
        keys.append(key)
        values.append(value)
    return keys, values


def encode_row_reference(row: tuple[Any, ...], plan: RowPlan) -> tuple[Any, bytes]:
    """One row: its values typed as pymysql types them, converted to the fetcher's
    Avro-native values, encoded and keyed."""
    converts = plan.converts
    native = [None if v is None else convert(v)
              for convert, v in zip(converts, plan.typed(row[:len(converts)]), strict=False)]
    value = encode_row(plan.writers, native)
    return plan.key_of(native, value), value


def make_rows(keys: list[Any], values: list[bytes], fingerprint: int,
              row_type: type[DumpRow]) -> list[DumpRow]:
    """``[row_type(key, value, fingerprint), ...]``."""
    return [row_type(k, v, fingerprint) for k, v in zip(keys, values, strict=True)]

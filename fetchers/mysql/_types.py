"""MySQL/MariaDB column types -> Avro: the type mapping. Pure. The row-image decoder is
``_binlog_values``, the Avro encoder ``_avro_writers``, event keys ``_keys``.

The mapping (``docs/binlog-fetcher.md`` has the same table with examples):

=============================================  =========================================
MySQL / MariaDB                                Avro (nullable columns: ``["null", T]``)
=============================================  =========================================
TINYINT, SMALLINT, MEDIUMINT (both signs),     ``int``
INT signed
INT UNSIGNED, BIGINT signed                    ``long``
BIGINT UNSIGNED                                ``fixed`` decimal(20, 0), 9 bytes
DECIMAL(p, s) / NUMERIC                        ``fixed`` decimal(p, s), named
                                               ``decimal_p_s``, size from p
FLOAT / DOUBLE                                 ``float`` / ``double``
BIT(1) / BIT(n > 1)                            ``boolean`` / ``bytes`` (big-endian,
                                               ceil(n / 8) bytes, as MySQL stores it)
YEAR                                           ``int`` (0 for YEAR 0000)
DATE                                           ``[int date, string]``
TIME(fsp)                                      ``long``: signed microseconds (TIME is a
                                               duration, -838:59:59 .. 838:59:59)
DATETIME(fsp)                                  ``[long local-timestamp-micros, string]``
TIMESTAMP(fsp)                                 ``long`` timestamp-micros (UTC); the zero
                                               TIMESTAMP is 0, the epoch, which no real
                                               TIMESTAMP can hold
CHAR, VARCHAR, TINYTEXT .. LONGTEXT            ``string`` (decoded from the column's
                                               charset)
BINARY(n), VARBINARY, TINYBLOB .. LONGBLOB     ``bytes`` (BINARY padded back to n bytes)
ENUM                                           ``string`` (the label; '' for the error
                                               value 0)
SET                                            ``array`` of ``string``, in definition
                                               order
JSON                                           ``string``, the JSON text (MariaDB's JSON
                                               is a LONGTEXT and arrives as such)
GEOMETRY, POINT, ...                           ``bytes``: 4-byte little-endian SRID, then
                                               the WKB (MySQL's internal format)
INET6, UUID, INET4 (MariaDB)                   ``bytes`` (16, 16, 4 bytes: the binlog
                                               logs them as BINARY(n))
=============================================  =========================================

DATE and DATETIME take a ``string`` branch for the values a calendar date cannot hold
and MySQL lets through: zero dates and zero parts (``0000-00-00``, ``2020-00-15``) and,
with ``ALLOW_INVALID_DATES``, days past the month's end. The string is what MySQL
prints, fraction digits included.

Decimals are ``fixed`` with a name made of precision and scale, not ``bytes``: the
Parsing Canonical Form drops logical types, so ``bytes`` decimals of different scales
would share a fingerprint and an ALTER from DECIMAL(10,2) to DECIMAL(10,4) would let
consumers decode new values with the old scale. The name is part of the canonical form.

Values here are "Avro-native": what the Avro encoder writes, before logical types
(days, microseconds, unscaled decimal ints). Consumers decoding with the schema get
``date``, ``datetime``, ``Decimal``.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeAlias

__all__ = [
    "ColumnSpec",
    "Kind",
    "Native",
    "Reader",
    "Writer",
    "avro_field_type",
    "decimal_fixed_size",
]


Native: TypeAlias = Any
"""An Avro-native column value: int, float, bool, str, bytes, list[str] or None."""

Reader: TypeAlias = Callable[[bytes, int], tuple[Native, int]]
Writer: TypeAlias = Callable[[Native, list[bytes]], None]



class Kind(enum.Enum):
    """What a column's values are, which fixes its Avro type."""

    INT = "int"
    LONG = "long"
    UINT64 = "uint64"
    FLOAT = "float"
    DOUBLE = "double"
    DECIMAL = "decimal"
    BOOL = "bool"
    BITS = "bits"
    YEAR = "year"
    DATE = "date"
    TIME = "time"
    DATETIME = "datetime"
    TIMESTAMP = "timestamp"
    TEXT = "text"
    BYTES = "bytes"
    ENUM = "enum"
    SET = "set"
    JSON = "json"
    GEOMETRY = "geometry"


@dataclass(frozen=True, slots=True)
class ColumnSpec:
    """One column: what the Avro schema needs, and what the binlog decoder needs.

    The schema depends only on ``name``, ``kind``, ``nullable`` and, for DECIMAL,
    ``precision`` and ``scale``, which both the binlog's table map and
    information_schema give alike. The other fields come from the table map and only
    steer decoding.
    """

    name: str
    kind: Kind
    nullable: bool
    unsigned: bool = False  # integers; decides how TINYINT .. MEDIUMINT are read
    precision: int = 0  # DECIMAL precision, BIT width, fractional digits of temporals
    scale: int = 0  # DECIMAL scale
    type_code: int = -1  # the binlog field type (FIELD_TYPE.*), -1 when not from a binlog
    length_size: int = 0  # bytes of the length prefix; storage bytes of ENUM / SET
    fixed_length: int = 0  # BINARY(n): n, the length MySQL pads to with NULs
    codec: str | None = None  # Python codec of a text column
    labels: tuple[str, ...] = ()  # ENUM labels (index 0 = '') / SET members


# -- Avro types -----------------------------------------------------------------------

_UINT64_PRECISION = 20  # 18446744073709551615 has 20 digits


def decimal_fixed_size(precision: int) -> int:
    """Bytes of a two's complement big-endian int that holds any ``precision`` digits."""
    size = 1
    while (1 << (8 * size - 1)) - 1 < 10**precision - 1:
        size += 1
    return size


def _decimal_type(precision: int, scale: int, namespace: str, defined: set[str]) -> Any:
    name = f"decimal_{precision}_{scale}"
    full = f"{namespace}.{name}" if namespace else name
    if full in defined:
        return full
    defined.add(full)
    return {
        "type": "fixed",
        "name": name,
        "size": decimal_fixed_size(precision),
        "logicalType": "decimal",
        "precision": precision,
        "scale": scale,
    }


_SIMPLE: dict[Kind, Any] = {
    Kind.INT: "int",
    Kind.LONG: "long",
    Kind.FLOAT: "float",
    Kind.DOUBLE: "double",
    Kind.BOOL: "boolean",
    Kind.BITS: "bytes",
    Kind.YEAR: "int",
    Kind.TIME: "long",
    Kind.TIMESTAMP: {"type": "long", "logicalType": "timestamp-micros"},
    Kind.TEXT: "string",
    Kind.BYTES: "bytes",
    Kind.ENUM: "string",
    Kind.SET: {"type": "array", "items": "string"},
    Kind.JSON: "string",
    Kind.GEOMETRY: "bytes",
}


def avro_field_type(column: ColumnSpec, namespace: str, defined: set[str]) -> Any:
    """The Avro type of ``column``; ``defined`` collects named types already written
    (a second DECIMAL of the same precision and scale refers to the first by name)."""
    kind = column.kind
    branches: list[Any]
    if kind is Kind.DECIMAL:
        branches = [_decimal_type(column.precision, column.scale, namespace, defined)]
    elif kind is Kind.UINT64:
        branches = [_decimal_type(_UINT64_PRECISION, 0, namespace, defined)]
    elif kind is Kind.DATE:
        branches = [{"type": "int", "logicalType": "date"}, "string"]
    elif kind is Kind.DATETIME:
        branches = [{"type": "long", "logicalType": "local-timestamp-micros"}, "string"]
    else:
        branches = [_SIMPLE[kind]]
    if column.nullable:
        return ["null", *branches]
    return branches[0] if len(branches) == 1 else branches



"""Acceptance: every row of the type-mapping table round-trips a real value, NULL and
edge values through a real relay, decoded with the registered Avro schema.

The table exists before the relay starts, so its schema is registered from
information_schema first: the binlog's table map must give the very same schema (one
version, one fingerprint).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
from decimal import Decimal
from pathlib import Path
from typing import Any

from databus.schemas import avro_name
from tests.fixtures.servers import MariaDBServer
from tests.integration.binlog_support import (
    binlog_relay,
    captured,
    fresh_database,
    source_uri,
    wait_for_scn,
)

DB = "bl_types"
UTC = dt.UTC
BIG = os.urandom(3 << 20)  # a 3 MiB LONGBLOB value

# (column, SQL type, [(SQL literal, expected) for the real value, edge 1, edge 2]).
# The NULL row stores NULL in every nullable column.
COLUMNS: list[tuple[str, str, list[tuple[str, Any]]]] = [
    ("ti", "TINYINT", [("-5", -5), ("-128", -128), ("127", 127)]),
    ("tiu", "TINYINT UNSIGNED", [("5", 5), ("255", 255), ("0", 0)]),
    ("si", "SMALLINT", [("-300", -300), ("-32768", -32768), ("32767", 32767)]),
    ("siu", "SMALLINT UNSIGNED", [("300", 300), ("65535", 65535), ("0", 0)]),
    ("mi", "MEDIUMINT", [("-70000", -70000), ("-8388608", -8388608), ("8388607", 8388607)]),
    ("miu", "MEDIUMINT UNSIGNED", [("70000", 70000), ("16777215", 16777215), ("0", 0)]),
    ("i", "INT", [("-100000", -100000), ("-2147483648", -2147483648),
                  ("2147483647", 2147483647)]),
    ("iu", "INT UNSIGNED", [("100000", 100000), ("4294967295", 4294967295), ("0", 0)]),
    ("bi", "BIGINT", [("-5000000000", -5000000000), ("-9223372036854775808", -(1 << 63)),
                      ("9223372036854775807", (1 << 63) - 1)]),
    ("biu", "BIGINT UNSIGNED", [("5000000000", Decimal(5000000000)),
                                ("18446744073709551615", Decimal(18446744073709551615)),
                                ("0", Decimal(0))]),
    ("dec", "DECIMAL(65,30)", [
        ("12345.6789", Decimal("12345.6789")),
        ("-" + "9" * 35 + "." + "9" * 30, Decimal("-" + "9" * 35 + "." + "9" * 30)),
        ("0.000000000000000000000000000001", Decimal("1E-30")),
    ]),
    ("dec2", "DECIMAL(10,2) UNSIGNED", [("1234.56", Decimal("1234.56")),
                                        ("99999999.99", Decimal("99999999.99")),
                                        ("0", Decimal(0))]),
    ("dec0", "DECIMAL(5,0)", [("-12", Decimal(-12)), ("-99999", Decimal(-99999)),
                              ("99999", Decimal(99999))]),
    ("f", "FLOAT", [("1.5", 1.5), ("-3.4028234663852886e38", -3.4028234663852886e38),
                    ("0", 0.0)]),
    ("d", "DOUBLE", [("3.141592653589793", 3.141592653589793),
                     ("1.7976931348623157e308", 1.7976931348623157e308),
                     ("-2.2250738585072014e-308", -2.2250738585072014e-308)]),
    ("b1", "BIT(1)", [("b'1'", True), ("b'0'", False), ("1", True)]),
    ("b9", "BIT(9)", [("b'100000001'", b"\x01\x01"), ("b'111111111'", b"\x01\xff"),
                      ("0", b"\x00\x00")]),
    ("b64", "BIT(64)", [("5", b"\x00" * 7 + b"\x05"), ("18446744073709551615", b"\xff" * 8),
                        ("0", b"\x00" * 8)]),
    ("y", "YEAR", [("2024", 2024), ("0", 0), ("2155", 2155)]),
    ("dte", "DATE", [("'2024-02-29'", dt.date(2024, 2, 29)), ("'0000-00-00'", "0000-00-00"),
                     ("'9999-12-31'", dt.date(9999, 12, 31))]),
    ("dte2", "DATE", [("'1000-01-01'", dt.date(1000, 1, 1)), ("'2020-00-15'", "2020-00-15"),
                      ("'2021-02-31'", "2021-02-31")]),
    ("tm", "TIME(6)", [("'12:34:56.789012'", 45296789012),
                       ("'-838:59:59.000000'", -3020399000000),
                       ("'-00:00:00.000001'", -1)]),
    ("tm0", "TIME", [("'-01:02:03'", -3723000000), ("'838:59:59'", 3020399000000),
                     ("'00:00:00'", 0)]),
    ("tm3", "TIME(3)", [("'-10:00:00.5'", -36000500000), ("'00:00:00.001'", 1000),
                        ("'-00:00:01.999'", -1999000)]),
    ("dtm", "DATETIME(6)", [
        ("'2024-05-06 07:08:09.123456'", dt.datetime(2024, 5, 6, 7, 8, 9, 123456)),
        ("'0000-00-00 00:00:00'", "0000-00-00 00:00:00.000000"),
        ("'9999-12-31 23:59:59.999999'", dt.datetime(9999, 12, 31, 23, 59, 59, 999999)),
    ]),
    ("dtm0", "DATETIME", [("'1000-01-01 00:00:00'", dt.datetime(1000, 1, 1)),
                          ("'2020-00-00 10:11:12'", "2020-00-00 10:11:12"),
                          ("'1970-01-01 00:00:00'", dt.datetime(1970, 1, 1))]),
    ("ts", "TIMESTAMP(3) NULL", [
        ("'2024-05-06 07:08:09.123'", dt.datetime(2024, 5, 6, 7, 8, 9, 123000, tzinfo=UTC)),
        ("'0000-00-00 00:00:00'", dt.datetime(1970, 1, 1, tzinfo=UTC)),
        ("'2038-01-19 03:14:07.999'", dt.datetime(2038, 1, 19, 3, 14, 7, 999000, tzinfo=UTC)),
    ]),
    ("c", "CHAR(10)", [("'abc'", "abc"), ("''", ""), ("'𝄞😀ü'", "𝄞😀ü")]),
    ("vc", "VARCHAR(300)", [("'hello'", "hello"), ("REPEAT('😀', 300)", "😀" * 300),
                            ("'a  '", "a  ")]),
    ("tx", "TEXT", [("'text'", "text"), ("''", ""), ("'\\\\ \\' \"'", "\\ ' \"")]),
    ("lt", "LONGTEXT CHARACTER SET latin1", [("'café €'", "café €"), ("''", ""),
                                             ("REPEAT('ÿ', 70000)", "ÿ" * 70000)]),
    ("bn", "BINARY(4)", [("'ab'", b"ab\x00\x00"), ("x'00000000'", b"\x00" * 4),
                         ("x'FFFFFFFF'", b"\xff" * 4)]),
    ("vb", "VARBINARY(10)", [("x'00ff'", b"\x00\xff"), ("''", b""), ("x'00'", b"\x00")]),
    ("bl", "BLOB", [("x'0102'", b"\x01\x02"), ("''", b""), ("REPEAT(x'ab', 65535)",
                                                            b"\xab" * 65535)]),
    ("lb", "LONGBLOB", [("x'01'", b"\x01"), ("''", b""), ("@big", BIG)]),
    ("e", "ENUM('a','b-c','ü')", [("'b-c'", "b-c"), ("'ü'", "ü"), ("'not a label'", "")]),
    ("st", "SET('x','y','z')", [("'x,z'", ["x", "z"]), ("''", []), ("'z,y,x'", ["x", "y", "z"])]),
    ("j", "JSON", [("'{\"a\": [1, 2.5, \"ü\"]}'", '{"a": [1, 2.5, "ü"]}'), ("'[]'", "[]"),
                   ("'null'", "null")]),
    ("g", "GEOMETRY", [("ST_GeomFromText('POINT(1 2)')", None),
                       ("ST_GeomFromText('LINESTRING(0 0, 1 1, 2 0)', 4326)", None),
                       ("ST_GeomFromText('POLYGON((0 0, 1 0, 1 1, 0 0))')", None)]),
    ("pt", "POINT", [("POINT(-1.5, 2)", None), ("POINT(0, 0)", None), ("POINT(1e300, -1e300)",
                                                                          None)]),
    ("ip", "INET6", [("'::1'", b"\x00" * 15 + b"\x01"), ("'::'", b"\x00" * 16),
                     ("'ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff'", b"\xff" * 16)]),
    # Column names that are not Avro names: sanitised (docs/binlog-fetcher.md).
    ("weird name-ü", "INT", [("1", 1), ("-1", -1), ("0", 0)]),
    ("1st", "INT", [("2", 2), ("-2", -2), ("0", 0)]),
    ("u", "UUID", [("'e3b0c442-98fc-1c14-9afb-f4c8996fb924'",
                    bytes.fromhex("e3b0c44298fc1c149afbf4c8996fb924")),
                   ("'00000000-0000-0000-0000-000000000000'", b"\x00" * 16),
                   ("'ffffffff-ffff-ffff-ffff-ffffffffffff'", b"\xff" * 16)]),
]
# NOT NULL columns: no null branch in their Avro type. The NULL row uses the real value.
NOT_NULL: list[tuple[str, str, list[tuple[str, Any]]]] = [
    ("nn_biu", "BIGINT UNSIGNED NOT NULL", [("1", Decimal(1)),
                                            ("18446744073709551615", Decimal(2**64 - 1)),
                                            ("9223372036854775808", Decimal(2**63))]),
    ("nn_dte", "DATE NOT NULL", [("'2000-01-01'", dt.date(2000, 1, 1)),
                                 ("'0000-00-00'", "0000-00-00"),
                                 ("'0001-01-01'", dt.date(1, 1, 1))]),
    ("nn_dtm", "DATETIME(3) NOT NULL", [
        ("'2000-01-01 00:00:00.5'", dt.datetime(2000, 1, 1, 0, 0, 0, 500000)),
        ("'0000-00-00 00:00:00.000'", "0000-00-00 00:00:00.000"),
        ("'0001-01-01 00:00:00'", dt.datetime(1, 1, 1)),
    ]),
    ("nn_txt", "VARCHAR(5) NOT NULL", [("'x'", "x"), ("''", ""), ("'😀😀😀😀😀'", "😀" * 5)]),
    ("nn_set", "SET('a','b') NOT NULL", [("'a'", ["a"]), ("''", []), ("'a,b'", ["a", "b"])]),
]
ALL = COLUMNS + NOT_NULL


def test_every_type_round_trips(mariadb_server: MariaDBServer, tmp_path: Path) -> None:
    sql = fresh_database(mariadb_server, DB)
    sql.run(
        "SET SESSION time_zone = '+00:00'",
        "SET SESSION sql_mode = 'ALLOW_INVALID_DATES'",  # not strict: zero dates, '' ENUM
        "SET @big = FROM_BASE64('" + __import__("base64").b64encode(BIG).decode() + "')",
        "CREATE TABLE t (id INT PRIMARY KEY, "
        + ", ".join(f"`{name}` {sql_type}" for name, sql_type, _ in ALL) + ")",
    )
    names = ["id"] + [name for name, _, _ in ALL]

    def insert(row_id: int, which: int | None) -> str:
        literals = [str(row_id)]
        for name, _, values in ALL:
            if which is None and (name, _, values) in COLUMNS:
                literals.append("NULL")
            else:
                literals.append(values[which or 0][0])
        columns = ", ".join(f"`{n}`" for n in names)
        return f"INSERT INTO t ({columns}) VALUES ({', '.join(literals)})"

    async def scenario() -> None:
        async with binlog_relay(tmp_path, source_uri(mariadb_server, f"{DB}.t")) as r:
            last = 0
            for row_id, which in ((1, 0), (2, None), (3, 1), (4, 2)):
                last = sql.txn(insert(row_id, which))
            await wait_for_scn(r, last)
            windows, _ = await captured(r)
            versions = await r.json("/v1/schemas", source=f"{DB}.t")
            assert len(versions["versions"]) == 1, (
                "information_schema and the binlog must give the same schema"
            )
        rows = {w.changes[0].key: w.changes[0].row for w in windows}
        assert sorted(rows) == [1, 2, 3, 4]
        # Geometry values are MySQL's internal format, as SELECT returns them.
        stored = {row[0]: row[1:] for row in sql.query("SELECT id, g, pt FROM t")}
        for row_id, which in ((1, 0), (2, None), (3, 1), (4, 2)):
            row = rows[row_id]
            assert row["id"] == row_id
            for name, _, values in ALL:
                if which is None and (name, _, values) in COLUMNS:
                    expected = None
                else:
                    expected = values[which or 0][1]
                if name in ("g", "pt") and expected is None and which is not None:
                    expected = stored[row_id][0 if name == "g" else 1]
                field = avro_name(name)
                assert row[field] == expected, (row_id, name, row[field], expected)

    asyncio.run(scenario())
    sql.close()

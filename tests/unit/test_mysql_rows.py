

# -- the C driver's glue (_dump_read) ---------------------------------------------------


def test_driver_errors_become_pymysql_errors_of_the_same_code() -> None:
    """The dump maps the C driver's errors as it maps pymysql's (``source_error``)."""
    from databus.fetchers.mysql import _dump_read

    class OperationalError(Exception):
        pass

    class Unknown(Exception):
        pass

    lost = _dump_read.as_pymysql_error(OperationalError(2013, "Lost connection"))
    assert type(lost).__name__ == "OperationalError" and lost.args == (2013, "Lost connection")
    other = _dump_read.as_pymysql_error(Unknown(1146, "Table 'x.y' doesn't exist"))
    assert other.args[0] == 1146


def test_the_cursor_of_a_mysqldb_row_is_pymysqls() -> None:
    """MySQLdb gives a BIGINT key's text as bytes; the chunk cursor holds the int."""
    from databus.fetchers.mysql import _dump_read

    lay = layout([col("a", Kind.LONG, False), col("b", Kind.TEXT, False),
                  col("c", Kind.BYTES, False), col("d", Kind.DOUBLE, False)],
                 key=(0, 1, 2, 3))
    assert _dump_read.cursor_values(lay, [b"-5", "x", b"\x00", b"1.5"]) == [
        -5, "x", b"\x00", 1.5]

"""The Avro value codec: schemaless Avro binary (fastavro), with writer->reader resolution.

Event values are Avro records without any framing: the writer schema is named by the
fingerprint in the event header (DESIGN sections 2 and 5). Decoding resolves the
writer schema to the consumer's reader schema by the Avro rules, except when both have
the same fingerprint: then the bytes are read directly with the reader's schema, which
costs half as much as resolving (same PCF means same encoding, and reading with the
reader's own schema keeps its logical types).

The hot path does no schema parsing (each ``Schema`` is parsed once, when built) and
allocates one ``BytesIO`` per call, which also keeps the codec thread-safe.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from io import BytesIO
from typing import Any

from fastavro import schemaless_reader, schemaless_writer
from fastavro.read import SchemaResolutionError
from fastavro.validation import validate

from databus.errors import SchemaError, UnknownSchemaError
from databus.schemas._canonical import Schema
from databus.schemas._registry import SchemaRegistry

BytesLike = bytes | bytearray | memoryview


class AvroCodec:
    """Encodes values to schemaless Avro binary and decodes them back.

    ``registry`` lets ``decode`` take a writer fingerprint instead of a ``Schema``;
    schemas looked up there are cached by fingerprint (registries never forget one).

    ``strict`` (the default) rejects records with fields the schema does not have, and
    fields missing without a default; it costs nothing measurable. ``validate`` also
    checks every value against its type before writing (``int`` range, ``float`` given
    for ``int``, ...), which fastavro's writer does not: it costs about 5x the encoding,
    so it is off by default.
    """

    __slots__ = ("_cache", "_registry", "_strict", "_validate")

    def __init__(
        self,
        registry: SchemaRegistry | None = None,
        *,
        strict: bool = True,
        validate: bool = False,
        schemas: Iterable[Schema] = (),
    ) -> None:
        self._registry = registry
        self._strict = strict
        self._validate = validate
        self._cache: dict[int, Schema] = {s.fingerprint: s for s in schemas}

    def add(self, schema: Schema) -> None:
        """Make ``schema`` known by fingerprint without a registry."""
        self._cache.setdefault(schema.fingerprint, schema)

    def has(self, fingerprint: int) -> bool:
        """Whether ``schema(fingerprint)`` would answer without raising."""
        if fingerprint in self._cache:
            return True
        try:
            self.schema(fingerprint)
        except UnknownSchemaError:
            return False
        return True

    def schema(self, fingerprint: int) -> Schema:
        """The writer schema with this fingerprint, from the cache or the registry."""
        schema = self._cache.get(fingerprint)
        if schema is None:
            if self._registry is None:
                raise UnknownSchemaError(
                    f"no schema with fingerprint 0x{fingerprint:016x} and no registry to ask"
                )
            schema = self._registry.get(fingerprint)
            # A racing thread may store the same schema too: harmless, so no lock.
            self._cache[fingerprint] = schema
        return schema

    def encode(self, value: Any, schema: Schema) -> bytes:
        """``value`` (a dict for a record) as schemaless Avro binary."""
        parsed = schema.parsed
        buf = BytesIO()
        try:
            if self._validate:
                validate(value, parsed, raise_errors=True)  # the writer checks fields
            schemaless_writer(buf, parsed, value, strict_allow_default=self._strict)
        except Exception as exc:  # fastavro raises ValueError, TypeError, OverflowError...
            raise SchemaError(
                f"value does not fit schema {schema.name} (0x{schema.fingerprint:016x}): "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        return buf.getvalue()

    def decoder(self, writer: Schema | int, reader: Schema | None = None
                ) -> Callable[[BytesLike], Any]:
        """``decode`` of one writer (and reader) schema as a function of the bytes."""
        if not isinstance(writer, Schema):
            writer = self.schema(writer)
        return _decoder(writer, reader)

    def decode(self, data: BytesLike, writer: Schema | int, reader: Schema | None = None) -> Any:
        """Decode ``data`` written with ``writer`` (a schema or its fingerprint).

        With a ``reader`` schema of another fingerprint the value is resolved to it by
        the Avro rules (added fields take their defaults, removed fields are skipped,
        ``int`` is promoted to ``long``, ...). All of ``data`` must be consumed.
        """
        if not isinstance(writer, Schema):
            writer = self.schema(writer)
        return _decoder(writer, reader)(data)


def _decoder(writer: Schema, reader: Schema | None) -> Callable[[BytesLike], Any]:
    # ``AvroCodec.decode`` with the schema lookups done once (a batch of events of one
    # writer schema calls the result per value).
    if reader is None or reader.fingerprint == writer.fingerprint:
        parsed, reader_parsed = (reader or writer).parsed, None
    else:
        parsed, reader_parsed = writer.parsed, reader.parsed

    def decode(data: BytesLike) -> Any:
        buf = BytesIO(data)
        try:
            value = schemaless_reader(buf, parsed, reader_parsed)
        except Exception as exc:
            raise _decode_error(exc, len(data), writer, reader) from exc
        if buf.tell() != len(data):
            raise SchemaError(
                f"{len(data) - buf.tell()} trailing bytes after a value of writer schema "
                f"{writer.name} (0x{writer.fingerprint:016x}): corrupted or wrong schema"
            )
        return value

    return decode


def _decode_error(exc: Exception, size: int, writer: Schema, reader: Schema | None) -> SchemaError:
    if isinstance(exc, SchemaResolutionError) and reader is not None:
        return SchemaError(
            f"reader schema {reader.name} (0x{reader.fingerprint:016x}) cannot read "
            f"values of writer schema {writer.name} (0x{writer.fingerprint:016x}): {exc}"
        )
    return SchemaError(
        f"cannot decode {size} bytes with writer schema {writer.name} "
        f"(0x{writer.fingerprint:016x}): {type(exc).__name__}: {exc}"
    )

"""Avro schemas: canonical form and fingerprints, the schema registry and the value codec.

- ``Schema``: a validated schema with its full name, Parsing Canonical Form and
  CRC-64-AVRO fingerprint (the fingerprint every event header carries).
- ``parsing_canonical_form``, ``fingerprint``, ``fingerprint_bytes``: the same for raw
  JSON schemas, per the Avro specification.
- ``SchemaRegistry`` (interface) and ``MemorySchemaRegistry``: every version of every
  source's schema, kept forever.
- ``AvroCodec``: values to schemaless Avro binary and back, resolving the writer schema
  to a reader schema only when their fingerprints differ.

Pure: nothing here does I/O.
"""

from __future__ import annotations

from databus.errors import UnknownSchemaError
from databus.schemas._canonical import (
    EMPTY64,
    PRIMITIVE_TYPES,
    JsonSchema,
    Schema,
    SchemaLike,
    as_schema,
    crc64_avro,
    fingerprint,
    fingerprint_bytes,
    fingerprint_from_bytes,
    fingerprint_to_bytes,
    parsing_canonical_form,
    to_signed64,
    to_unsigned64,
)
from databus.schemas._codec import AvroCodec
from databus.schemas._names import avro_name, avro_names
from databus.schemas._registry import MemorySchemaRegistry, SchemaRegistry

__all__ = [
    "EMPTY64",
    "PRIMITIVE_TYPES",
    "AvroCodec",
    "JsonSchema",
    "MemorySchemaRegistry",
    "Schema",
    "SchemaLike",
    "SchemaRegistry",
    "UnknownSchemaError",
    "as_schema",
    "avro_name",
    "avro_names",
    "crc64_avro",
    "fingerprint",
    "fingerprint_bytes",
    "fingerprint_from_bytes",
    "fingerprint_to_bytes",
    "parsing_canonical_form",
    "to_signed64",
    "to_unsigned64",
]

"""Codec throughput for 2.5 KB events, as ratios against raw zlib.crc32 in the same run.

    .venv/bin/python benchmarks/codec.py [--events 20000] [--repeat 5]
    DATABUS_PURE_PYTHON=1 .venv/bin/python benchmarks/codec.py   # the Python twin

Batch rows (the event core, ``databus.batch``, issue 14): ``scan`` of the whole body
(header checks, header CRC, body CRC of every event, arrays out) against one
``zlib.crc32`` over the same body (goal >= 0.8); ``encode_event`` per event.

Rows: Avro encode + event encode; header decode + both CRC checks (what a relay or a
client does to validate bytes); full decode (verify + key + Avro value to a dict). The
reference is ``zlib.crc32`` over the same event bytes, the floor of any CRC-checked
read. A second ratio compares encode and full decode with raw fastavro
(schemaless_writer/reader on the same values), to show what the event layer adds.
Each figure is the best of ``--repeat`` runs, to dampen a noisy shared machine.
"""

from __future__ import annotations

import argparse
import io
import platform
import time
import zlib
from collections.abc import Callable

from fastavro import schemaless_reader, schemaless_writer

from databus import batch
from databus.event import Op, decode_event, encode_event, verify_event
from databus.schemas import AvroCodec, Schema

SCHEMA = Schema(
    {
        "type": "record",
        "name": "Order",
        "namespace": "shop",
        "fields": [
            {"name": "id", "type": "long"},
            {"name": "customer", "type": "string"},
            {"name": "status", "type": {"type": "enum", "name": "Status",
                                        "symbols": ["NEW", "PAID", "SHIPPED"]}},
            {"name": "amount_cents", "type": "long"},
            {"name": "note", "type": ["null", "string"], "default": None},
            {"name": "payload", "type": "bytes"},
            {"name": "updated_at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        ],
    }
)


def make_value(i: int) -> dict[str, object]:
    return {
        "id": i,
        "customer": f"customer-{i % 9973:05d}",
        "status": ("NEW", "PAID", "SHIPPED")[i % 3],
        "amount_cents": 1999 + i,
        "note": None if i % 2 else "gift wrap, leave at the door",
        "payload": bytes((i + j) % 256 for j in range(2300)),
        "updated_at": 1_700_000_000_000_000 + i,
    }


def best_rate(fn: Callable[[], int], repeat: int) -> float:
    """Items per second of the fastest of ``repeat`` runs of ``fn`` (returns item count)."""
    best = 0.0
    for _ in range(repeat):
        start = time.perf_counter()
        n = fn()
        best = max(best, n / (time.perf_counter() - start))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    codec = AvroCodec(schemas=[SCHEMA])
    values = [make_value(i) for i in range(args.events)]
    fp = SCHEMA.fingerprint

    def encode_all() -> list[bytes]:
        return [
            encode_event(scn=1000 + i, source_id=1, op=Op.UPSERT, key=v["id"],  # type: ignore[arg-type]
                         value=codec.encode(v, SCHEMA), timestamp_ns=i, schema_fingerprint=fp)
            for i, v in enumerate(values)
        ]

    events = encode_all()
    size = sum(map(len, events)) / len(events)

    def crc_all() -> int:
        for e in events:
            zlib.crc32(e)
        return len(events)

    def encode() -> int:
        return len(encode_all())

    def verify() -> int:
        for e in events:
            verify_event(e)
        return len(events)

    def full_decode() -> int:
        for e in events:
            ev = decode_event(e)
            ev.key  # noqa: B018 - decoding the key is part of a full decode
            codec.decode(ev.value, ev.header.schema_fingerprint)
        return len(events)

    raw_values = [decode_event(e).value for e in events]
    parsed = SCHEMA.parsed

    def raw_fastavro_encode() -> int:
        for v in values:
            out = io.BytesIO()
            schemaless_writer(out, parsed, v)
        return len(values)

    def raw_fastavro_decode() -> int:
        for raw in raw_values:
            schemaless_reader(io.BytesIO(raw), parsed, None)
        return len(raw_values)

    body = b"".join(events)

    def crc_body() -> int:
        zlib.crc32(body)
        return len(events)

    def batch_scan() -> int:
        return batch.scan(body).check().count

    encoded_values = [codec.encode(v, SCHEMA) for v in values]

    def batch_encode() -> int:
        enc = batch.encode_event
        for i, v in enumerate(values):
            enc(1000 + i, Op.UPSERT, 1, v["id"], encoded_values[i], fp, i)
        return len(values)

    def event_encode() -> int:
        for i, v in enumerate(values):
            encode_event(scn=1000 + i, source_id=1, op=Op.UPSERT, key=v["id"],  # type: ignore[arg-type]
                         value=encoded_values[i], timestamp_ns=i, schema_fingerprint=fp)
        return len(values)

    # Alternated, best of each: the two read the same 48 MB, and a machine's memory
    # bandwidth drifts between runs more than either differs from the other.
    body_crc = scan_rate = 0.0
    for _ in range(args.repeat * 2):
        body_crc = max(body_crc, best_rate(crc_body, 1))
        scan_rate = max(scan_rate, best_rate(batch_scan, 1))
    batch_enc = best_rate(batch_encode, args.repeat)
    event_enc = best_rate(event_encode, args.repeat)
    reference = best_rate(crc_all, args.repeat)
    fastavro_enc = best_rate(raw_fastavro_encode, args.repeat)
    fastavro_dec = best_rate(raw_fastavro_decode, args.repeat)
    rows = [
        ("encode (Avro value + event)", best_rate(encode, args.repeat)),
        ("verify (header + header CRC + body CRC)", best_rate(verify, args.repeat)),
        ("full decode (verify + key + Avro value)", best_rate(full_decode, args.repeat)),
    ]
    print(f"# codec benchmark: {args.events} events of {size:.0f} bytes, best of {args.repeat}; "
          f"Python {platform.python_version()} on {platform.machine()}")
    print(f"reference zlib.crc32: {reference:,.0f} events/s ({reference * size / 1e6:,.0f} MB/s)")
    print("| operation | events/s | MB/s | ratio to zlib.crc32 | ratio to raw fastavro |")
    print("|---|---:|---:|---:|---:|")
    raw = {rows[0][0]: fastavro_enc, rows[2][0]: fastavro_dec}
    for name, rate in rows:
        vs_avro = f"{rate / raw[name]:.2f}" if name in raw else "-"
        print(f"| {name} | {rate:,.0f} | {rate * size / 1e6:,.0f} | {rate / reference:.3f} "
              f"| {vs_avro} |")
    print(f"raw fastavro: encode {fastavro_enc:,.0f}/s, decode {fastavro_dec:,.0f}/s "
          f"({fastavro_enc / reference:.3f} and {fastavro_dec / reference:.3f} of zlib.crc32)")

    print(f"\n## event core ({batch.IMPLEMENTATION})")
    print("| operation | events/s | ratio |")
    print("|---|---:|---:|")
    print(f"| zlib.crc32 over the whole body (reference) | {body_crc:,.0f} | 1.000 |")
    print(f"| batch.scan of the body (verify every event) | {scan_rate:,.0f} "
          f"| **{scan_rate / body_crc:.3f}** (goal >= 0.8) |")
    print(f"| databus.event.encode_event (the reference encoder, no Avro) | {event_enc:,.0f} "
          "| 1.00 |")
    print(f"| batch.encode_event (no Avro) | {batch_enc:,.0f} | {batch_enc / event_enc:.2f} |")

if __name__ == "__main__":
    main()


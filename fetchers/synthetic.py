"""The synthetic fetcher: a deterministic load generator for demos, tests and benchmarks.

URI (every parameter optional)::

    synthetic://?rate=1000&keys=100000&event_bytes=2500&events_per_window=1
                &update_ratio=0.5&delete_ratio=0&seed=0&limit=0&source=synthetic.events

=================  ================  ====================================================
parameter          default           meaning
=================  ================  ====================================================
rate               1000              data events per second (windows per second is
                                     rate / events_per_window); 0 = as fast as possible
keys               100000            size of the key space (int keys 0 .. keys-1)
event_bytes        512               target size of one encoded event, header included
                                     (exact within a byte; never below the fixed part)
events_per_window  1                 data events per window (transaction)
update_ratio       0.5               fraction of events that update an existing key
delete_ratio       0.0               fraction of events that delete an existing key
seed               0                 any int64; same seed, same stream
limit              0                 the last SCN to produce, then idle until stopped
                                     (from an empty buffer: exactly ``limit`` windows);
                                     0 = unlimited
source             synthetic.events  logical source name(s), comma-separated; a
                                     window's events go to them round-robin
=================  ================  ====================================================

The stream is a pure function of (parameters, SCN): window ``scn`` holds events
``n = (scn - 1) * events_per_window + i``, so a fetcher restarted after SCN s produces
exactly the windows it would have produced after s (only timestamps differ). Inserts
are spread evenly (Bresenham): ``ceil(n * p)`` keys exist before event n, with
``p = 1 - update_ratio - delete_ratio``, and event n inserts key ``ceil(n * p)`` when
that count grows. Every other event updates or deletes a key drawn uniformly from those
issued, from a generator seeded by (seed, SCN) (splitmix64 over BLAKE2b: stable across
Python versions, unlike ``hash()``). A delete does not take its key out of the pool;
once all ``keys`` keys are issued, inserts turn into updates; with ``p = 0`` the key
space counts as pre-populated.

Each source gets an Avro record schema named after it (``synthetic.events`` ->
record ``events`` in namespace ``synthetic``): ``id`` long (the key), ``seq`` long (n),
``op_note`` string (``insert``, ``update`` or ``delete``), ``payload`` bytes (sized to
reach ``event_bytes``; empty for deletes). The fixed schema is encoded by hand, which
saves a fastavro call per event; the tests decode it with the real codec.

Rate limiting sleeps on the ``stop`` event, so stopping is prompt. A generator that
falls more than a second behind its schedule drops the backlog instead of bursting. The
source SCN it reports is where its clock says the stream should be (at least the last
SCN produced, at most ``limit``), so the relay's lag shows when it cannot keep up.
"""

from __future__ import annotations

import difflib
import hashlib
import math
import re
import struct
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import ClassVar
from urllib.parse import parse_qsl, urlsplit

from databus.batch import encode_event
from databus.errors import ConfigError
from databus.event import HEADER_SIZE, Op
from databus.fetchers._api import ConfiguredSources, Fetcher, FetcherContext, WindowSink
from databus.schemas import Schema

__all__ = [
    "SyntheticFetcher",
    "SyntheticGenerator",
    "SyntheticParams",
    "SyntheticSource",
    "synthetic_schema",
]

_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
_MAX_EVENT_BYTES = 16 << 20
_MAX_EVENTS_PER_WINDOW = 1_000_000
_MAX_KEYS = 1 << 62
# Catch-up bound: further behind the schedule than this, the generator starts over.
_MAX_BEHIND_S = 1.0
_IDLE_BEAT_S = 0.5  # read-through reports once the limit is reached
# Ahead of the schedule by less than this, keep producing: a sleep costs about as much.
_MIN_SLEEP_S = 0.001
_BLOCK_SLACK = 4096
_INT_KEY_BYTES = 8
_MASK64 = (1 << 64) - 1
_SEED = struct.Struct(">qq")
_SOURCE_NAME_RE = re.compile(r"[^\s,]{1,255}")

_NOTES = ("insert", "update", "delete")
_INSERT, _UPDATE, _DELETE = range(3)


def _varint(value: int) -> bytes:
    """Avro's zigzag varint encoding of a long."""
    z = ((value << 1) ^ (value >> 63)) & _MASK64
    out = bytearray()
    while z > 0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


_ENCODED_NOTES = tuple(_varint(len(n)) + n.encode() for n in _NOTES)


@lru_cache(maxsize=4096)
def _payload_len(room: int) -> int:
    """The largest payload whose Avro ``bytes`` encoding (length + data) fits ``room``."""
    p = max(room - 1, 0)
    while p and p + len(_varint(p)) > room:
        p -= 1
    return p


# -- parameters ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SyntheticParams:
    """The validated parameters of a ``synthetic://`` URI (see the module docstring)."""

    rate: float = 1000.0
    keys: int = 100_000
    event_bytes: int = 512
    events_per_window: int = 1
    update_ratio: float = 0.5
    delete_ratio: float = 0.0
    seed: int = 0
    limit: int = 0
    sources: tuple[str, ...] = ("synthetic.events",)

    @property
    def insert_ratio(self) -> float:
        return max(0.0, 1.0 - self.update_ratio - self.delete_ratio)

    @classmethod
    def from_uri(cls, uri: str) -> SyntheticParams:
        """Parse and validate ``uri``; ``ConfigError`` naming the bad parameter."""
        parts = urlsplit(uri)
        if parts.scheme != "synthetic":
            raise ConfigError(f"not a synthetic:// URI (scheme {parts.scheme!r})")
        if parts.netloc or parts.path not in ("", "/") or parts.fragment:
            raise ConfigError("synthetic source: takes no host, path or fragment, only ?params")
        raw: dict[str, str] = {}
        for name, value in parse_qsl(parts.query, keep_blank_values=True):
            if name in raw:
                raise ConfigError(f"synthetic source: parameter {name!r} is given twice")
            raw[name] = value
        known = ("rate", "keys", "event_bytes", "events_per_window", "update_ratio",
                 "delete_ratio", "seed", "limit", "source")
        for name in raw:
            if name not in known:
                close = difflib.get_close_matches(name, known, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ConfigError(
                    f"synthetic source: unknown parameter {name!r}{hint}; "
                    f"known: {', '.join(known)}"
                )
        d = cls()
        params = cls(
            rate=_float(raw, "rate", d.rate, lo=0.0),
            keys=_int(raw, "keys", d.keys, lo=1, hi=_MAX_KEYS),
            event_bytes=_int(raw, "event_bytes", d.event_bytes, lo=1, hi=_MAX_EVENT_BYTES),
            events_per_window=_int(
                raw, "events_per_window", d.events_per_window, lo=1, hi=_MAX_EVENTS_PER_WINDOW
            ),
            update_ratio=_float(raw, "update_ratio", d.update_ratio, lo=0.0, hi=1.0),
            delete_ratio=_float(raw, "delete_ratio", d.delete_ratio, lo=0.0, hi=1.0),
            seed=_int(raw, "seed", d.seed, lo=_INT64_MIN, hi=_INT64_MAX),
            limit=_int(raw, "limit", d.limit, lo=0, hi=_INT64_MAX),
            sources=_sources(raw.get("source"), d.sources),
        )
        if params.update_ratio + params.delete_ratio > 1.0:
            raise ConfigError(
                "synthetic source: update_ratio + delete_ratio must be at most 1, got "
                f"{params.update_ratio} + {params.delete_ratio}"
            )
        return params


def _number(raw: dict[str, str], name: str, kind: type[int] | type[float]) -> int | float | None:
    text = raw.get(name)
    if text is None:
        return None
    try:
        value = kind(text.strip())
    except ValueError:
        raise ConfigError(
            f"synthetic source: {name} must be {'an integer' if kind is int else 'a number'}, "
            f"got {text!r}"
        ) from None
    if not math.isfinite(value):
        raise ConfigError(f"synthetic source: {name} must be finite, got {text!r}")
    return value


def _check(name: str, value: float, lo: float | None, hi: float | None) -> None:
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        bounds = f"at least {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ConfigError(f"synthetic source: {name} must be {bounds}, got {value}")


def _int(raw: dict[str, str], name: str, default: int, *, lo: int, hi: int) -> int:
    value = _number(raw, name, int)
    result = default if value is None else int(value)
    _check(name, result, lo, hi)
    return result


def _float(
    raw: dict[str, str], name: str, default: float, *, lo: float, hi: float | None = None
) -> float:
    value = _number(raw, name, float)
    result = default if value is None else float(value)
    _check(name, result, lo, hi)
    return result


def _sources(text: str | None, default: tuple[str, ...]) -> tuple[str, ...]:
    if text is None:
        return default
    names = tuple(n.strip() for n in text.split(","))
    if (not all(_SOURCE_NAME_RE.fullmatch(n) for n in names)) or len(set(names)) != len(names):
        raise ConfigError(
            "synthetic source: source must be distinct names without whitespace, "
            f"comma-separated, got {text!r}"
        )
    return names


# -- schema and generator (pure) ----------------------------------------------------


def _avro_name(segment: str) -> str:
    name = re.sub(r"[^A-Za-z0-9_]", "_", segment)
    return name if name and not name[0].isdigit() else "_" + name


def synthetic_schema(source: str) -> Schema:
    """The Avro record schema of a synthetic source's events."""
    *namespace, name = [_avro_name(s) for s in source.split(".")]
    schema: dict[str, object] = {
        "type": "record",
        "name": name,
        "doc": "Synthetic change events from the databus load generator",
        "fields": [
            {"name": "id", "type": "long"},
            {"name": "seq", "type": "long"},
            {"name": "op_note", "type": "string"},
            {"name": "payload", "type": "bytes"},
        ],
    }
    if namespace:
        schema["namespace"] = ".".join(namespace)
    return Schema(schema)


class _SplitMix64:
    """splitmix64: a tiny, fast, fully specified PRNG (stable across Python versions)."""

    __slots__ = ("state",)

    def __init__(self, seed: int, scn: int) -> None:
        digest = hashlib.blake2b(_SEED.pack(seed, scn), digest_size=8).digest()
        self.state = int.from_bytes(digest, "big")

    def next(self) -> int:
        self.state = z = (self.state + 0x9E3779B97F4A7C15) & _MASK64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        return z ^ (z >> 31)

    def uniform(self) -> float:
        """A float in [0, 1)."""
        return (self.next() >> 11) * (1.0 / (1 << 53))

    def below(self, n: int) -> int:
        """An int in [0, n) (modulo bias: at most n / 2**64, irrelevant for load)."""
        return self.next() % n


@dataclass(frozen=True, slots=True)
class SyntheticSource:
    """A logical source as the generator writes it."""

    name: str
    id: int
    fingerprint: int


class SyntheticGenerator:
    """Builds the encoded events of any window from (parameters, SCN). No I/O, no clock."""

    def __init__(
        self, params: SyntheticParams, sources: Sequence[SyntheticSource], partition_id: int = 0
    ) -> None:
        if len(sources) != len(params.sources):
            raise ValueError("one SyntheticSource per configured source name")
        self.params = params
        self.sources = tuple(sources)
        self.partition_id = partition_id
        self._p = params.insert_ratio
        # Among the events that are not inserts: the share of deletes.
        other = params.update_ratio + params.delete_ratio
        self._delete_share = params.delete_ratio / other if other > 0 else 0.0
        # Payloads are slices of one seeded block: deterministic and cheap to cut.
        block = _SplitMix64(params.seed, -1)
        words = (params.event_bytes + _BLOCK_SLACK) // 8 + 1
        self._block = b"".join(block.next().to_bytes(8, "big") for _ in range(words))

    def _kind_and_key(self, n: int, rng: _SplitMix64) -> tuple[int, int]:
        """(kind, key) of event number ``n``."""
        keys = self.params.keys
        p = self._p
        issued = math.ceil(n * p)
        if math.ceil((n + 1) * p) > issued and issued < keys:
            return _INSERT, issued
        pool = min(issued, keys) or keys  # p == 0: the key space is pre-populated
        kind = _DELETE if rng.uniform() < self._delete_share else _UPDATE
        return kind, rng.below(pool)

    def window(self, scn: int, timestamp_ns: int = 0) -> list[bytes]:
        """The encoded data events of window ``scn``."""
        params = self.params
        epw = params.events_per_window
        rng = _SplitMix64(params.seed, scn)
        sources = self.sources
        out = []
        for i in range(epw):
            n = (scn - 1) * epw + i
            kind, key = self._kind_and_key(n, rng)
            source = sources[n % len(sources)]
            prefix = _varint(key) + _varint(n) + _ENCODED_NOTES[kind]
            if kind == _DELETE:
                payload = b""
            else:
                size = _payload_len(
                    params.event_bytes - HEADER_SIZE - _INT_KEY_BYTES - len(prefix)
                )
                offset = rng.below(_BLOCK_SLACK)
                payload = self._block[offset : offset + size]
            out.append(encode_event(
                scn, Op.DELETE if kind == _DELETE else Op.UPSERT, source.id, key,
                prefix + _varint(len(payload)) + payload, source.fingerprint, timestamp_ns,
                self.partition_id))
        return out


# -- the fetcher (thread shell) -----------------------------------------------------


class SyntheticFetcher(Fetcher):
    """``synthetic://``: writes generated windows at a steady rate."""

    scheme: ClassVar[str] = "synthetic"

    def __init__(self, uri: str, context: FetcherContext) -> None:
        super().__init__(uri, context)
        self.params = SyntheticParams.from_uri(uri)  # config errors surface at start-up

    def configured_sources(self) -> ConfiguredSources:
        """``source=``: its names are listed by the relay from the start."""
        return ConfiguredSources(names=frozenset(self.params.sources))

    def _generator(self) -> SyntheticGenerator:
        catalog = self.context.catalog
        sources = []
        for name in self.params.sources:
            source_id = catalog.source_id(name)
            schema = catalog.register_schema(name, synthetic_schema(name))
            sources.append(SyntheticSource(name, source_id, schema.fingerprint))
        return SyntheticGenerator(self.params, sources, self.context.partition_id)

    def run(self, sink: WindowSink, start_after_scn: int | None, stop: threading.Event) -> None:
        params = self.params
        generator = self._generator()
        report = self.context.report_source_scn
        first = max(start_after_scn or 0, 0) + 1
        limit = params.limit or _INT64_MAX
        interval = params.events_per_window / params.rate if params.rate > 0 else 0.0
        t0 = time.monotonic()
        scn = first
        while not stop.is_set():
            if scn > limit:
                report(limit)
                # Everything there is was written: its own heartbeat (lag in seconds).
                while not stop.wait(_IDLE_BEAT_S):
                    self.context.report_read_through(time.time_ns(), 2 * _IDLE_BEAT_S + 1)
                return
            if interval:
                now = time.monotonic()
                due = t0 + (scn - first) * interval
                if due - now > _MIN_SLEEP_S:
                    if stop.wait(due - now):
                        return
                elif now - due > _MAX_BEHIND_S:
                    t0 = now - (scn - first) * interval
            timestamp = time.time_ns()
            sink.start_window(scn)
            for event in generator.window(scn, timestamp):
                sink.append(event)
            sink.end_window(timestamp)
            if interval:
                scheduled = first + int((time.monotonic() - t0) / interval)
                report(min(max(scn, scheduled), limit))
            else:
                report(scn)
            scn += 1

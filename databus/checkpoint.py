"""Checkpoints and the rules a server applies to them (docs/concepts.md, "Checkpoints").

A checkpoint is owned by the consumer and sent on every pull; servers keep no consumer
state, so the same checkpoint works on any relay replica and on the bootstrap service.

JSON shape (``to_json``/``from_json`` round-trip exactly)::

    {"mode": "online", "window_scn": 1234, "window_offset": -1}
    {"mode": "bootstrap_snapshot", "window_scn": -1, "window_offset": -1,
     "bootstrap_start_scn": 1000, "bootstrap_target_scn": 2000,
     "bootstrap_source_index": 0, "bootstrap_last_key": "...", "bootstrap_since_scn": 900}

``mode`` defaults to ``online`` and ``window_offset`` to -1 when absent; ``window_scn``
is required. Two ``window_scn`` values are special: ``FLEXIBLE_SCN`` (-1) means "from the
earliest window the server holds" (Databus' flexible checkpoint, for a consumer that has
no checkpoint and accepts a gap), ``LATEST_SCN`` (-2) means "only windows after the
server's current newest one". Unknown fields are rejected so that typos fail loudly.

``decide`` is the serving rule, pure so that the relay, the bootstrap catch-up and the
tests share one implementation.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

from databus._json import loads_bounded
from databus.errors import CheckpointError, ScnNotFoundError

FLEXIBLE_SCN = -1
LATEST_SCN = -2
WHOLE_WINDOW = -1
# SCNs are signed 64-bit (DESIGN section 2); so are the stores' columns, and SQLite and
# PostgreSQL refuse larger ints with an OverflowError or a DataError.
INT64_MAX = (1 << 63) - 1


class Mode(StrEnum):
    ONLINE = "online"
    BOOTSTRAP_SNAPSHOT = "bootstrap_snapshot"
    BOOTSTRAP_CATCHUP = "bootstrap_catchup"


_BOOTSTRAP_FIELDS = (
    "bootstrap_start_scn",
    "bootstrap_target_scn",
    "bootstrap_source_index",
    "bootstrap_last_key",
    "bootstrap_since_scn",
)
_FIELDS = ("mode", "window_scn", "window_offset", *_BOOTSTRAP_FIELDS)
# A checkpoint is a few hundred characters; the last key of a snapshot read is the only
# long field (hex of a key), and keys that long do not make sense as primary keys.
_MAX_TEXT_CHARS = 64 * 1024


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """Where a consumer is. Validated on construction: an impossible one never exists."""

    window_scn: int
    window_offset: int = WHOLE_WINDOW
    mode: Mode = Mode.ONLINE
    # Bootstrap (Algorithm 1): the snapshot's SCN, the SCN catch-up must reach, the
    # source being read, and the last key read from it (for resuming by key).
    bootstrap_start_scn: int | None = None
    bootstrap_target_scn: int | None = None
    bootstrap_source_index: int | None = None
    bootstrap_last_key: str | None = None
    # The consumer's SCN when the bootstrap began (a consolidated delta since it);
    # absent for a full snapshot. Kept so that every source's snapshot phase uses it.
    bootstrap_since_scn: int | None = None

    def __post_init__(self) -> None:
        # The common case first (a client commits one per window): an online
        # checkpoint of plain ints in range, with no bootstrap field.
        scn, offset = self.window_scn, self.window_offset
        if (self.mode is Mode.ONLINE and type(scn) is int and type(offset) is int
                and LATEST_SCN <= scn <= INT64_MAX and WHOLE_WINDOW <= offset <= INT64_MAX
                and (offset < 0 or scn >= 0) and self.bootstrap_start_scn is None
                and self.bootstrap_target_scn is None and self.bootstrap_source_index is None
                and self.bootstrap_last_key is None and self.bootstrap_since_scn is None):
            return
        for name in ("window_scn", "window_offset"):
            _require_int(name, getattr(self, name))
        if not isinstance(self.mode, Mode):
            try:
                object.__setattr__(self, "mode", Mode(self.mode))
            except ValueError:
                raise CheckpointError(
                    f"checkpoint mode must be one of {[m.value for m in Mode]}, "
                    f"got {str(self.mode)[:40]!r}"
                ) from None
        if self.window_scn < LATEST_SCN:
            raise CheckpointError(f"window_scn {self.window_scn} is negative")
        if self.window_offset < WHOLE_WINDOW:
            raise CheckpointError(f"window_offset {self.window_offset} is below -1")
        for name in ("window_scn", "window_offset"):
            _require_int64(name, getattr(self, name))
        if self.window_offset >= 0 and self.window_scn < 0:
            raise CheckpointError("a partial window (window_offset >= 0) needs a real window_scn")
        for name in ("bootstrap_start_scn", "bootstrap_target_scn", "bootstrap_source_index",
                     "bootstrap_since_scn"):
            value = getattr(self, name)
            if value is not None:
                _require_int(name, value)
                if value < 0:
                    raise CheckpointError(f"{name} {value} is negative")
                _require_int64(name, value)
        if self.bootstrap_last_key is not None and not isinstance(self.bootstrap_last_key, str):
            raise CheckpointError("bootstrap_last_key must be a string")
        if self.mode is Mode.ONLINE:
            if any(getattr(self, name) is not None for name in _BOOTSTRAP_FIELDS):
                raise CheckpointError("an online checkpoint cannot carry bootstrap fields")
        else:
            if self.bootstrap_start_scn is None or self.bootstrap_source_index is None:
                raise CheckpointError(
                    f"a {self.mode.value} checkpoint needs bootstrap_start_scn and "
                    "bootstrap_source_index"
                )
            target = self.bootstrap_target_scn
            if self.mode is Mode.BOOTSTRAP_CATCHUP and target is None:
                raise CheckpointError("a bootstrap_catchup checkpoint needs bootstrap_target_scn")
            if target is not None and target < self.bootstrap_start_scn:
                raise CheckpointError(
                    f"bootstrap_target_scn {target} is below bootstrap_start_scn "
                    f"{self.bootstrap_start_scn}"
                )

    # -- constructors ---------------------------------------------------------------

    @classmethod
    def flexible(cls) -> Checkpoint:
        """From the earliest window the server holds."""
        return cls(FLEXIBLE_SCN)

    @classmethod
    def latest(cls) -> Checkpoint:
        """Only windows after the server's newest one."""
        return cls(LATEST_SCN)

    @classmethod
    def after(cls, scn: int) -> Checkpoint:
        """Everything after window ``scn`` (window ``scn`` fully consumed)."""
        return cls(scn)

    def advanced(self, window_scn: int, window_offset: int = WHOLE_WINDOW) -> Checkpoint:
        """The online checkpoint after consuming up to (window_scn, window_offset)."""
        return Checkpoint(window_scn, window_offset)

    # -- JSON -----------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if v is not None}
        out["mode"] = self.mode.value
        return out

    def dumps(self) -> str:
        return json.dumps(self.to_json(), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, data: object) -> Checkpoint:
        if not isinstance(data, dict):
            raise CheckpointError(f"a checkpoint is a JSON object, got {type(data).__name__}")
        unknown = sorted(set(data) - set(_FIELDS))
        if unknown:
            raise CheckpointError(f"unknown checkpoint field(s): {', '.join(unknown)}")
        if "window_scn" not in data:
            raise CheckpointError("checkpoint is missing window_scn")
        return cls(**data)

    @classmethod
    def loads(cls, text: str | bytes) -> Checkpoint:
        """From JSON text that may come from anyone: size, nesting and number length
        are bounded (``databus._json``), so bad text is a ``CheckpointError``."""
        try:
            data = loads_bounded(text, max_chars=_MAX_TEXT_CHARS)
        except ValueError as exc:
            raise CheckpointError(f"checkpoint is not valid JSON: {exc}") from None
        return cls.from_json(data)


def _require_int(name: str, value: object) -> None:
    # bool is an int in Python but never a valid SCN.
    if not isinstance(value, int) or isinstance(value, bool):
        raise CheckpointError(f"{name} must be an integer, got {type(value).__name__}")


def _require_int64(name: str, value: int) -> None:
    if value > INT64_MAX:
        # Not the value itself: it may have thousands of digits.
        raise CheckpointError(f"{name} is beyond the signed 64-bit range (at most 2**63-1)")


# -- serving rules ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ServeFrom:
    """Serve from the first window with SCN > ``after_scn`` (long-poll if none yet).

    If ``skip_events`` > 0 and that window's SCN is ``partial_scn``, skip its first
    ``skip_events`` data events (a partial window resumed).
    """

    after_scn: int
    partial_scn: int | None = None
    skip_events: int = 0


@dataclass(frozen=True, slots=True)
class NothingNew:
    """Nothing to serve now: long-poll for windows with SCN > ``after_scn``."""

    after_scn: int


Decision = ServeFrom | NothingNew


def decide(
    checkpoint: Checkpoint, *, prev_scn: int, min_scn: int | None, max_scn: int | None
) -> Decision:
    """Apply the serving rules to a buffer holding windows min_scn..max_scn.

    ``prev_scn`` is the last SCN evicted (or the SCN the buffer started after); an empty
    buffer has ``min_scn = max_scn = None``. Raises ``ScnNotFoundError`` when the
    checkpoint is older than anything the buffer can serve.
    """
    if (min_scn is None) != (max_scn is None):
        raise ValueError("min_scn and max_scn are both set or both None")
    if min_scn is not None and max_scn is not None and not prev_scn < min_scn <= max_scn:
        raise ValueError(f"inconsistent buffer: prev={prev_scn} min={min_scn} max={max_scn}")
    newest = prev_scn if max_scn is None else max_scn
    since = checkpoint.window_scn

    if since == FLEXIBLE_SCN:
        return ServeFrom(prev_scn) if max_scn is not None else NothingNew(prev_scn)
    if since == LATEST_SCN:
        return NothingNew(newest)

    if checkpoint.window_offset >= 0:
        # Partial window W: W itself must still be held (or not yet arrived).
        if since <= prev_scn:
            raise _not_found(since, min_scn, prev_scn)
        # W newer than everything held (a replica behind the one the consumer came
        # from) gets the same answer: the read finds nothing yet and long-polls.
        return ServeFrom(since - 1, since, checkpoint.window_offset)

    if since < prev_scn:
        raise _not_found(since, min_scn, prev_scn)
    if since >= newest:
        return NothingNew(since)
    return ServeFrom(since)


def _not_found(since: int, min_scn: int | None, prev_scn: int) -> ScnNotFoundError:
    oldest = min_scn if min_scn is not None else prev_scn
    return ScnNotFoundError(
        f"SCN {since} is no longer held (oldest window after {prev_scn}); "
        "the consumer must bootstrap",
        min_scn=oldest,
    )

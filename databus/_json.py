"""JSON from untrusted text, with limits: the one parser for checkpoints, filter specs
and request bodies that come from clients (or from a server, for a client).

``json.loads`` alone lets a client crash a request: 1,500 ``[`` raise RecursionError,
a 5,000-digit number raises the interpreter's int digit limit error, and the size of
the text is whatever the transport let through. ``loads_bounded`` refuses all of these
with a ``JsonLimitError`` (a ``ValueError``) before or while decoding, so callers
catch one exception type and turn it into their own ``bad_request`` error.

Also refused, because they are never what a well-behaved client meant: duplicate keys
in an object (``json.loads`` silently keeps the last one) and the non-standard
constants ``NaN``, ``Infinity`` and ``-Infinity``.

The writing side, ``dumps``, never writes those constants either (``json.dumps`` does
by default, and jq or any strict parser rejects the line): a float that is not finite
is written as the string ``"NaN"``, ``"Infinity"`` or ``"-Infinity"``, as Jackson (and
so Kafka Connect's JSON converter and Debezium) quotes them. Every JSON the project
writes for others (HTTP answers, ``databus tail``, ``databus status --json``) goes
through it.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

__all__ = ["MAX_DEPTH", "MAX_INT_DIGITS", "MAX_TEXT_CHARS", "JsonLimitError", "dumps",
           "finite", "loads_bounded"]

# A checkpoint or filter spec nests 4 levels deep at most; 32 leaves room for bodies.
MAX_DEPTH = 32
# Query parameters are bounded by the request line (8 KiB in aiohttp) already; this is
# the bound for anything else (headers, bodies).
MAX_TEXT_CHARS = 256 * 1024
# An int64 has at most 19 digits; anything much longer is refused before int() sees it.
MAX_INT_DIGITS = 40

# Strings first (so brackets inside them do not count), then the brackets themselves.
# The alternatives inside a string are disjoint, so the match is linear.
_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.DOTALL)


class JsonLimitError(ValueError):
    """Text that is not JSON, or JSON beyond the limits."""


def _depth_ok(text: str, max_depth: int) -> bool:
    depth = 0
    for match in _TOKENS.finditer(text):
        token = match.group()
        if token in "[{":
            depth += 1
            if depth > max_depth:
                return False
        elif token in "]}":
            depth -= 1
    return True


def _parse_int(digits: str) -> int:
    if len(digits) > MAX_INT_DIGITS:
        raise JsonLimitError(f"a number of {len(digits)} digits (at most {MAX_INT_DIGITS})")
    return int(digits)


def _parse_constant(name: str) -> object:
    raise JsonLimitError(f"{name} is not JSON")


def _object(pairs: list[tuple[str, object]]) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in pairs:
        if key in out:
            raise JsonLimitError(f"duplicate key {key[:40]!r}")
        out[key] = value
    return out


def loads_bounded(
    text: str | bytes, *, max_chars: int = MAX_TEXT_CHARS, max_depth: int = MAX_DEPTH
) -> object:
    """``json.loads`` with a size, nesting and number-length limit; raises only
    ``JsonLimitError`` (with a short message that never repeats the whole text)."""
    if isinstance(text, bytes | bytearray):
        if len(text) > max_chars * 4:
            raise JsonLimitError(f"JSON text over {max_chars} characters")
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError:
            raise JsonLimitError("JSON text is not UTF-8") from None
    if len(text) > max_chars:
        raise JsonLimitError(f"JSON text of {len(text)} characters (at most {max_chars})")
    if not _depth_ok(text, max_depth):
        raise JsonLimitError(f"JSON nested deeper than {max_depth} levels")
    try:
        return json.loads(text, parse_int=_parse_int, parse_constant=_parse_constant,
                          object_pairs_hook=_object)
    except JsonLimitError:
        raise
    except (ValueError, RecursionError) as exc:
        # JSONDecodeError's message is short and names a position, not the text.
        # RecursionError cannot happen after the depth check; caught so it never
        # becomes a 500 if the limits change.
        raise JsonLimitError(str(exc)[:200]) from None


# -- writing ------------------------------------------------------------------------------


def finite(value: float) -> float | str:
    """``value``, or its name when it is not finite: ``"NaN"``, ``"Infinity"``,
    ``"-Infinity"`` (strings; JSON has no such numbers)."""
    if math.isfinite(value):
        return value
    if math.isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


def _finite_everywhere(value: Any) -> Any:
    if isinstance(value, float):
        return finite(value)
    if isinstance(value, dict):
        return {k: _finite_everywhere(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite_everywhere(v) for v in value]
    return value


def dumps(value: Any, **kwargs: Any) -> str:
    """``json.dumps`` that writes valid JSON only: floats that are not finite become
    their names as strings (``finite``). Costs nothing when there are none: the walk
    happens only after ``json.dumps`` refused them."""
    try:
        return json.dumps(value, allow_nan=False, **kwargs)
    except ValueError as exc:
        if "Out of range float" not in str(exc):
            raise
    return json.dumps(_finite_everywhere(value), allow_nan=False, **kwargs)

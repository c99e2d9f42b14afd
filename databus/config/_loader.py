"""The generic loader: TOML files into frozen, validated dataclasses (DESIGN 12).

Components declare their config as frozen dataclasses with type hints and validate in
``__post_init__``; ``from_mapping``/``load_toml`` map TOML tables and arrays of tables onto
them by those hints, so no component writes parsing code. Supported hints: ``int``,
``float`` (an int is accepted), ``str``, ``bool``, ``Secret``, ``pathlib.Path``, enums (by
value), ``Literal[...]``, ``X | None``, unions (the first option that fits),
``list[X]``, ``tuple[X, ...]``, ``tuple[X, Y]``, ``dict[str, X]``/``Mapping[str, X]`` and
nested dataclasses. Prefer tuples to lists: a frozen dataclass holding a list is not
really frozen.

Every error is a ``ConfigError`` naming the file and the dotted key path, for example
``relay.toml: relay.buffers[1].capacity_mb: expected int, got str``. Unknown keys are
errors (typos must fail loudly), and so are missing keys without a default.

String values may use ``${NAME}`` (the environment variable must be set) and
``${NAME:-default}`` (the default when NAME is unset or empty, as in the shell); ``$${``
is a literal ``${``. Interpolation happens in string values only, never in keys. A string
that used interpolation may fill an int, float or bool field (``port = "${PORT}"``).

Secrets never reach logs: ``Secret`` prints as ``***``, ``redact_uri`` hides the password
of a URI, ``BufferConfig``'s repr shows its source redacted, and error messages name keys
and types but do not quote values (the one exception: a wrong choice for a ``Literal`` or
enum field is quoted when it was written literally in the file, not taken from the
environment).
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import enum
import math
import os
import re
import tomllib
import types
import typing
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any, Literal, TypeVar, cast

from databus._redact import register_uri
from databus.config._checks import ConfigFieldError
from databus.config._secrets import _URI_RE, Secret
from databus.errors import ConfigError

T = TypeVar("T")

# --- the generic loader ----------------------------------------------------------------


def load_toml(
    path: str | os.PathLike[str], cls: type[T], *, env: Mapping[str, str] | None = None
) -> T:
    """Read the TOML file at ``path`` into the dataclass ``cls``."""
    origin = os.fspath(path)
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{origin}: cannot read: {exc.strerror or exc}") from None
    data = parse_toml(raw, origin)
    try:
        return from_mapping(cls, data, origin=origin, env=env)
    except RecursionError:
        raise ConfigError(f"{origin}: nested too deeply") from None


# A config file is a few KiB; anything this big is not one (and is not read whole).
MAX_FILE_BYTES = 4 << 20
# Tables and arrays inside each other: a real config nests 3 or 4 levels.
MAX_DEPTH = 32
# TOML integers are signed 64-bit (the spec); tomllib alone takes any length.
_INT64 = 1 << 63


def parse_toml(raw: bytes, origin: str) -> dict[str, Any]:
    """The TOML document in ``raw``, or a one-line ``ConfigError`` naming ``origin`` and
    what is wrong: not UTF-8 (with the line and column of the first bad byte), not TOML,
    nested deeper than ``MAX_DEPTH``, an integer outside 64 bits, over ``MAX_FILE_BYTES``."""
    if len(raw) > MAX_FILE_BYTES:
        raise ConfigError(f"{origin}: over {MAX_FILE_BYTES} bytes; not a config file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise ConfigError(f"{origin}: not UTF-8 text: byte 0x{raw[exc.start]:02x} at line "
                          f"{line}, column {column}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{origin}: invalid TOML: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{origin}: invalid TOML: nested deeper than {MAX_DEPTH} "
                          "levels") from None
    except ValueError as exc:  # an integer beyond the interpreter's digit limit
        reason = ("an integer of thousands of digits (TOML integers are signed 64-bit)"
                  if "digits" in str(exc) else _first_line(exc))
        raise ConfigError(f"{origin}: invalid TOML: {reason}") from None
    _check_shape(data, origin)
    return data


def _first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _check_shape(data: dict[str, Any], origin: str) -> None:
    """Depth and integer range of decoded TOML, walked without recursion."""
    stack: list[tuple[object, str, int]] = [(data, "", 0)]
    while stack:
        value, path, depth = stack.pop()
        if isinstance(value, dict):
            items: list[tuple[str, object]] = [(_join(path, k), v) for k, v in value.items()]
        elif isinstance(value, list):
            items = [(f"{path}[{i}]", v) for i, v in enumerate(value)]
        else:
            if isinstance(value, int) and not isinstance(value, bool) and not (
                    -_INT64 <= value < _INT64):
                raise ConfigError(f"{origin}: {path}: integer out of the signed 64-bit range")
            continue
        if depth >= MAX_DEPTH:
            raise ConfigError(f"{origin}: {path}: nested deeper than {MAX_DEPTH} levels")
        stack.extend((v, p, depth + 1) for p, v in items)


def from_mapping(
    cls: type[T],
    data: Mapping[str, object],
    *,
    origin: str = "<config>",
    env: Mapping[str, str] | None = None,
) -> T:
    """Build the dataclass ``cls`` from decoded TOML (or any nested dict/list data).

    ``origin`` names the file in error messages; ``env`` (default ``os.environ``) feeds
    ``${NAME}`` interpolation.
    """
    loader = _Loader(origin, os.environ if env is None else env)
    return cast(T, loader.dataclass(cls, data, ""))


_INTERPOLATION_RE = re.compile(r"\$\$\{|\$\{([^}]*)\}")
_REFERENCE_RE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(?::-(.*))?", re.DOTALL)
_NONE_TYPE = type(None)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _got(value: object) -> str:
    """The TOML name of a value's type, for "expected X, got Y"."""
    if isinstance(value, dict):
        return "table"
    if isinstance(value, list):
        return "array"
    return type(value).__name__


def _expected(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_expected(a) for a in typing.get_args(tp) if a is not _NONE_TYPE)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (list, tuple):
        return "array"
    if origin in (dict, Mapping) or dataclasses.is_dataclass(tp):
        return "table"
    if tp in (Secret, Path):
        return "str"
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return "one of " + ", ".join(repr(m.value) for m in tp)
    return getattr(tp, "__name__", str(tp))


def _quote(value: object, interpolated: bool) -> str:
    """A rejected choice, quoted unless it came from the environment (may be a secret)."""
    return _got(value) if interpolated else repr(value)


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


class _InterpolationError(ConfigError):
    """A bad or unresolvable ``${...}``: reported as is, never masked by a union's retry."""


class _Loader:
    def __init__(self, origin: str, env: Mapping[str, str]) -> None:
        self.origin = origin
        self.env = env

    def error(self, path: str, reason: str, cls: type[ConfigError] = ConfigError) -> ConfigError:
        return cls(f"{self.origin}: {path}: {reason}" if path else f"{self.origin}: {reason}")

    def wrong_type(
        self, tp: Any, value: object, path: str, interpolated: bool = False
    ) -> ConfigError:
        suffix = " (after ${...} interpolation)" if interpolated else ""
        return self.error(path, f"expected {_expected(tp)}, got {_got(value)}{suffix}")

    def interpolate(self, text: str, path: str) -> tuple[str, bool]:
        """``text`` with ``${...}`` expanded, and whether a variable was expanded."""
        if "${" not in text:
            return text, False
        if "${" in _INTERPOLATION_RE.sub("", text):
            raise self.error(
                path, "unterminated ${ (write $${ for a literal ${)", _InterpolationError
            )
        expanded_any = False

        def expand(match: re.Match[str]) -> str:
            nonlocal expanded_any
            if match.group(1) is None:
                return "${"
            reference = _REFERENCE_RE.fullmatch(match.group(1))
            if reference is None:
                # Not quoted: the string may be a secret that merely contains "${".
                raise self.error(
                    path,
                    "invalid ${...} reference (use ${NAME}, ${NAME:-default}, or $${)",
                    _InterpolationError,
                )
            name, default = reference.group(1), reference.group(2)
            value = self.env.get(name)
            expanded_any = True
            if default is not None:
                return value if value else default
            if value is None:
                raise self.error(
                    path,
                    f"environment variable {name} is not set "
                    f"(set it, or write ${{{name}:-default}})",
                    _InterpolationError,
                )
            return value

        return _INTERPOLATION_RE.sub(expand, text), expanded_any

    def convert(self, tp: Any, value: object, path: str) -> object:
        origin = typing.get_origin(tp)
        args = typing.get_args(tp)
        if tp is Any or tp is object:
            return self.plain(value, path)
        if origin in (typing.Union, types.UnionType):
            return self.union(tp, args, value, path)
        if origin is Literal:
            interpolated = False
            if isinstance(value, str):
                value, interpolated = self.interpolate(value, path)
            for allowed in args:
                if type(allowed) is type(value) and allowed == value:
                    return value
            raise self.error(path, f"expected {_expected(tp)}, got {_quote(value, interpolated)}")
        if dataclasses.is_dataclass(tp) and isinstance(tp, type):
            return self.dataclass(tp, value, path)
        if origin in (list, tuple):
            return self.sequence(tp, origin, args, value, path)
        if origin in (dict, Mapping):
            return self.table(tp, args, value, path)
        if isinstance(tp, type):
            return self.scalar(tp, value, path)
        raise TypeError(f"config loader: unsupported type hint {tp!r} at {path}")

    def plain(self, value: object, path: str) -> object:
        """An untyped value: interpolate strings, recurse into tables and arrays."""
        if isinstance(value, str):
            return self.interpolate(value, path)[0]
        if isinstance(value, list):
            return [self.plain(v, f"{path}[{i}]") for i, v in enumerate(value)]
        if isinstance(value, dict):
            return {k: self.plain(v, _join(path, k)) for k, v in value.items()}
        return value

    def union(self, tp: Any, args: tuple[Any, ...], value: object, path: str) -> object:
        options = [a for a in args if a is not _NONE_TYPE]
        if value is None and len(options) < len(args):
            return None
        if len(options) == 1:
            return self.convert(options[0], value, path)
        for option in options:
            try:
                return self.convert(option, value, path)
            except _InterpolationError:
                raise
            except ConfigError:
                pass
        raise self.wrong_type(tp, value, path)

    def scalar(self, tp: type, value: object, path: str) -> object:
        interpolated = False
        if isinstance(value, str):
            value, interpolated = self.interpolate(value, path)
        if tp is str:
            if isinstance(value, str):
                if _URI_RE.match(value):
                    register_uri(value)  # any URI of any component may hold a password
                return value
        elif tp is Secret:
            if isinstance(value, str):
                return Secret(value)
        elif tp is Path:
            if isinstance(value, str):
                if not value:
                    # Path("") is ".", which would silently mean the working directory.
                    raise self.error(path, "must not be empty")
                return Path(value)
        elif tp is bool:
            if isinstance(value, bool):
                return value
            if interpolated and isinstance(value, str) and value.lower() in ("true", "false"):
                return value.lower() == "true"
        elif tp is int:
            if isinstance(value, int) and not isinstance(value, bool):
                return value
            if interpolated and isinstance(value, str):
                try:
                    whole = int(value.strip())
                except ValueError:
                    pass
                else:
                    if -_INT64 <= whole < _INT64:
                        return whole
                    raise self.error(path, "integer out of the signed 64-bit range "
                                     "(after ${...} interpolation)")
        elif tp is float:
            number: float | None = None
            if isinstance(value, int | float) and not isinstance(value, bool):
                number = float(value)  # ints are 64-bit (parse_toml): no overflow
            elif interpolated and isinstance(value, str):
                with contextlib.suppress(ValueError):
                    number = float(value.strip())
            if number is not None:
                if not math.isfinite(number):
                    raise self.error(path, f"expected a finite number, got {number}")
                return number
        elif issubclass(tp, enum.Enum):
            for member in tp:
                if type(member.value) is type(value) and member.value == value:
                    return member
            raise self.error(path, f"expected {_expected(tp)}, got {_quote(value, interpolated)}")
        else:
            raise TypeError(f"config loader: unsupported type {tp.__name__} at {path}")
        raise self.wrong_type(tp, value, path, interpolated)

    def sequence(
        self, tp: Any, origin: type, args: tuple[Any, ...], value: object, path: str
    ) -> object:
        if not isinstance(value, list):
            raise self.wrong_type(tp, value, path)
        if origin is list or (len(args) == 2 and args[1] is Ellipsis):
            item_type = args[0] if args else Any
            items = [self.convert(item_type, v, f"{path}[{i}]") for i, v in enumerate(value)]
            return items if origin is list else tuple(items)
        if not args:
            return tuple(self.plain(v, f"{path}[{i}]") for i, v in enumerate(value))
        if len(value) != len(args):
            raise self.error(path, f"expected an array of {len(args)} items, got {len(value)}")
        return tuple(
            self.convert(a, v, f"{path}[{i}]")
            for i, (a, v) in enumerate(zip(args, value, strict=True))
        )

    def table(self, tp: Any, args: tuple[Any, ...], value: object, path: str) -> object:
        if not isinstance(value, dict):
            raise self.wrong_type(tp, value, path)
        value_type = args[1] if len(args) == 2 else Any
        out = {k: self.convert(value_type, v, _join(path, k)) for k, v in value.items()}
        return out if typing.get_origin(tp) is dict else types.MappingProxyType(out)

    def dataclass(self, cls: type, value: object, path: str) -> object:
        if not isinstance(value, dict):
            raise self.wrong_type(cls, value, path)
        fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
        for key in value:
            if key not in fields:
                close = difflib.get_close_matches(key, list(fields), n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                raise self.error(
                    _join(path, key),
                    f"unknown key ({hint}expected one of: {', '.join(fields)})",
                )
        hints = _hints(cls)
        kwargs: dict[str, object] = {}
        for name, field in fields.items():
            if name in value:
                kwargs[name] = self.convert(hints[name], value[name], _join(path, name))
            elif (
                field.default is dataclasses.MISSING
                and field.default_factory is dataclasses.MISSING
            ):
                raise self.error(_join(path, name), "missing required key")
        try:
            return cls(**kwargs)
        except ConfigFieldError as exc:
            raise self.error(_join(path, exc.field), exc.reason) from None
        except ConfigError as exc:
            raise self.error(path, exc.message) from None
        except (ValueError, TypeError) as exc:
            raise self.error(path, str(exc)) from None


"""``relay+http://`` URIs: the upstream relays and what to ask them for (pure).

::

    relay+http://HOST:PORT[,HOST:PORT...]/?sources=db.t1,db.t2[&filter=JSON][&follow=true]
              [&heartbeat_ms=1000][&wait_ms=5000][&max_bytes=4194304][&backoff_max_s=5]

Several upstreams are a comma-separated list of ``host:port`` in the authority (as
libpq and MongoDB write several hosts): the first is preferred, the others are failed
over to in order, round-robin. A host without a port gets the relay's default port
(11190); an IPv6 address is written in brackets (``[::1]:11190``). Every parameter other
than ``sources`` is optional; unknown parameters are a ``ConfigError`` (a typo must not
pass silently). docs/relay-chaining.md is the user's page.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qsl, urlsplit

from databus.errors import ConfigError, FilterError
from databus.filters import FilterSpec

__all__ = ["DEFAULT_PORT", "SCHEME", "ChainURI"]

SCHEME = "relay+http"
DEFAULT_PORT = 11190
_PARAMS = frozenset({"sources", "filter", "follow", "heartbeat_ms", "wait_ms", "max_bytes",
                     "backoff_max_s"})
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


@dataclass(frozen=True, slots=True)
class ChainURI:
    """A parsed ``relay+http://`` URI."""

    upstreams: tuple[str, ...]  # base URLs, ``http://host:port``, in order of preference
    sources: tuple[str, ...]  # logical source names, as given (order kept, no duplicates)
    filter_json: str | None = None  # canonical filter JSON (DESIGN 4), passed upstream
    follow: bool = True  # streaming subscriptions when the upstream offers them
    heartbeat_ms: int = 1000  # asked of a streaming upstream; 5 missed = gone
    wait_ms: int = 5000  # a long poll's wait (an upstream that does not stream)
    max_bytes: int = 4 << 20  # per response (the upstream caps it too)
    backoff_max_s: float = 5.0  # the longest pause between rounds of failed upstreams

    @classmethod
    def parse(cls, uri: str) -> ChainURI:
        try:
            parts = urlsplit(uri)
        except ValueError as exc:
            raise ConfigError(f"relay+http source URI: {exc}") from None
        if parts.scheme != SCHEME:
            raise ConfigError(f"expected a {SCHEME}:// URI, got {parts.scheme or 'no'} scheme")
        if parts.path not in ("", "/"):
            raise ConfigError(f"{SCHEME}:// URI: no path expected after the hosts, got "
                              f"{parts.path!r}")
        if parts.fragment:
            raise ConfigError(f"{SCHEME}:// URI: no #fragment expected")
        upstreams = _hosts(parts.netloc)
        raw: dict[str, str] = {}
        for name, value in parse_qsl(parts.query, keep_blank_values=True,
                                     strict_parsing=False):
            if name not in _PARAMS:
                raise ConfigError(f"{SCHEME}:// URI: unknown parameter {name!r} (known: "
                                  f"{', '.join(sorted(_PARAMS))})")
            if name in raw:
                raise ConfigError(f"{SCHEME}:// URI: parameter {name!r} given twice")
            raw[name] = value
        sources = _sources(raw.get("sources", ""))
        filter_json = _filter(raw.get("filter"), sources)
        return cls(
            upstreams=upstreams,
            sources=sources,
            filter_json=filter_json,
            follow=_bool(raw.get("follow"), "follow", True),
            heartbeat_ms=_int(raw.get("heartbeat_ms"), "heartbeat_ms", 1000, 50, 60_000),
            wait_ms=_int(raw.get("wait_ms"), "wait_ms", 5000, 0, 600_000),
            max_bytes=_int(raw.get("max_bytes"), "max_bytes", 4 << 20, 1024, 1 << 30),
            backoff_max_s=_float(raw.get("backoff_max_s"), "backoff_max_s", 5.0, 0.01, 300.0),
        )


def _hosts(netloc: str) -> tuple[str, ...]:
    if not netloc:
        raise ConfigError(f"{SCHEME}:// URI names no upstream relay (host:port)")
    if "@" in netloc:
        raise ConfigError(f"{SCHEME}:// URI: user info is not supported (relays serve "
                          "streams without credentials)")
    out: list[str] = []
    for item in netloc.split(","):
        item = item.strip()
        if not item:
            raise ConfigError(f"{SCHEME}:// URI: an empty host in {netloc!r}")
        if item.startswith("["):
            host, bracket, rest = item[1:].partition("]")
            if not bracket or not host:
                raise ConfigError(f"{SCHEME}:// URI: bad IPv6 host {item!r}")
            host = f"[{host}]"
            if rest and not rest.startswith(":"):
                raise ConfigError(f"{SCHEME}:// URI: bad host {item!r}")
            port_text = rest[1:] if rest else ""
        else:
            host, _, port_text = item.partition(":")
            if not host or any(c in host for c in "/?#[] "):
                raise ConfigError(f"{SCHEME}:// URI: bad host {item!r}")
        port = DEFAULT_PORT
        if port_text:
            if not port_text.isdigit() or not 0 < int(port_text) < 65536:
                raise ConfigError(f"{SCHEME}:// URI: bad port in {item!r}")
            port = int(port_text)
        url = f"http://{host.lower()}:{port}"
        if url in out:
            raise ConfigError(f"{SCHEME}:// URI: upstream {item!r} is listed twice")
        out.append(url)
    return tuple(out)


def _sources(text: str) -> tuple[str, ...]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise ConfigError(f"{SCHEME}:// URI needs sources=db.table[,db.table...]: the "
                          "upstream's logical sources this buffer holds")
    seen: list[str] = []
    for name in names:
        database, dot, table = name.rpartition(".")
        if not dot or not database or not table:
            raise ConfigError(f"{SCHEME}:// URI: source {name!r} is not database.table")
        if name in seen:
            raise ConfigError(f"{SCHEME}:// URI: source {name!r} is listed twice")
        seen.append(name)
    return tuple(seen)


def _filter(text: str | None, sources: tuple[str, ...]) -> str | None:
    if text is None or not text.strip():
        return None
    try:
        spec = FilterSpec.parse(text)
    except FilterError as exc:
        raise ConfigError(f"{SCHEME}:// URI: bad filter: {exc}") from None
    if spec.is_empty:
        return None
    unknown = sorted(set(spec.to_json()) - set(sources))
    if unknown:
        raise ConfigError(f"{SCHEME}:// URI: the filter names source(s) "
                          f"{', '.join(unknown)} that sources= does not")
    return spec.to_json_text()


def _bool(text: str | None, name: str, default: bool) -> bool:
    if text is None:
        return default
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigError(f"{SCHEME}:// URI: {name} must be true or false, got {text!r}")


def _int(text: str | None, name: str, default: int, lo: int, hi: int) -> int:
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"{SCHEME}:// URI: {name} must be an integer, got {text!r}") from None
    if not lo <= value <= hi:
        raise ConfigError(f"{SCHEME}:// URI: {name} must be in [{lo}, {hi}], got {value}")
    return value


def _float(text: str | None, name: str, default: float, lo: float, hi: float) -> float:
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{SCHEME}:// URI: {name} must be a number, got {text!r}") from None
    if not lo <= value <= hi:
        raise ConfigError(f"{SCHEME}:// URI: {name} must be in [{lo}, {hi}], got {value}")
    return value

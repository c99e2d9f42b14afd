"""``relay+http://`` and ``relay+https://`` URIs: the upstream relays and what to ask
them for (pure).

::

    relay+http://HOST:PORT[,HOST:PORT...]/?sources=db.t1,db.t2[&filter=JSON][&follow=true]
              [&heartbeat_ms=1000][&wait_ms=5000][&max_bytes=4194304][&backoff_max_s=5]
    relay+https://HOST:PORT[,...]/?sources=...[&ca_file=PEM][&cert_file=PEM&key_file=PEM]
              [&token=${TOKEN}]

``relay+https://`` reads the upstreams over TLS (DESIGN 18), verifying their
certificates against ``ca_file`` (default: the system's CAs), presenting
``cert_file``/``key_file`` under mutual TLS; ``token`` is this relay's reader token at
the upstreams (``token`` also goes with ``relay+http://``, to a loopback upstream with
readers). These four are what this relay presents (``ChainURI.credentials``), never
parameters of the upstream requests; the token is registered as a secret by the
config (``BufferConfig``) and ``redact_uri`` hides ``token=``. The TLS files with
``relay+http://`` are a ``ConfigError`` (a forgotten ``s``).

Several upstreams are a comma-separated list of ``host:port`` in the authority (as
libpq and MongoDB write several hosts): the first is preferred, the others are failed
over to in order, round-robin. A host without a port gets the relay's default port
(11190); an IPv6 address is written in brackets (``[::1]:11190``). Every parameter other
than ``sources`` is optional; unknown parameters are a ``ConfigError`` (a typo must not
pass silently). docs/relay-chaining.md is the user's page.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlencode, urlsplit

from databus.errors import ConfigError, FilterError
from databus.filters import FilterSpec
from databus.security import NO_CREDENTIALS, URI_PARAMS, ClientCredentials

__all__ = ["DEFAULT_PORT", "SCHEME", "SCHEMES", "SECURE_SCHEME", "ChainURI", "chain_uri"]

SCHEME = "relay+http"
SECURE_SCHEME = "relay+https"
SCHEMES = (SCHEME, SECURE_SCHEME)
DEFAULT_PORT = 11190
_PARAMS = frozenset({"sources", "filter", "follow", "heartbeat_ms", "wait_ms", "max_bytes",
                     "backoff_max_s", *URI_PARAMS})
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


@dataclass(frozen=True, slots=True)
class ChainURI:
    """A parsed ``relay+http://`` or ``relay+https://`` URI."""

    upstreams: tuple[str, ...]  # base URLs, ``http(s)://host:port``, in order of preference
    sources: tuple[str, ...]  # logical source names, as given (order kept, no duplicates)
    filter_json: str | None = None  # canonical filter JSON (DESIGN 4), passed upstream
    follow: bool = True  # streaming subscriptions when the upstream offers them
    heartbeat_ms: int = 1000  # asked of a streaming upstream; 5 missed = gone
    wait_ms: int = 5000  # a long poll's wait (an upstream that does not stream)
    max_bytes: int = 4 << 20  # per response (the upstream caps it too)
    backoff_max_s: float = 5.0  # the longest pause between rounds of failed upstreams
    # What this relay presents to the upstreams (TLS files, reader token).
    credentials: ClientCredentials = NO_CREDENTIALS

    @classmethod
    def parse(cls, uri: str) -> ChainURI:
        try:
            parts = urlsplit(uri)
        except ValueError as exc:
            raise ConfigError(f"relay+http source URI: {exc}") from None
        if parts.scheme not in SCHEMES:
            raise ConfigError(f"expected a {SCHEME}:// or {SECURE_SCHEME}:// URI, got "
                              f"{parts.scheme or 'no'} scheme")
        scheme = parts.scheme  # the messages name the scheme given
        if parts.path not in ("", "/"):
            raise ConfigError(f"{scheme}:// URI: no path expected after the hosts, got "
                              f"{parts.path!r}")
        if parts.fragment:
            raise ConfigError(f"{scheme}:// URI: no #fragment expected")
        upstreams = _hosts(parts.netloc, scheme)
        raw: dict[str, str] = {}
        for name, value in parse_qsl(parts.query, keep_blank_values=True,
                                     strict_parsing=False):
            if name not in _PARAMS:
                raise ConfigError(f"{scheme}:// URI: unknown parameter {name!r} (known: "
                                  f"{', '.join(sorted(_PARAMS))})")
            if name in raw:
                raise ConfigError(f"{scheme}:// URI: parameter {name!r} given twice")
            raw[name] = value
        sources = _sources(raw.get("sources", ""), scheme)
        filter_json = _filter(raw.get("filter"), sources, scheme)
        credentials = _credentials(raw, scheme)
        return cls(
            upstreams=upstreams,
            sources=sources,
            filter_json=filter_json,
            follow=_bool(raw.get("follow"), "follow", True, scheme),
            heartbeat_ms=_int(raw.get("heartbeat_ms"), "heartbeat_ms", 1000, 50, 60_000, scheme),
            wait_ms=_int(raw.get("wait_ms"), "wait_ms", 5000, 0, 600_000, scheme),
            max_bytes=_int(raw.get("max_bytes"), "max_bytes", 4 << 20, 1024, 1 << 30, scheme),
            backoff_max_s=_float(raw.get("backoff_max_s"), "backoff_max_s", 5.0, 0.01, 300.0,
                                 scheme),
            credentials=credentials,
        )

    @property
    def secure(self) -> bool:
        """Whether the upstreams are read over TLS (``relay+https://``)."""
        return self.upstreams[0].startswith("https://")


def _credentials(raw: dict[str, str], scheme: str) -> ClientCredentials:
    """What this relay presents upstream, from the URI's credential parameters."""
    for name in URI_PARAMS:
        if name in raw and not raw[name]:
            raise ConfigError(f"{scheme}:// URI: {name} is empty (omit it, or give a value; "
                              "an unset ${VAR} in the config?)")
    files = [n for n in ("ca_file", "cert_file", "key_file") if n in raw]
    if files and scheme == SCHEME:
        raise ConfigError(f"{scheme}:// URI: {', '.join(files)} given for a plain HTTP "
                          f"upstream: write {SECURE_SCHEME}:// to read it over TLS")
    if "key_file" in raw and "cert_file" not in raw:
        raise ConfigError(f"{scheme}:// URI: key_file needs cert_file")
    return ClientCredentials.from_query(raw)


def _hosts(netloc: str, scheme: str = SCHEME) -> tuple[str, ...]:
    if not netloc:
        raise ConfigError(f"{scheme}:// URI names no upstream relay (host:port)")
    if "@" in netloc:
        raise ConfigError(f"{scheme}:// URI: user info is not supported (relays serve "
                          "streams without credentials)")
    out: list[str] = []
    for item in netloc.split(","):
        item = item.strip()
        if not item:
            raise ConfigError(f"{scheme}:// URI: an empty host in {netloc!r}")
        if item.startswith("["):
            host, bracket, rest = item[1:].partition("]")
            if not bracket or not host:
                raise ConfigError(f"{scheme}:// URI: bad IPv6 host {item!r}")
            host = f"[{host}]"
            if rest and not rest.startswith(":"):
                raise ConfigError(f"{scheme}:// URI: bad host {item!r}")
            port_text = rest[1:] if rest else ""
        else:
            host, _, port_text = item.partition(":")
            if not host or any(c in host for c in "/?#[] "):
                raise ConfigError(f"{scheme}:// URI: bad host {item!r}")
        port = DEFAULT_PORT
        if port_text:
            if not port_text.isdigit() or not 0 < int(port_text) < 65536:
                raise ConfigError(f"{scheme}:// URI: bad port in {item!r}")
            port = int(port_text)
        web = "https" if scheme == SECURE_SCHEME else "http"
        url = f"{web}://{host.lower()}:{port}"
        if url in out:
            raise ConfigError(f"{scheme}:// URI: upstream {item!r} is listed twice")
        out.append(url)
    return tuple(out)


def _sources(text: str, scheme: str = SCHEME) -> tuple[str, ...]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise ConfigError(f"{scheme}:// URI needs sources=db.table[,db.table...]: the "
                          "upstream's logical sources this buffer holds")
    seen: list[str] = []
    for name in names:
        database, dot, table = name.rpartition(".")
        if not dot or not database or not table:
            raise ConfigError(f"{scheme}:// URI: source {name!r} is not database.table")
        if name in seen:
            raise ConfigError(f"{scheme}:// URI: source {name!r} is listed twice")
        seen.append(name)
    return tuple(seen)


def _filter(text: str | None, sources: tuple[str, ...],
            scheme: str = SCHEME) -> str | None:
    if text is None or not text.strip():
        return None
    try:
        spec = FilterSpec.parse(text)
    except FilterError as exc:
        raise ConfigError(f"{scheme}:// URI: bad filter: {exc}") from None
    if spec.is_empty:
        return None
    unknown = sorted(set(spec.to_json()) - set(sources))
    if unknown:
        raise ConfigError(f"{scheme}:// URI: the filter names source(s) "
                          f"{', '.join(unknown)} that sources= does not")
    return spec.to_json_text()


def _bool(text: str | None, name: str, default: bool, scheme: str = SCHEME) -> bool:
    if text is None:
        return default
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigError(f"{scheme}:// URI: {name} must be true or false, got {text!r}")


def _int(text: str | None, name: str, default: int, lo: int, hi: int,
         scheme: str = SCHEME) -> int:
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"{scheme}:// URI: {name} must be an integer, got {text!r}") from None
    if not lo <= value <= hi:
        raise ConfigError(f"{scheme}:// URI: {name} must be in [{lo}, {hi}], got {value}")
    return value


def _float(text: str | None, name: str, default: float, lo: float, hi: float,
           scheme: str = SCHEME) -> float:
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{scheme}:// URI: {name} must be a number, got {text!r}") from None
    if not lo <= value <= hi:
        raise ConfigError(f"{scheme}:// URI: {name} must be in [{lo}, {hi}], got {value}")
    return value


def chain_uri(upstream: str, sources: Iterable[str],
              credentials: ClientCredentials = NO_CREDENTIALS) -> str:
    """The ``relay+http(s)://`` URI that reads ``sources`` from ``upstream``
    (``http(s)://host:port``) presenting ``credentials`` (a cluster follower's URI of
    its leader, say). The token in it is already a registered secret (``Secret``)."""
    base = upstream.rstrip("/")
    query = [("sources", ",".join(sources))]
    for name in ("ca_file", "cert_file", "key_file"):
        value = getattr(credentials, name)
        if value is not None:
            query.append((name, str(value)))
    if credentials.token is not None:
        query.append(("token", credentials.token.reveal()))
    return f"relay+{base}/?{urlencode(query, safe=',/')}"

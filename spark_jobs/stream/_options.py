"""The options of the ``databus`` source, checked at once (pure: no I/O, no PySpark).

``spark.readStream.format("databus").option(...)``: every option name and value is
checked when the query is planned, and a wrong one fails it with a message naming the
option; values are never echoed for the credential options (``token``, ``keyFile``).

| option | meaning |
|---|---|
| `relays` | relay URLs, comma-separated (or `zookeeper` + `cluster`) |
| `zookeeper`, `cluster` | relay discovery: the connect string and the relay cluster |
| `bootstrap` | bootstrap service URLs, comma-separated (catch-up and the batch read) |
| `sources` | logical sources, comma-separated (one: typed columns; several: `value` JSON) |
| `partitions` | input partitions P (default 1): partition i reads mod bucket i of P |
| `starting` | `earliest` (default: the bootstrap snapshot, else the oldest window) or `latest` |
| `startingScn` | start after this window SCN instead |
| `caFile`, `certFile`, `keyFile`, `token` | TLS and the reader token |
| `scn` | batch reads only: the snapshot must be at least this new |
| `relayTimeout` | seconds (default 120) without a valid relay answer or progress: then it fails |
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from databus.checkpoint import INT64_MAX
from databus.errors import ConfigError

MAX_PARTITIONS = 1024


class OptionError(ConfigError, ValueError):
    """A bad option of the databus source (the message names it)."""

    code = "bad_option"


@dataclass(frozen=True, slots=True)
class SourceOptions:
    relays: tuple[str, ...]
    zookeeper: str | None
    cluster: str | None
    bootstrap: tuple[str, ...]
    sources: tuple[str, ...]
    partitions: int
    starting: str
    starting_scn: int | None
    ca_file: str | None
    cert_file: str | None
    key_file: str | None
    token: str | None
    scn: int | None
    relay_timeout: float = 120.0

    def client_kwargs(self) -> dict[str, Any]:
        """What every ``DatabusClient`` of the query is given (relays, credentials)."""
        where: dict[str, Any] = ({"zookeeper": self.zookeeper, "cluster": self.cluster}
                                 if self.zookeeper else {"relays": list(self.relays)})
        return {**where, "sources": list(self.sources), "ca_file": self.ca_file,
                "cert_file": self.cert_file, "key_file": self.key_file, "token": self.token}

    def __repr__(self) -> str:  # the token never shows
        return (f"SourceOptions(relays={self.relays}, sources={self.sources}, "
                f"partitions={self.partitions})")


_KNOWN = {"relays", "zookeeper", "cluster", "bootstrap", "sources", "partitions",
          "starting", "startingscn", "cafile", "certfile", "keyfile", "token", "scn",
          "relaytimeout"}
# Spark passes some options of its own to every source (``path`` for load(path)).
_SPARK_OWN = {"path"}


def _urls(text: str, option: str) -> tuple[str, ...]:
    urls = tuple(u.strip().rstrip("/") for u in text.split(",") if u.strip())
    for url in urls:
        if not url.lower().startswith(("http://", "https://")):
            raise OptionError(f"option {option}: {url[:60]!r} is not an http:// or "
                              "https:// URL")
    return urls


def _int(options: Mapping[str, str], name: str, lo: int, hi: int) -> int | None:
    text = options.get(name.lower())
    if text is None:
        return None
    try:
        value = int(text.strip())
    except ValueError:
        raise OptionError(f"option {name} must be an integer, got {text[:40]!r}") from None
    if not lo <= value <= hi:
        raise OptionError(f"option {name} must be between {lo} and {hi}, got {value}")
    return value


def parse(raw: Mapping[str, str], *, streaming: bool | None = True) -> SourceOptions:
    """Check the options Spark passes (names case-insensitive, as Spark treats them)."""
    options = {k.lower(): v for k, v in raw.items()}
    unknown = sorted(set(options) - _KNOWN - _SPARK_OWN)
    if unknown:
        raise OptionError(f"unknown option(s) of the databus source: {', '.join(unknown)} "
                          f"(known: relays, zookeeper, cluster, bootstrap, sources, "
                          "partitions, starting, startingScn, caFile, certFile, keyFile, "
                          "token, scn, relayTimeout)")
    relays = _urls(options.get("relays", ""), "relays")
    zookeeper = options.get("zookeeper") or None
    cluster = options.get("cluster") or None
    bootstrap = _urls(options.get("bootstrap", ""), "bootstrap")
    if relays and (zookeeper or cluster):
        raise OptionError("give either relays or zookeeper and cluster, not both")
    if not relays and not (zookeeper and cluster):
        raise OptionError("the databus source needs relays=URL[,URL...] (or "
                          "zookeeper and cluster, to find them)")
    if streaming is False and not bootstrap:
        raise OptionError("a batch read of the databus source needs bootstrap=URL[,URL...]")
    sources = tuple(s.strip() for s in options.get("sources", "").split(",") if s.strip())
    if not sources:
        raise OptionError("option sources is required: the logical sources to read, "
                          "comma-separated (e.g. shop.orders)")
    for name in sources:
        if "*" in name or name.count(".") != 1:
            raise OptionError(f"option sources: {name[:60]!r} is not a source name "
                              "(database.table; patterns are not accepted)")
    if len(set(sources)) != len(sources):
        raise OptionError("option sources names a source twice")
    partitions = _int(options, "partitions", 1, MAX_PARTITIONS) or 1
    starting = options.get("starting", "earliest").strip().lower()
    if starting not in ("earliest", "latest"):
        raise OptionError(f"option starting is 'earliest' or 'latest', got {starting[:20]!r}")
    starting_scn = _int(options, "startingScn", 0, INT64_MAX)
    if starting_scn is not None and "starting" in options:
        raise OptionError("give starting or startingScn, not both")
    scn = _int(options, "scn", 0, INT64_MAX)
    if scn is not None and streaming is True:
        raise OptionError("option scn is for batch reads (spark.read) only")
    files = {}
    for name in ("caFile", "certFile", "keyFile"):
        value = options.get(name.lower())
        files[name] = value.strip() if value and value.strip() else None
    token = options.get("token") or None
    relay_timeout = _int(options, "relayTimeout", 1, 24 * 3600) or 120
    return SourceOptions(relays, zookeeper, cluster, bootstrap, sources, partitions,
                         starting, starting_scn, files["caFile"], files["certFile"],
                         files["keyFile"], token, scn, float(relay_timeout))

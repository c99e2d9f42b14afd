"""The initial copy through a relay dump (``initial_copy = "dump"``, DESIGN 8.1 and 16).

On a first start (the target holds no position for this replication) the replicator
asks a relay for the newest SCN of the buffer holding its tables, then for a dump of
those tables, and starts reading after that SCN. The order matters: every chunk of the
dump is written inside a window later than the dump's request (DBLog's high
watermark), so a reader starting from the SCN read *before* the request sees every
chunk, interleaved with the changes in commit order, and the folded result is the
tables' state. Starting after the request could miss its first chunks.

A crash before the first batch reached the target leaves no position: the next start
asks for another dump (the first one goes on in the relay until it ends; ``databus dump
cancel`` stops it). After that the target's own position rules, and the relay's dump
resumes after its last chunk across relay restarts, so nothing is asked twice.

Every request presents the replicator's credentials (DESIGN 18): the TLS context of
``https://`` relays, the reader token on reads (``/v1/sources``, ``/v1/status``) and
the relay's admin token on the dump request; a refusal is ``UnauthorizedError`` or
``ForbiddenError``, which stops the replicator with the fix.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from databus.checkpoint import Checkpoint
from databus.config import ReplicateConfig
from databus.errors import (
    ConnectionLostError,
    DatabusError,
    ForbiddenError,
    UnauthorizedError,
)
from databus.relay.dumps import RelayAdmin, RelayAnswerError

log = logging.getLogger(__name__)

__all__ = ["DumpStarted", "request_dump"]


@dataclass(frozen=True)
class DumpStarted:
    relay: str
    dump_id: str
    start: Checkpoint | None  # None: the buffer was empty, read it from its start


def request_dump(config: ReplicateConfig, relays: tuple[str, ...]) -> DumpStarted:
    """Ask the first of ``relays`` that answers for a dump of ``config``'s tables."""
    if config.relay_admin_token is None:  # the config refuses it; for the type checker
        raise DatabusError("initial_copy = \"dump\" needs relay_admin_token")
    token = config.relay_admin_token.reveal()
    sources = [t.source for t in config.tables]
    last: DatabusError | None = None
    for url in relays:
        # Reads carry the reader token, the dump request the admin token.
        admin = RelayAdmin(url, token, credentials=config.credentials)
        try:
            return _request(admin, url, sources)
        except RelayAnswerError as exc:
            raise _refusal(exc) from None
        except ConnectionLostError as exc:  # another relay may answer
            last = exc
    raise DatabusError(f"no relay took the dump request: {last}", retriable=True)


def _request(admin: RelayAdmin, url: str, sources: list[str]) -> DumpStarted:
    listed = {s["name"]: s for s in admin.request("GET", "/v1/sources")["sources"]}
    missing = [s for s in sources if s not in listed]
    if missing:
        raise DatabusError(f"the relay at {url} has no source {', '.join(missing)}")
    buffers = {listed[s]["buffer"] for s in sources}
    if len(buffers) != 1:
        raise DatabusError(f"the replicated tables live in several buffers of the relay at "
                           f"{url} ({', '.join(sorted(buffers))}): run one replication "
                           "per buffer")
    status = admin.request("GET", "/v1/status")
    max_scn = status["buffers"][buffers.pop()]["max_scn"]
    dump = admin.start({"sources": sources})
    start = None if max_scn is None else Checkpoint(int(max_scn))
    log.info("initial copy: dump %s of %s started on %s; reading after SCN %s "
             "(progress: databus dump status --relay %s %s)", dump["id"], ", ".join(sources),
             url, max_scn, url, dump["id"])
    return DumpStarted(url, str(dump["id"]), start)


def _refusal(exc: RelayAnswerError) -> DatabusError:
    """A relay's refusal of the replicator's credentials as its own class (401, 403:
    the replicator stops with the fix); any other answer as it is."""
    if exc.status == 401:
        return UnauthorizedError(str(exc))
    if exc.status == 403:
        return ForbiddenError(str(exc))
    return exc

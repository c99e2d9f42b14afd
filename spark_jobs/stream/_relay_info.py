"""What the driver asks the relays (I/O): the newest window SCN, and a source's Avro
schema. Through the client library's relay puller, so the same failover, TLS, token and
answer checks apply; bounded in time, so that relays that answer nothing valid fail the
query with the last reason instead of blocking it.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import quote

from databus.checkpoint import Checkpoint
from databus.client._relay_puller import RelayPuller
from databus.errors import DatabusError
from databus.security import ClientCredentials, client_session
from databus.spark_jobs.stream._options import SourceOptions

TIMEOUT_S = 30.0


class RelayUnavailable(DatabusError):
    """No relay gave a valid answer in time."""


def relay_urls(opts: SourceOptions) -> list[str]:
    """The relays: the list given, or the relay cluster's members on ZooKeeper."""
    if not opts.zookeeper or not opts.cluster:
        return list(opts.relays)
    from databus.client._discovery import RelayDiscovery

    discovery = RelayDiscovery(opts.zookeeper, opts.cluster, timeout=10.0)
    try:
        urls = discovery.start()
    finally:
        discovery.close()
    if not urls:
        raise RelayUnavailable(f"relay cluster {opts.cluster!r} has no members on ZooKeeper")
    return list(urls)


def _credentials(opts: SourceOptions) -> ClientCredentials:
    return ClientCredentials.of(ca_file=opts.ca_file, cert_file=opts.cert_file,
                                key_file=opts.key_file, token=opts.token)


async def _ask(opts: SourceOptions, what: str, timeout: float, job: Any) -> Any:
    urls = relay_urls(opts)
    async with client_session(_credentials(opts), limit=2) as session:
        puller = RelayPuller(urls, list(opts.sources), session, streaming=False,
                             backoff_initial=0.1, backoff_max=1.0,
                             request_timeout=min(10.0, timeout))
        try:
            async with asyncio.timeout(timeout):
                return await job(puller)
        except TimeoutError:
            why = puller.last_error
            raise RelayUnavailable(
                f"no relay of {', '.join(urls)} gave a valid answer ({what}) within "
                f"{timeout:.0f} s; last failure: {why if why is not None else 'none'}"
            ) from None


def newest_scn(opts: SourceOptions, timeout: float = TIMEOUT_S) -> int | None:
    """The SCN of the relay buffer's newest window (its start point when it holds none);
    None when the relay does not say."""
    async def job(puller: RelayPuller) -> int | None:
        batch = await puller.fetch(Checkpoint.latest(), max_bytes=1, wait_ms=0)
        return batch.max_scn

    result: int | None = asyncio.run(_ask(opts, "the newest window", timeout, job))
    return result


def schema_versions(opts: SourceOptions, source: str, timeout: float = TIMEOUT_S
                    ) -> list[dict[str, Any]]:
    """Every Avro schema version of ``source`` the relay has, oldest first (``GET
    /v1/schemas?source=``); at least one."""
    async def job(puller: RelayPuller) -> list[dict[str, Any]]:
        async def attempt(relay: str) -> list[dict[str, Any]]:
            doc = await puller._get_json(f"{relay}/v1/schemas?source={quote(source, safe='')}")
            if not isinstance(doc, dict) or not isinstance(doc.get("versions"), list):
                raise ValueError("the relay's /v1/schemas answer has no versions")
            versions = doc["versions"]
            if not versions:
                raise ValueError(f"the relay has no schema of {source} yet")
            out = []
            for version in versions:
                schema = version.get("schema") if isinstance(version, dict) else None
                if not isinstance(schema, dict) or not isinstance(schema.get("fields"), list):
                    raise ValueError(f"the relay's schema of {source} is not an Avro record")
                out.append(json.loads(json.dumps(schema)))
            return out
        return await puller._retrying(attempt)

    result: list[dict[str, Any]] = asyncio.run(
        _ask(opts, f"the schema of {source}", timeout, job))
    return result


def newest_schema(opts: SourceOptions, source: str, timeout: float = TIMEOUT_S
                  ) -> dict[str, Any]:
    """The newest Avro schema of ``source`` (``GET /v1/schemas?source=``)."""
    return schema_versions(opts, source, timeout)[-1]

"""Relay chaining (docs/relay-chaining.md): the ``relay+http://`` fetcher, a relay's buffer fed by
another relay's windows, byte-identical but for source ids (docs/relay-chaining.md).

- ``_uri``: the URI (``ChainURI``: upstreams for failover, sources, filter, options);
- ``_windows``: whole windows out of response bodies and source ids remapped (pure);
- ``_fetcher``: ``RelayChainFetcher``, the pull loop over the client's ``RelayPuller``.
"""

from databus.fetchers.relay._fetcher import RelayChainFetcher, UpstreamFellOffError
from databus.fetchers.relay._uri import ChainURI
from databus.fetchers.relay._windows import (
    SourceIdMap,
    UpstreamWindow,
    WindowAssembler,
    remap_event,
)

__all__ = ["ChainURI", "RelayChainFetcher", "SourceIdMap", "UpstreamFellOffError",
           "UpstreamWindow", "WindowAssembler", "remap_event"]

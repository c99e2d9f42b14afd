"""``databus dashboard``: one live web page over ``databus status``'s document.

Layout::

    _cli.py       the command: flags, checks, serve until stopped
    _server.py    the aiohttp app (page, assets, /v1/status, /v1/dashboard, /healthz)
                  and the Sampler that takes a status document every interval
    _history.py   the last minutes of a few figures per buffer, consumer, bootstrap
                  service, replicator and group member (pure), for the sparklines
    static/       index.html, dashboard.css, dashboard.js: hand-written, no framework,
                  no build step, nothing fetched from elsewhere

The page shows what the JSON document holds (docs/operations.md, "Dashboard"), every
value marked with ``data-field`` (its path in the document, e.g.
``relays.0.buffers.1.fetcher.lag_seconds``; a ``.`` or ``%`` inside a key is written
``%2E`` or ``%25``) and ``data-value`` (the JSON value), so a
test can compare the page with the document.
"""

"""Per-source quarantine (docs/relay.md, "Quarantined sources").

- ``_record``: the durable record of each buffer's quarantined sources
  (``data_dir/quarantine.json``) and the quarantine marker written into a window;
- ``_host``: what the fetcher host does with ``FetcherContext.quarantine``;
- ``_sink``: the sink step that drops a quarantined source's events and writes markers;
- ``_read``: the cut of a stream at a quarantine SCN (the in-band ``source_quarantined``);
- ``_api``: ``POST /v1/admin/sources/{name}/heal`` and the stream's ``quarantine=pass``.
"""

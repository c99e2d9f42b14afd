"""Bootstrap service: log writer, log applier, snapshot storage, HTTP server."""

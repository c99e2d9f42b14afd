"""Relay: mmap ring buffer with an SCN index, HTTP server, fetcher host."""

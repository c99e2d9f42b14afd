"""The exception hierarchy: one root, ``DatabusError``, and a subclass per concern.

Every error carries ``retriable``: True when the same operation may succeed if tried
again later (a server restarting, a connection lost), False when retrying cannot help
(bad input, corrupted bytes, a wrong config). Callers such as the client's pull loop
and the fetcher host decide between backoff and giving up from this flag alone.

Errors that travel over HTTP carry a stable ``code`` (docs/relay.md, "HTTP API"), so a server
can render them as ``{"error": code, "message": ...}`` and a client can rebuild them.
"""

from __future__ import annotations

from typing import ClassVar

from databus._redact import redact


class DatabusError(Exception):
    """Root of every error raised by databus."""

    code: ClassVar[str] = "internal_error"
    http_status: ClassVar[int] = 500
    retriable: bool = False

    def __init__(self, message: str, *, retriable: bool | None = None) -> None:
        # Messages often quote a driver's text, which may echo a password or token:
        # every configured secret is cut out here, once, for logs, HTTP bodies and status.
        message = redact(message)
        super().__init__(message)
        self.message = message
        if retriable is not None:
            self.retriable = retriable

    def to_json(self) -> dict[str, object]:
        """The JSON error body servers send: ``{"error": code, "message": ...}``."""
        return {"error": self.code, "message": self.message}


class EventFormatError(DatabusError):
    """Bytes that are not a valid event: corrupted, truncated or of an unknown version."""

    code = "bad_event"
    http_status = 400

    def __init__(self, message: str, *, offset: int = 0, reason: str = "invalid") -> None:
        super().__init__(f"{message} (at byte offset {offset}: {reason})")
        self.offset = offset
        self.reason = reason


class CheckpointError(DatabusError):
    """A malformed or impossible checkpoint."""

    code = "bad_request"
    http_status = 400


class FilterError(DatabusError):
    """An invalid filter spec, or one that cannot be applied where it was asked for."""

    code = "bad_request"
    http_status = 400


class UnauthorizedError(DatabusError):
    """A request without a valid credential: no token or client certificate where the
    server has readers, a wrong or revoked token, or a wrong admin token (401)."""

    code = "unauthorized"
    http_status = 401


class ForbiddenError(DatabusError):
    """A request whose credential is valid but does not allow it: a source the reader
    is not granted, or admin endpoints that are disabled (403)."""

    code = "forbidden"
    http_status = 403


class ConfigError(DatabusError):
    """An invalid configuration file: unknown key, wrong type, missing value."""

    code = "config_error"


class SchemaError(DatabusError):
    """An invalid Avro schema, an unknown fingerprint, or values that do not fit a schema."""

    code = "schema_error"


class UnknownSchemaError(SchemaError, KeyError):
    """No schema is registered under a fingerprint (or for a source).

    Also a ``KeyError``, so registries behave like mappings for callers that expect it.
    """

    code = "unknown_schema"
    http_status = 404

    def __str__(self) -> str:
        # KeyError's __str__ would quote the message.
        return self.message


class UnknownSourceError(DatabusError):
    """A logical source (or its id) that the server does not know."""

    code = "unknown_source"
    http_status = 404


class ScnNotFoundError(DatabusError):
    """The SCN asked for is no longer held: the consumer fell off and must bootstrap.

    ``min_scn`` is the oldest SCN the server can still serve from, when known.
    """

    code = "scn_not_found"
    http_status = 410

    def __init__(self, message: str, *, min_scn: int | None = None) -> None:
        super().__init__(message)
        self.min_scn = min_scn

    def to_json(self) -> dict[str, object]:
        body = super().to_json()
        body["min_scn"] = self.min_scn
        return body


class SourceError(DatabusError):
    """A source database could not be read: unreachable, misconfigured, binlog purged."""

    code = "source_error"
    retriable = True


class SourceMisconfiguredError(SourceError):
    """The source cannot be captured as configured (a server setting, a missing slot or
    publication, privileges, credentials): an operator must change something first."""

    code = "source_misconfigured"
    retriable = False


class SourceGapError(SourceError):
    """The source no longer has the log position a fetcher must resume after (purged):
    continuing would leave a gap. A buffer with ``on_source_gap = "dump"`` restarts at
    the source's current position and dumps every table instead (docs/dumps.md)."""

    retriable = False


class SourceQuarantinedError(DatabusError):
    """One logical source failed in a way that belongs to it alone (docs/concepts.md): a row
    its schema cannot hold, a name the relay cannot serve, a statement-format or
    undecodable event touching it, an unsupported DDL. Under ``on_source_error =
    "quarantine"`` the relay keeps capturing the other sources and a stream including
    this one gets it in-band at ``scn``; under ``"stop"`` the fetcher fails with it.
    Retriable for a consumer: the quarantine ends with ``databus relay heal``."""

    code = "source_quarantined"
    http_status = 409
    retriable = True

    def __init__(self, message: str, *, source: str = "", scn: int | None = None,
                 reason: str = "", fix: str = "", retriable: bool | None = None) -> None:
        super().__init__(message, retriable=retriable)
        self.source = source
        self.scn = scn
        self.reason = redact(reason)
        self.fix = fix

    def to_json(self) -> dict[str, object]:
        return {"error": self.code, "message": self.message, "source": self.source,
                "scn": self.scn, "reason": self.reason, "fix": self.fix}


class NotQuarantinedError(DatabusError):
    """``databus relay heal`` of a source that is not in quarantine (nothing to heal)."""

    code = "not_quarantined"
    http_status = 409


class DumpUnsupportedError(DatabusError):
    """A dump was asked of a buffer whose source cannot be dumped (its fetcher has no
    ``open_dump_source``: a chained relay's, a synthetic source): e.g. ``databus relay
    heal``, which heals by a dump. Heal at the relay that reads the database."""

    code = "dump_unsupported"
    http_status = 409


class NotLeaderError(DatabusError):
    """An admin action that writes into a buffer (``databus relay heal``) asked of a
    relay cluster member that does not lead that buffer: ask its leader."""

    code = "not_leader"
    http_status = 409


class TLSVerifyError(DatabusError):
    """A server's TLS certificate did not verify (signed by a CA the client was not
    given, issued for another host name, expired), or the TLS handshake failed (a plain
    HTTP server asked over https://, a client certificate refused). A client cannot fix
    it by retrying: the message names the URL, the reason and the fix (``ca_file``)."""

    code = "tls_error"
    retriable = False


class ConnectionLostError(DatabusError):
    """A server (relay, bootstrap, database) went away; the operation may be retried."""

    code = "connection_lost"
    http_status = 503
    retriable = True


class FilterNotPushableError(FilterError):
    """A filter the bootstrap store cannot write as SQL: refused rather than scanning
    everything and filtering in Python."""

    code = "filter_not_pushable"


class BootstrapTooOldError(DatabusError):
    """The SCN asked for is older than the bootstrap log's floor: the changes right after
    it are gone from the log too, so no consolidated delta can be built from it."""

    code = "bootstrap_too_old"
    http_status = 410

    def __init__(self, message: str, *, log_floor_scn: int | None = None) -> None:
        super().__init__(message)
        self.log_floor_scn = log_floor_scn

    def to_json(self) -> dict[str, object]:
        body = super().to_json()
        body["log_floor_scn"] = self.log_floor_scn
        return body


class StorageUnavailableError(ConnectionLostError):
    """The bootstrap database is unreachable (restarting, network); ask again later."""

    code = "storage_unavailable"


class DumpSetupError(SourceError):
    """A dump cannot run against this source as it is set up: no watermark table, a
    missing grant, a table without a primary key. The message names the fix (``databus
    dump setup``, the ``GRANT``); retrying cannot help until someone applies it."""

    code = "dump_setup"
    http_status = 409
    retriable = False


class DumpConflictError(DatabusError):
    """A dump request that collides with a dump already queued or running (the same
    table twice), or a control request that does not fit the dump's state."""

    code = "conflict"
    http_status = 409


class DumpNotFoundError(DatabusError):
    """No dump with that id on this relay."""

    code = "not_found"
    http_status = 404


class DdlLockTimeoutError(DatabusError):
    """Another process held the schema-setup lock (``databus/_ddl.py``) longer than the
    wait allowed: a setup stopped half-way. Retriable: it is released when its
    connection ends."""

    code = "ddl_lock_timeout"
    retriable = True


class AlreadyRunningError(DatabusError):
    """A second instance of a daemon started by mistake: what it needs (a relay's data
    dir, a bootstrap store's producer or applier, a replication's target) is held by
    another process, which keeps it. Nothing was changed; the message names the holder."""

    code = "already_running"

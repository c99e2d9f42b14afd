"""Which events a stream request gets (DESIGN 6 and 18): the buffer it reads, the
filter compiled for ``EventBuffer.read``, and the sources it waits for.

- ``subscription(relay, request, who)``: ``sources=`` (names, and the patterns ``db.*``
  and ``*``), ``filter=``, and the reader's grant, into one buffer and one compiled
  filter; names and filters of ungranted sources are 403, patterns and requests that
  name no source are narrowed to the grant (relay/_access.py).
- ``source_buffer``/``pattern_buffers``: where a name or a pattern lives (a
  configured table that does not exist yet is waited for, not unknown).
- ``waiting_note``: why a request waits for a source (the ``X-Databus-Waiting``
  header).
"""

from __future__ import annotations

from collections.abc import Iterable

from aiohttp import web

from databus._http import BadRequest, Forbidden, filter_param, sources_param
from databus.batch import CompiledFilter, FilterPlan, compile_filter
from databus.errors import ConfigError, UnknownSourceError
from databus.filters import SourceFilter
from databus.relay._access import may_hold, unrestricted
from databus.relay._catalog import did_you_mean
from databus.relay._relay import RelayReader
from databus.security import Reader, is_pattern, overlaps, pattern_matches, require

__all__ = ["pattern_buffers", "source_buffer", "subscription", "waiting_note"]


def source_buffer(relay: RelayReader, name: str) -> tuple[str, int | None]:
    """The buffer of source ``name`` and its id; the id is None for a source the
    configuration names by a pattern (``db.*``) whose table does not exist yet.
    ``unknown_source`` (404) only for a name the configuration does not name at all."""
    try:
        entry = relay.catalog.source(name)
    except UnknownSourceError:
        try:
            buffer = relay.fetchers.configured_buffer(name)
        except ConfigError as exc:
            raise BadRequest(exc.message) from None
        if buffer is None:
            known = {e.name for e in relay.catalog.sources()}
            for configured in relay.fetchers.configured_sources().values():
                if configured is not None:
                    known.update(configured.names)
            raise UnknownSourceError(
                f"unknown source {name!r}: this relay's configuration does not name it"
                f"{did_you_mean(name, known)}"
            ) from None
        return buffer, None
    return entry.buffer, entry.id


def waiting_note(relay: RelayReader, buffer: str, late: Iterable[str]) -> str:
    """Why the ``late`` sources (named by the configuration's pattern, with no table
    yet: ``subscription``) are waited for (the ``X-Databus-Waiting`` header, DESIGN 17):
    not visible to the relay's user (their database is not listed to it: grants), or no
    such table at the source yet, with a did-you-mean from the tables the relay knows."""
    unlisted = relay.fetchers.unlisted(buffer)
    known = [e.name for e in relay.catalog.sources() if e.buffer == buffer]
    notes = []
    for name in sorted(late):
        database = name.rpartition(".")[0]
        if database in unlisted:
            notes.append(f"{name}: not visible to the relay's user (its database {database} "
                         "is not listed to it: grant it SELECT on the database, or check the "
                         "name)")
        else:
            notes.append(f"{name}: no such table at the source yet{did_you_mean(name, known)}")
    # A header value: one line of printable ASCII.
    return "; ".join(notes).encode("ascii", "replace").decode()[:1000]


def subscription(relay: RelayReader, request: web.Request, who: Reader
                ) -> tuple[str, CompiledFilter | None, frozenset[str], bool]:
    """The buffer a stream request reads, which of its data events the request wants
    (None: all), compiled for ``EventBuffer.read``, and the named sources that have no
    table yet (for ``waiting_note``).

    A configured source whose table does not exist yet is served like one with no
    events (a long poll waits), not as ``unknown_source``: a consumer may start before
    the schema migration. One named by a pattern has no id yet, so the filter looks ids
    it does not know up by name, once per id (``FilterPlan.resolve``): the relay gives
    a source its id before it writes an event with it, so events of the table created
    meanwhile pass.

    ``sources`` may hold patterns, ``db.*`` and ``*``: every matching source, tables
    created later included (chosen by name at read time, like the late tables above).

    Readers (DESIGN 18, relay/_access.py): a named source or a filter of a source
    ``who`` is not granted is 403 ``forbidden``, and so is a pattern no granted source
    can match; a pattern, or a request that names no source, is narrowed to the
    granted sources of the buffer (by name, so a table created later under a ``db.*``
    grant is served too), 403 when the buffer holds none. The last item returned says
    whether sources are chosen by name (a pattern, or narrowed)."""
    requested = sources_param(request)
    # ``db.*`` and ``*`` in sources= subscribe to every matching source, now and later.
    patterns = [n for n in requested if is_pattern(n)]
    names = [n for n in requested if not is_pattern(n)]
    spec = filter_param(request)
    grant = who.grant
    require(who, names)
    require(who, spec.filters)
    refused = [p for p in patterns if not overlaps(p, grant)]
    if refused:
        raise Forbidden(f"reader {who.name!r} is granted no source matching "
                        f"{', '.join(refused)}")
    catalog = relay.catalog
    if requested:
        located = {n: source_buffer(relay, n) for n in names}
        buffers = {b for b, _ in located.values()}
        for pattern in patterns:
            buffers |= pattern_buffers(relay, pattern)
        if len(buffers) > 1:
            raise BadRequest(
                f"sources {', '.join(requested)} live in different buffers "
                f"({', '.join(sorted(buffers))}); stream them with one request per buffer"
            )
        buffer_name = buffers.pop()
    elif len(relay.buffers) == 1:
        buffer_name = next(iter(relay.buffers))
        located = {}
    else:
        raise BadRequest("this relay has several buffers: name the sources to stream")
    filters = {name: (source_buffer(relay, name)[1], f) for name, f in spec.filters.items()}
    needs_key = any(f.needs_key for _, f in filters.values())
    # Sources chosen by name at read time: the patterns asked for, or (no sources named)
    # everything, narrowed to the reader's grant when it is not granted everything.
    by_name = bool(patterns) or (not located and not unrestricted(grant))

    def admit(name: str) -> bool:
        return grant.allows(name) and (
            not patterns or any(pattern_matches(p, name) for p in patterns))

    held = [e for e in catalog.sources() if e.buffer == buffer_name]
    if by_name and not located and not may_hold(
            grant, (e.name for e in held), relay.fetchers.configured_sources().get(buffer_name)):
        raise Forbidden(f"reader {who.name!r} is granted no source of buffer {buffer_name}")
    if not located and not filters and not by_name:
        return buffer_name, None, frozenset(), False
    everything = not located and not by_name
    wanted = {i for _, i in located.values() if i is not None}
    if by_name:
        wanted |= {e.id for e in held if admit(e.name)}
    late_names = frozenset(n for n, (_, i) in located.items() if i is None)
    late_filters = {n: f for n, (i, f) in filters.items() if i is None}

    def late(source_id: int) -> tuple[bool, SourceFilter | None]:
        try:
            name = catalog.by_id(source_id).name
        except UnknownSourceError:
            return everything, None
        return (everything or name in late_names or (by_name and admit(name)),
                late_filters.get(name))

    plan = FilterPlan(
        wanted=None if everything else frozenset(wanted),
        filters={i: f for i, f in filters.values() if i is not None},
        resolve=late if late_names or late_filters or by_name else None,
        needs_key=needs_key,
    )
    return buffer_name, compile_filter(plan), late_names, by_name


def pattern_buffers(relay: RelayReader, pattern: str) -> set[str]:
    """The buffers that hold, or are configured to hold, a source matching ``pattern``
    (``db.*`` or ``*``); ``unknown_source`` (404) when none does."""
    found = {e.buffer for e in relay.catalog.sources() if pattern_matches(pattern, e.name)}
    if pattern == "*":
        found |= set(relay.buffers)
    else:
        try:
            configured = relay.fetchers.configured_buffer(pattern)
        except ConfigError as exc:
            raise BadRequest(exc.message) from None
        if configured is not None:
            found.add(configured)
    if not found:
        raise UnknownSourceError(f"no source of this relay matches {pattern!r}")
    return found

"""The event core: batch APIs over whole bodies and buffer slices, so that Python
touches a response once, not each event (docs/event-core.md). Scan and verify, window
framing, the relay's read rules and filters, decoding into consumer events, encoding
events and flat Avro records, the bootstrap log's COPY rows, key hashes.

Two twins with one API: ``_native`` (Cython, compiled by the package's build) and
``_python`` (the reference, written with ``databus.event``'s one-event functions).
The compiled one is used when it imports; ``DATABUS_PURE_PYTHON=1`` forces the twin.
``IMPLEMENTATION`` says which is active ("native" or "python"); ``twin(name)`` gives
either module by name (the tests run both).
"""

from __future__ import annotations

import importlib.util
import logging
import os
from types import ModuleType
from typing import TYPE_CHECKING

from databus.batch import _python
from databus.batch._scan import FIELDS, LogCopy, Scan, WindowFrames
from databus.batch._select import FilterPlan, Predicate, ReadState

log = logging.getLogger("databus.batch")


def load_compiled(name: str) -> tuple[ModuleType | None, str | None]:
    """The compiled twin ``name`` (a module path), or None and why not: the one rule
    every compiled module of the package is chosen by (``DATABUS_PURE_PYTHON=1`` forces
    the pure-Python twins; a build without a compiler has none)."""
    if os.environ.get("DATABUS_PURE_PYTHON", "") not in ("", "0"):
        return None, "DATABUS_PURE_PYTHON is set"
    if importlib.util.find_spec(name) is None:
        return None, "the compiled module is not built (no C compiler at install?)"
    try:
        return importlib.import_module(name), None
    except ImportError as exc:
        return None, f"the compiled module did not import ({exc})"


def _load() -> tuple[ModuleType, str | None]:
    native, why = load_compiled("databus.batch._native")
    return (native, None) if native is not None else (_python, why)


_impl, WHY_PURE = _load()
if _impl is _python and WHY_PURE and "DATABUS_PURE_PYTHON" not in WHY_PURE:
    # A build without a compiler: said once, then the twin does the work.
    log.warning("databus: %s; using the pure-Python event core", WHY_PURE)
IMPLEMENTATION: str = _impl.IMPLEMENTATION

if TYPE_CHECKING:  # both twins have the reference's signatures
    from databus.batch._python import (
        CompiledFilter,
        EventBase,
        check_value,
        check_windows,
        compile_filter,
        copy_rows,
        decode_events,
        decode_relay_body,
        encode_event,
        encode_events,
        encode_flat_record,
        eow_order,
        frame_windows,
        gather,
        group_rows,
        key_hashes,
        log_copy,
        restamp,
        scan,
        select_events,
        set_undecoded,
        stable_key_hash,
        window_checksum,
    )
else:
    scan = _impl.scan
    frame_windows = _impl.frame_windows
    window_checksum = _impl.window_checksum
    decode_events = _impl.decode_events
    check_value = _impl.check_value
    decode_relay_body = _impl.decode_relay_body
    eow_order = _impl.eow_order
    EventBase = _impl.EventBase
    set_undecoded = _impl.set_undecoded
    encode_event = _impl.encode_event
    encode_events = _impl.encode_events
    key_hashes = _impl.key_hashes
    restamp = _impl.restamp
    stable_key_hash = _impl.stable_key_hash
    CompiledFilter = _impl.CompiledFilter
    compile_filter = _impl.compile_filter
    select_events = _impl.select_events
    gather = _impl.gather
    copy_rows = _impl.copy_rows
    group_rows = _impl.group_rows
    check_windows = _impl.check_windows
    log_copy = _impl.log_copy
    encode_flat_record = _impl.encode_flat_record


def twin(name: str) -> ModuleType:
    """The module of one twin: "python" always, "native" if it was built."""
    if name == "python":
        return _python
    if name == "native":
        from databus.batch import _native  # type: ignore[attr-defined]

        return _native  # type: ignore[no-any-return]
    raise ValueError(f"no twin named {name!r}")


def native_available() -> bool:
    try:
        twin("native")
    except ImportError:
        return False
    return True


__all__ = [
    "FIELDS", "IMPLEMENTATION", "WHY_PURE", "CompiledFilter", "EventBase", "FilterPlan",
    "LogCopy", "Predicate", "ReadState", "Scan", "WindowFrames", "check_value",
    "check_windows", "compile_filter", "copy_rows", "decode_events", "decode_relay_body",
    "encode_event", "encode_events", "encode_flat_record", "eow_order", "frame_windows",
    "gather", "group_rows", "key_hashes", "load_compiled", "log_copy", "native_available",
    "restamp", "scan", "select_events", "set_undecoded", "stable_key_hash", "twin",
    "window_checksum",
]

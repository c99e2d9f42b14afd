"""Which asyncio event loop ``databus relay`` and ``databus bootstrap`` run on.

uvloop (the ``fast`` extra: ``pip install 'databus[fast]'``) runs the same code with a
faster loop and transports written in C. The choice:

- ``event_loop`` in ``[relay]`` or ``[bootstrap]``: ``"auto"`` (the default: uvloop when
  it can be imported, else asyncio's own loop), ``"uvloop"`` (a ``ConfigError`` when it
  is not installed: asking for it and silently not getting it would make a benchmark
  lie), or ``"asyncio"``.
- ``DATABUS_EVENT_LOOP`` in the environment (same three values) overrides the config,
  so a benchmark can compare both loops on one config file.

The servers report the loop they run on (``running_loop_name``) as ``event_loop`` in
their ``/v1/status``: what actually runs, not what was asked for.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, get_args

from databus.errors import ConfigError

__all__ = ["ENV", "EventLoopSetting", "LoopChoice", "choose", "running_loop_name"]

ENV = "DATABUS_EVENT_LOOP"
EventLoopSetting = Literal["auto", "uvloop", "asyncio"]
SETTINGS: tuple[str, ...] = get_args(EventLoopSetting)


@dataclass(frozen=True)
class LoopChoice:
    """The loop to run: its name, the factory for ``asyncio.Runner`` (None: asyncio's
    default loop) and why it was chosen, for the start-up log line."""

    name: Literal["uvloop", "asyncio"]
    factory: Callable[[], asyncio.AbstractEventLoop] | None
    why: str

    def describe(self) -> str:
        return f"{self.name} ({self.why})"


def _uvloop_factory() -> tuple[Callable[[], asyncio.AbstractEventLoop] | None, str]:
    """uvloop's loop factory and version, or None and why it cannot be imported."""
    try:
        import uvloop
    except ImportError as exc:
        return None, str(exc)
    return uvloop.new_event_loop, getattr(uvloop, "__version__", "?")


def choose(configured: str, field: str) -> LoopChoice:
    """The loop for a server whose config says ``configured`` at ``field`` (e.g.
    ``"relay.event_loop"``), ``DATABUS_EVENT_LOOP`` taking precedence."""
    setting, source = configured, field
    override = os.environ.get(ENV, "").strip()
    if override:
        setting, source = override.lower(), ENV
    if setting not in SETTINGS:
        raise ConfigError(f"{source} must be one of {', '.join(SETTINGS)}, got {setting!r}")
    if setting == "asyncio":
        return LoopChoice("asyncio", None, f"{source} = asyncio")
    factory, detail = _uvloop_factory()
    if factory is not None:
        return LoopChoice("uvloop", factory, f"uvloop {detail}; {source} = {setting}")
    if setting == "uvloop":
        raise ConfigError(f"{source} = uvloop, but uvloop cannot be imported ({detail}): "
                          "install it (pip install 'databus[fast]') or set auto or asyncio")
    return LoopChoice("asyncio", None, f"{source} = auto; uvloop not installed")


def running_loop_name() -> Literal["uvloop", "asyncio"]:
    """``"uvloop"`` or ``"asyncio"``: the loop running the caller (a coroutine)."""
    module = type(asyncio.get_running_loop()).__module__
    return "uvloop" if module.split(".")[0] == "uvloop" else "asyncio"

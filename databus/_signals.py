"""Clean shutdown (DESIGN 17, "Logs"): SIGTERM and SIGINT end a daemon, ``databus tail``
or a client's ``run()`` with one log line and exit status 0, no traceback.

``stop_on_signals`` is for code that runs an asyncio loop in the main thread: each
signal calls ``stop`` (which makes the loop's work end by itself) and logs one line.
``databus`` itself (databus/cli.py) turns a SIGTERM that arrives outside such a loop
(while a daemon starts, or stops) into the same ending as a SIGINT.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import Callable

__all__ = ["SIGNALS", "stop_on_signals"]

SIGNALS = (signal.SIGINT, signal.SIGTERM)


def stop_on_signals(stop: Callable[[], None], what: str, logger: logging.Logger
                    ) -> Callable[[], None]:
    """In the running loop, call ``stop`` on SIGINT or SIGTERM, logging "``what``:
    stopping (SIGTERM)" once; returns the function that removes the handlers. Outside
    the main thread (an embedder's thread) signals are not ours: nothing is installed."""
    loop = asyncio.get_running_loop()
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    installed: list[signal.Signals] = []
    said = False

    def signalled(sig: signal.Signals) -> None:
        nonlocal said
        if not said:
            said = True
            logger.info("%s: stopping (%s)", what, sig.name)
        stop()

    for sig in SIGNALS:
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, signalled, sig)
            installed.append(sig)

    def remove() -> None:
        for sig in installed:
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(sig)

    return remove

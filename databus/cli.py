"""The ``databus`` command line: one entry point, subcommands registered by modules.

A subcommand lives next to the component it drives (``databus.relay._cli`` for
``databus relay``, ...) and exposes ``register(subparsers) -> None`` that adds its
parser and sets ``handler`` (a callable taking the parsed namespace and returning an
exit code). Modules are imported lazily by name so that ``databus --help`` stays fast
and a missing optional dependency (pyspark) only breaks the command that needs it.
Third parties add commands with the ``databus.commands`` entry point group, whose
values name such modules.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points

from databus import __version__
from databus._redact import install_log_redaction, redact
from databus.errors import ConfigError, DatabusError

Handler = Callable[[argparse.Namespace], int]

# Modules that register built-in subcommands; components append theirs here.
# databus._status_view (``databus status``) talks to every component over HTTP only, so
# it is core, not an entry point of one component.
BUILTIN_COMMAND_MODULES: list[str] = ["databus.cli", "databus._status_view"]

log = logging.getLogger("databus.cli")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The core's own subcommands."""
    check = subparsers.add_parser(
        "check-config", help="validate a TOML config file and print it with secrets hidden"
    )
    check.add_argument("config", help="path to a databus TOML file")
    check.set_defaults(handler=_check_config)


def _check_config(args: argparse.Namespace) -> int:
    from databus.config import describe, load_config

    config = load_config(args.config)
    if all(getattr(config, f.name) is None for f in dataclasses.fields(config)):
        # Every daemon would refuse it ("no [relay] section"): so does the check.
        names = ", ".join(f"[{f.name}]" for f in dataclasses.fields(config))
        raise ConfigError(f"{args.config}: no section to run (expected one of {names})")
    print(json.dumps(describe(config), indent=2, sort_keys=True))
    return 0


def _os_error(exc: OSError) -> str:
    """``cannot create /x/y: No such file or directory``-like, on one line."""
    what = exc.strerror or str(exc) or type(exc).__name__
    if exc.filename is not None:
        return f"{os.fsdecode(exc.filename)}: {what}"
    return what


def _interrupt(signum: int, frame: object) -> None:
    """SIGTERM where no loop handles it: end as a SIGINT does."""
    raise KeyboardInterrupt


def _command_modules() -> list[str]:
    modules = list(BUILTIN_COMMAND_MODULES)
    modules.extend(ep.value for ep in entry_points(group="databus.commands"))
    return modules


def _version_line() -> str:
    """``databus 0.1.0 (event core: native)``, or ``python`` and why when the compiled
    batch module is not in use."""
    from databus import batch

    core = batch.IMPLEMENTATION
    if batch.WHY_PURE:
        core += f"; {batch.WHY_PURE}"
    return f"databus {__version__} (event core: {core})"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="databus", description="Change data capture: relays, bootstrap, client tools."
    )
    parser.add_argument("--version", action="version", version=_version_line())
    parser.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"]
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _command_modules():
        module = importlib.import_module(name)
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # No configured secret reaches a log line, whoever logs it (aiohttp quotes header
    # values, drivers quote URLs): see databus._redact.
    install_log_redaction()
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        return handler(args)
    except DatabusError as exc:
        print(redact(f"databus {args.command}: error: {exc}"), file=sys.stderr)
        return 1
    except OSError as exc:
        # A path of the config that cannot be created, a host that does not resolve: the
        # operator's to fix, in one line (the daemon has opened nothing it keeps).
        print(redact(f"databus {args.command}: error: {_os_error(exc)}"), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        # SIGINT, or a SIGTERM (below) outside a daemon's own handlers (while it starts
        # or stops): a requested end, not a failure (DESIGN 17: one line, status 0).
        print(f"databus {args.command}: stopped", file=sys.stderr)
        return 0
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())

"""What a fetcher says when it sets one logical source aside (DESIGN 17,
``FetcherContext.quarantine``): the fix text, ending with the heal command, and the
wording of the failures every fetcher can meet."""

from __future__ import annotations

import shlex
from collections.abc import Set

from databus.fetchers._api import FetcherContext

__all__ = ["UNSERVABLE_NAME", "catalog_refusal", "heal_fix", "healed_since",
           "remember_quarantined", "servable_name"]

# The relay serves logical source names of printable characters, no whitespace or comma,
# at most 255 characters (relay/_catalog.py; stream URLs list them comma-separated): a
# table named otherwise cannot be served. tests/unit/test_source_failures.py holds the two
# rules together.
MAX_NAME = 255
UNSERVABLE_NAME = ("its name cannot be served by the relay (source names are at most 255 "
                   "printable characters without whitespace or commas)")


def heal_fix(source: str, first: str) -> str:
    """``SourceFailure.fix``: ``first`` (what to change at the source), then the command
    that takes ``source`` out of quarantine and dumps it."""
    return (f"{first}; then databus relay heal --relay URL --source "
            f"{shlex.quote(source)}")


def servable_name(name: str) -> bool:
    """Whether the relay can serve a logical source named ``name``."""
    return bool(name) and len(name) <= MAX_NAME and "," not in name and not any(
        c.isspace() or not c.isprintable() for c in name)


def catalog_refusal(source: str, error: Exception) -> tuple[str, str]:
    """(reason, what to fix) when the relay's catalog refuses ``source`` (``ConfigError``
    of ``SourceCatalog.source_id``/``register_schema``): a name it cannot serve, or a
    source another buffer of the relay feeds already."""
    if not servable_name(source):
        return UNSERVABLE_NAME, "rename the table (or leave it out of tables=)"
    return (f"the relay's catalog refuses it: {error}",
            "capture it in one buffer only (its tables= and no other's)")


# -- healing (``databus relay heal`` restarts the fetcher) ------------------------------
#
# A restarted fetcher resumes after the buffer's newest window, which may be behind what
# the last run had read: transactions of quarantined sources only wrote no window. A
# source healed meanwhile would meet those transactions again, and with them the
# failure that set it aside (a statement-format event, a NaN not yet fixed then). The
# heal's dump brings the source's rows as of after the heal, so a fetcher skips the
# source's changes up to what the last run had read: ``remember_quarantined`` at the end
# of a run keeps, in ``FetcherContext.memory``, that position per quarantined source,
# and ``healed_since`` at the start of the next gives those no longer quarantined.


def remember_quarantined(context: FetcherContext, key: str, quarantined: Set[str],
                         healed: dict[str, int], read_through: int) -> None:
    """Keep, for the next run, ``read_through`` (the SCN of the newest transaction this
    run read) per quarantined source, and the healed sources still to skip further."""
    kept = {s: t for s, t in healed.items() if t > read_through}
    kept.update(dict.fromkeys(quarantined, read_through))
    context.memory[key] = kept


def healed_since(context: FetcherContext, key: str, quarantined: Set[str]
                 ) -> dict[str, int]:
    """Sources the last run knew as quarantined (or healed) that are not quarantined
    now: source -> the SCN up to which their changes are skipped."""
    remembered = context.memory.get(key) or {}
    return {s: t for s, t in remembered.items() if s not in quarantined}

"""What a fetcher says when it sets one logical source aside (DESIGN 17,
``FetcherContext.quarantine``): the fix text, ending with the heal command, and the
wording of the failures every fetcher can meet."""

from __future__ import annotations

import shlex

__all__ = ["UNSERVABLE_NAME", "heal_fix", "servable_name"]

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

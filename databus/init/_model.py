"""What an inspection of a source returns: findings, the SQL to run, the tables."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from databus.config._secrets import _URI_PASSWORD_RE

__all__ = ["Finding", "Inspection", "Verdict", "password_to_reference"]

Verdict = Literal["ok", "warning", "error"]

# The variable a source URI's password becomes in the written configs.
SOURCE_PASSWORD_ENV = "DATABUS_SOURCE_PASSWORD"


@dataclass(frozen=True, slots=True)
class Finding:
    """One check's verdict; ``fix`` says what to change when it is not ok."""

    name: str
    verdict: Verdict
    message: str
    fix: str | None = None


@dataclass
class Inspection:
    """A source as ``databus init`` found it.

    ``sql`` are the statements an administrator must still run (comment lines start with
    ``--``), in order; ``tables`` the logical source names (``db.table``) the configs
    capture and replicate, each with a primary key; ``buffer`` the relay buffer's name.
    """

    kind: str
    findings: list[Finding] = field(default_factory=list)
    sql: list[str] = field(default_factory=list)
    tables: list[str] = field(default_factory=list)
    buffer: str = "main"
    admin: str = "an administrator"  # who runs the SQL, e.g. "root (mysql -u root)"

    def ok(self, name: str, message: str) -> None:
        self.findings.append(Finding(name, "ok", message))

    def warn(self, name: str, message: str, fix: str | None = None) -> None:
        self.findings.append(Finding(name, "warning", message, fix))

    def error(self, name: str, message: str, fix: str | None = None) -> None:
        self.findings.append(Finding(name, "error", message, fix))

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.verdict == "error"]

    @property
    def ready(self) -> bool:
        """Nothing failed and no SQL is left to run: the configs can be written."""
        return not self.errors and not [s for s in self.sql if not s.startswith("--")]


_NAME_RE = re.compile(r"[^A-Za-z0-9_]+")


def buffer_name(text: str, default: str) -> str:
    """A relay buffer name from a database name (letters, digits, ``_``)."""
    name = _NAME_RE.sub("_", text).strip("_")
    return name or default


def password_to_reference(uri: str, variable: str = SOURCE_PASSWORD_ENV
                          ) -> tuple[str, bool]:
    """``uri`` with its password replaced by ``${variable}``, and whether it had one.

    Everything from the authority's first ``:`` to the last ``@`` is the password, as
    ``redact_uri`` reads it, so no piece of it can stay in the file."""
    match = _URI_PASSWORD_RE.match(uri)
    if match is None or not match.group("password"):
        return uri, False
    return f"{match.group('head')}:${{{variable}}}@{match.group('tail')}", True

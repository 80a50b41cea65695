"""The probe's report: the server it measured, each section's figures (measured or
inferred), the section that failed and why, what was not run and why, and the plan it
announced. One JSON document; the CLI
prints it as tables."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ctxlab.probe.figures import Figure
from ctxlab.probe.identify import ServerInfo

if TYPE_CHECKING:
    from ctxlab.kvevents.residency import Residency

FORMAT = "ctxlab-probe/1"


@dataclass
class ProbeReport:
    server: ServerInfo
    plan: dict[str, int]
    nonce: int
    token_rule: str = ""
    sections: dict[str, list[Figure]] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)
    not_run: dict[str, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)  # the section the run ended in: why
    running: str = ""  # the section being measured (not written): where a failure happened
    sent: dict[str, int] = field(default_factory=dict)
    error: str = ""
    profile_file: str = ""
    residency: Residency | None = field(default=None, repr=False)  # --kv-events (not written)

    def add(self, section: str, figures: list[Figure]) -> None:
        self.sections.setdefault(section, []).extend(figures)

    def figure(self, section: str, name: str) -> Figure | None:
        for f in self.sections.get(section, []):
            if f.name == name:
                return f
        return None

    def document(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "server": self.server.as_dict(),
            "plan": self.plan,
            "sent": self.sent,
            "nonce": self.nonce,
            "token_rule": self.token_rule,
            "sections": {k: [f.as_dict() for f in v] for k, v in self.sections.items()},
            "details": self.details,
            "not_run": self.not_run,
            "failed": self.failed,
            "profile_file": self.profile_file,
            "complete": not self.error and not self.not_run and not self.failed,
            "error": self.error,
        }

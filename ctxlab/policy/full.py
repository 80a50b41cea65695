"""`full`: keep every token. The baseline every other policy is measured against."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ctxlab.policy.base import Policy


@dataclass
class FullPolicy(Policy):
    """No eviction, no selection: the engine's own behaviour (dense causal attention)."""

    name: ClassVar[str] = "full"
    paper: ClassVar[str] = "baseline (no compression)"

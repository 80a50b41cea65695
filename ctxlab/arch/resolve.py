"""One entry for every caller: an architecture from a preset name, a config.json or a GGUF file.

The planner, the simulator and the lab all take "a model" in one of these three forms; this is
the one place that decides which reader runs, so they all reject ambiguous input the same way.
"""

from __future__ import annotations

from pathlib import Path

from ctxlab.arch.spec import ArchSpec
from ctxlab.errors import CtxlabError


def resolve_arch(
    name: str | None = None,
    config: str | Path | None = None,
    gguf: str | Path | None = None,
) -> ArchSpec:
    """Build the architecture from exactly one of: preset `name`, HF `config`, `gguf` file."""
    check_one_source(name, config, gguf)
    if name is not None:
        from ctxlab.arch.presets import get_preset

        return get_preset(name)
    if config is not None:
        from ctxlab.arch.hf_config import from_hf_config

        return from_hf_config(config)
    from ctxlab.arch.gguf_meta import from_gguf

    assert gguf is not None
    return from_gguf(gguf)


def check_one_source(name: object, config: object, gguf: object) -> None:
    """Exactly one architecture source; the same sentence for every command that takes one."""
    given = [
        label
        for label, value in (("a preset name", name), ("--config", config), ("--gguf", gguf))
        if value is not None
    ]
    if len(given) != 1:
        what = "none" if not given else " and ".join(given)
        raise CtxlabError(
            "give exactly one architecture source (a preset name, --config config.json or "
            f"--gguf file), got {what}."
        )

"""`ctxlab profile`: measure the real engine's step times on this machine for the simulator.

Writes a `ctxlab-step-profile/1` JSON file that `ctxlab simulate --profile FILE` reads.
torch and the model are imported inside the command so `ctxlab --help` stays fast.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import typer

from ctxlab.commands.options import (
    DEFAULT_MODEL,
    DTypeOpt,
    JsonOpt,
    KVPoolTokensOpt,
    ModelOpt,
    PageSizeOpt,
    SeedOpt,
    engine_options,
    output_file,
)
from ctxlab.errors import CtxlabError
from ctxlab.inputs import load_json
from ctxlab.json_output import dumps

DEFAULT_OUT = Path("out/profile/step-profile.json")


def open_engine(
    model: str,
    dtype: str,
    threads: int,
    pool_tokens: int,
    block_size: int,
    max_num_batched_tokens: int,
    max_num_seqs: int,
) -> tuple[Any, Any]:
    """Pin torch's thread count, load the model, build an engine; (loaded model, engine).

    The thread count is pinned because timings on a shared machine are only comparable
    when the profile and the run it predicts use the same number of threads."""
    if threads <= 0:
        raise CtxlabError(f"--threads must be positive, got {threads}")
    import torch

    torch.set_num_threads(threads)
    from ctxlab.engine import LLMEngine
    from ctxlab.model.open_model import open_model

    loaded = open_model(model, dtype)
    engine = LLMEngine(
        loaded.model,
        loaded.config,
        loaded.tokenizer,
        kv_pool_tokens=pool_tokens,
        block_size=block_size,
        max_num_batched_tokens=max_num_batched_tokens,
        max_num_seqs=max_num_seqs,
        model_id=str(loaded.source_path),
    )
    return loaded, engine


def measure_profile(
    loaded: Any,
    engine: Any,
    model: str,
    dtype: str,
    quick: bool,
    out: Path,
    seed: int = 0,
    console: Any = None,
    design: Any = None,
    earlier: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Warm up, run the design with a progress bar, write the profile; the document.

    `earlier` is a profile document measured before on the same engine: its steps are kept
    (phase "before"), and the new ones are marked "after", so one file brackets a run."""
    from ctxlab.engine.profile import FULL, QUICK, measure, profile_document, warm_up
    from ctxlab.progress import progress

    design = design or (QUICK if quick else FULL)
    need = design.max_tokens()
    if need > engine.kv.pool_tokens:
        raise CtxlabError(
            f"the profile needs a pool of at least {need} tokens; raise --kv-pool-tokens"
        )
    vocab = loaded.config.vocab_size
    with progress("warming up", total=design.scenarios() + 1, enabled=console is not None) as bar:
        warm_up(engine, vocab, seed)
        bar.advance()

        def step_done(label: str) -> None:
            bar.advance()
            bar.describe(f"measured {label}")

        steps = measure(engine, design, vocab, seed, step_done)
    name = "quick" if design is QUICK else ("full" if design is FULL else "custom")
    doc = profile_document(steps, model, dtype, engine, name)
    if earlier is not None:
        for step in earlier["steps"]:
            step.setdefault("phase", "before")
        for step in doc["steps"]:
            step["phase"] = "after"
        doc["steps"] = earlier["steps"] + doc["steps"]
        doc["design"] = f"{name}, measured before and after"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return doc


def fit_summary(path: Path) -> dict[str, float]:
    """The fitted linear step model of a profile and how well it fits its own steps."""
    from ctxlab.sim.calibrate import step_prediction
    from ctxlab.sim.steptime import ProfileStepTime

    model = ProfileStepTime(path)
    steps = load_json(path, "step profile")["steps"]  # type: ignore[index]
    self_fit = step_prediction(str(path), steps)
    c = model.coef
    return {
        "ms_per_step": c[0] * 1e3,
        "ms_per_prefill_token": c[1] * 1e3,
        "us_per_prefill_key": c[2] * 1e6,
        "ms_per_decode_token": c[3] * 1e3,
        "us_per_decode_key": c[4] * 1e6,
        "fit_median_abs_rel_error": self_fit["median_abs_rel_error"],
    }


def _size_label(step: dict) -> str:
    if step["kind"] == "prefill":
        return f"{step['prefill_tokens']} tok"
    if step["kind"] == "decode":
        return f"batch {step['decode_tokens']}"
    return f"{step['prefill_tokens']} tok + {step['decode_tokens']} dec"


def print_profile(console: Any, doc: dict, fit: dict, out: Path) -> None:
    from rich.table import Table

    groups: dict[tuple[str, str], list[dict]] = {}
    for s in doc["steps"]:
        groups.setdefault((s["kind"], _size_label(s)), []).append(s)
    table = Table(title=f"step times: {doc['model']} ({doc['dtype']}) on {doc['device']}")
    for col in ("kind", "step", "steps", "keys per token", "median ms", "ms / token"):
        table.add_column(col, justify="left" if col in ("kind", "step") else "right")
    order = {"prefill": 0, "decode": 1, "mixed": 2}
    for (kind, label), rows in sorted(
        groups.items(),
        key=lambda kv: (order[kv[0][0]], kv[1][0]["prefill_tokens"], kv[1][0]["decode_tokens"]),
    ):
        tokens = rows[0]["prefill_tokens"] + rows[0]["decode_tokens"]
        keys = [(r["prefill_keys"] + r["decode_keys"]) / tokens for r in rows]
        med = statistics.median(r["seconds"] for r in rows) * 1e3
        table.add_row(
            kind,
            label,
            str(len(rows)),
            f"{min(keys):,.0f}-{max(keys):,.0f}",
            f"{med:.1f}",
            f"{med / tokens:.2f}",
        )
    console.print(table)
    console.print(
        "fit: step = {ms_per_step:.1f} ms + {ms_per_prefill_token:.3f} ms/prefill token + "
        "{us_per_prefill_key:.4f} us/prefill key + {ms_per_decode_token:.2f} ms/decode token + "
        "{us_per_decode_key:.3f} us/decode key (median |error| on these steps "
        "{fit_median_abs_rel_error:.1%})".format(**fit)
    )
    console.print(f"profile written to {out}")


def register(app: typer.Typer) -> None:
    @app.command("profile")
    def profile(
        model: ModelOpt = DEFAULT_MODEL,
        out: Path = typer.Option(DEFAULT_OUT, "--out", help="Profile JSON file to write."),
        quick: bool = typer.Option(False, "--quick", help="Fewer steps (about a third)."),
        threads: int = typer.Option(1, "--threads", help="torch threads (pinned)."),
        dtype: DTypeOpt = "float32",
        kv_pool_tokens: KVPoolTokensOpt = 32768,
        page_size: PageSizeOpt = 16,
        max_num_batched_tokens: int = typer.Option(
            4096, "--max-num-batched-tokens", help="Engine token budget per step."
        ),
        max_num_seqs: int = typer.Option(
            64, "--max-num-seqs", help="Most requests the engine runs at once."
        ),
        seed: SeedOpt = 0,
        as_json: JsonOpt = False,
    ) -> None:
        """Time the real engine's steps (prefill chunks, decode batches, mixed) on this
        machine and write a step profile for `ctxlab simulate --profile`."""
        from rich.console import Console

        output_file(out, ".json")
        if threads <= 0:
            raise CtxlabError(f"--threads must be positive, got {threads}")
        if max_num_batched_tokens <= 0 or max_num_seqs <= 0:
            raise CtxlabError("--max-num-batched-tokens and --max-num-seqs must be positive")
        engine_options(locals())
        from ctxlab.engine.profile import FULL, QUICK
        from ctxlab.model.registry import resolve_model_path

        resolve_model_path(model)
        need = (QUICK if quick else FULL).max_tokens()
        if need > kv_pool_tokens:
            raise CtxlabError(
                f"the profile needs a pool of at least {need} tokens; raise --kv-pool-tokens"
            )
        console = Console(stderr=as_json)
        loaded, engine = open_engine(
            model,
            dtype,
            threads,
            kv_pool_tokens,
            page_size,
            max_num_batched_tokens,
            max_num_seqs,
        )
        doc = measure_profile(loaded, engine, model, dtype, quick, out, seed, console)
        fit = fit_summary(out)
        if as_json:
            meta = {k: v for k, v in doc.items() if k != "steps"}
            typer.echo(dumps({**meta, "steps": len(doc["steps"]), "fit": fit, "out": str(out)}))
            return
        print_profile(console, doc, fit, out)

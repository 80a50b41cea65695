"""`ctxlab profile`: measure the real engine's step times on this machine for the simulator.

Writes a `ctxlab-step-profile/1` JSON file that `ctxlab simulate --profile FILE` reads.
The measurement is `ctxlab.engine.profile`'s (`open_engine`, `measure_profile`) and the fit
`ctxlab.sim.calibrate.fit_summary`; torch and the model are imported inside the command so
`ctxlab --help` stays fast.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
from ctxlab.json_output import dumps

if TYPE_CHECKING:
    from rich.console import Console

DEFAULT_OUT = Path("out/profile/step-profile.json")


def _size_label(step: dict) -> str:
    if step["kind"] == "prefill":
        return f"{step['prefill_tokens']} tok"
    if step["kind"] == "decode":
        return f"batch {step['decode_tokens']}"
    return f"{step['prefill_tokens']} tok + {step['decode_tokens']} dec"


def print_profile(console: Console, doc: dict[str, Any], fit: dict, out: Path) -> None:
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
        from ctxlab.engine.profile import measure_profile, open_engine
        from ctxlab.sim.calibrate import fit_summary

        loaded, engine = open_engine(
            model,
            dtype,
            threads,
            kv_pool_tokens,
            page_size,
            max_num_batched_tokens,
            max_num_seqs,
        )
        doc = measure_profile(loaded, engine, model, dtype, quick, out, seed, True)
        fit = fit_summary(out)
        if as_json:
            meta = {k: v for k, v in doc.items() if k != "steps"}
            typer.echo(dumps({**meta, "steps": len(doc["steps"]), "fit": fit, "out": str(out)}))
            return
        print_profile(console, doc, fit, out)

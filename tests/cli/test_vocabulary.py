"""One vocabulary across commands: the same flag for the same thing, help on every flag,
boolean flags shown as flags, the default model by its readable name."""

from __future__ import annotations

import click
import pytest
import typer

from ctxlab.cli import app


def _commands() -> list[tuple[str, click.Command]]:
    root = typer.main.get_command(app)
    found: list[tuple[str, click.Command]] = []

    def walk(command: click.Command, path: str) -> None:
        found.append((path, command))
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, f"{path} {name}")

    walk(root, "ctxlab")
    return found


COMMANDS = _commands()


def test_every_command_is_walked():
    names = {path for path, _ in COMMANDS}
    for expected in ("ctxlab plan", "ctxlab simulate", "ctxlab generate", "ctxlab eval perplexity"):
        assert expected in names


@pytest.mark.parametrize("path,command", COMMANDS, ids=[p for p, _ in COMMANDS])
def test_every_visible_flag_and_argument_has_help(path, command):
    missing = [p.name for p in command.params if not getattr(p, "hidden", False) and not p.help]
    assert not missing, f"{path}: {missing} have no help text"


@pytest.mark.parametrize("path", [p for p, _ in COMMANDS])
def test_help_shows_boolean_flags_as_flags(cli, path):
    result = cli(*path.split()[1:], "--help")
    assert result.code == 0
    assert "<bool>" not in result.out
    assert "--help" in result.out


def _flags(path: str) -> set[str]:
    command = dict(COMMANDS)[path]
    return {opt for p in command.params for opt in p.opts}


SHARED = {
    "architecture": ({"--config", "--gguf"}, ["ctxlab plan", "ctxlab simulate"]),
    "device": (
        {"--device", "--device-flops", "--device-bandwidth", "--device-memory", "--gpus"},
        ["ctxlab plan", "ctxlab simulate"],
    ),
    "weights": ({"--weights-bytes", "--reserve-bytes"}, ["ctxlab plan", "ctxlab simulate"]),
    "page size": (
        {"--page-size", "--block-size"},
        ["ctxlab plan", "ctxlab simulate", "ctxlab generate", "ctxlab profile"],
    ),
    "model": (
        {"--model"},
        ["ctxlab generate", "ctxlab eval", "ctxlab eval perplexity", "ctxlab profile",
         "ctxlab simulate", "ctxlab eval lost-in-middle", "ctxlab eval attention"],
    ),
    "rope scaling": (
        {"--rope-scaling"}, ["ctxlab generate", "ctxlab eval", "ctxlab serve"],
    ),
    "json": (
        {"--json"},
        ["ctxlab plan", "ctxlab simulate", "ctxlab generate", "ctxlab eval", "ctxlab profile",
         "ctxlab policies", "ctxlab eval summarize", "ctxlab eval perplexity"],
    ),
}  # fmt: skip


@pytest.mark.parametrize("concept", SHARED)
def test_one_flag_per_concept_across_commands(concept):
    flags, paths = SHARED[concept]
    for path in paths:
        assert flags <= _flags(path), f"{path} lacks {flags - _flags(path)} ({concept})"


def test_same_option_object_means_same_help():
    """The shared flags carry the same help text wherever they appear."""
    helps: dict[str, set[str]] = {}
    for path, command in COMMANDS:
        # --model there names a server's model (vLLM's), not a model file ctxlab loads
        remote = path.startswith(("ctxlab bench", "ctxlab probe"))
        for p in command.params:
            if remote and "--model" in p.opts:
                continue
            shared = ("--device-flops", "--page-size", "--model", "--rope-scaling")
            if any(flag in p.opts for flag in shared):
                helps.setdefault(p.opts[0], set()).add(p.help or "")
    assert all(len(texts) == 1 for texts in helps.values()), helps


def test_old_device_names_still_work_but_are_hidden(cli):
    new = cli("plan", "llama-3.1-8b", "--device-memory", "141GiB", "--json")
    old = cli("plan", "llama-3.1-8b", "--memory-bytes", "141GiB", "--json")
    assert new.code == old.code == 0 and new.out == old.out
    assert "--memory-bytes" not in cli("plan", "--help").out
    both = cli("plan", "llama-3.1-8b", "--device-memory", "1GiB", "--memory-bytes", "1GiB")
    assert both.code == 2 and "not both" in both.err


def test_simulate_takes_the_preset_like_plan_and_keeps_arch(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    positional = cli("simulate", "synthetic:n=30", "llama-3.1-8b", "--json")
    alias = cli("simulate", "synthetic:n=30", "--arch", "llama-3.1-8b", "--json")
    assert positional.code == alias.code == 0
    assert positional.out == alias.out


def test_block_size_is_an_alias_of_page_size(cli):
    a = cli("plan", "llama-3.1-8b", "--page-size", "64", "--json")
    b = cli("plan", "llama-3.1-8b", "--block-size", "64", "--json")
    assert a.code == b.code == 0 and a.out == b.out


def test_default_model_shows_its_readable_name(cli):
    for path in ("generate", "eval", "profile"):
        assert "SmolLM2-135M-Instruct" in cli(*path.split(), "--help").out


def test_costs_print_their_currency(cli):
    result = cli(
        "plan", "llama-3.1-8b", "--price-input", "3", "--price-output", "15", "--currency", "EUR"
    )
    assert result.code == 0 and " EUR" in result.out
    assert "per request, in EUR" in " ".join(result.out.split())


def test_typo_costs_no_torch_import():
    """Checks that need no model run before torch is imported (it alone takes seconds): each
    bad flag is one sentence and exit 2, and torch is still not imported after all of them."""
    code = (
        "import contextlib, io, json, sys\n"
        "from ctxlab.cli import main\n"
        "errors = []\n"
        "for argv in (['generate', 'hi', '--kv-format', 'int3'],\n"
        "             ['generate', 'hi', '--temperature', '-1'],\n"
        "             ['generate', 'hi', '--page-size', '0'],\n"
        "             ['generate', 'hi', '--policy', 'snapkvv'],\n"
        "             ['generate', 'hi', '--policy', 'snapkv', '--budget', '-5'],\n"
        "             ['generate', 'hi', '--policy', 'snapkv', '--budget', '2.0'],\n"
        "             ['generate', 'hi', '--policy', 'knorm', '--budget', 'lots'],\n"
        "             ['generate', '--file', '.'],\n"
        "             ['profile', '--out', '.'],\n"
        "             ['eval', 'perplexity', '--tokens', '10']):\n"
        "    sys.argv = ['ctxlab', *argv]\n"
        "    err = io.StringIO()\n"
        "    try:\n"
        "        with contextlib.redirect_stderr(err):\n"
        "            main()\n"
        "    except SystemExit as exc:\n"
        "        assert exc.code == 2, argv\n"
        "    errors.append(err.getvalue())\n"
        "print(json.dumps({'torch': 'torch' in sys.modules, 'errors': errors}))\n"
    )
    import json
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["torch"] is False
    for err in result["errors"]:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "policy 'snapkvv' is unknown; choose one of full," in result["errors"][3]


def test_usage_error_is_short(cli):
    """A word where a number goes is click's usage error: one sentence, no traceback (a fresh
    process prints the same: tests/plan/test_plan_cli.py runs one)."""
    result = cli("plan", "--gpus", "many")
    assert result.code == 2 and "Traceback" not in result.err


@pytest.mark.parametrize("policy", ["quant", "full"])
def test_a_budget_for_a_policy_that_takes_none_is_refused_before_the_model(policy):
    from ctxlab.commands.options import EngineOptions
    from ctxlab.errors import CtxlabError

    with pytest.raises(CtxlabError, match="takes no budget"):
        EngineOptions(policy=policy, budget="256").check()

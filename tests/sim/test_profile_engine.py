"""`simulate --profile` takes the probed server's page size, pool and device from the profile
(each value printed), unless an option says otherwise."""

from __future__ import annotations

import json

from ctxlab.sim.steptime import PROFILE_FORMAT
from tests.cli.conftest import run_in_process


def _profile(path, engine: dict, device: str = "vllm 0.32.0 at http://127.0.0.1:8000") -> str:
    steps = []
    for pt, dt, ctx in [(512, 0, 0), (256, 4, 1000), (0, 8, 3000), (1024, 2, 500), (0, 1, 10)]:
        pk, dk = pt * (pt + 1) // 2, dt * (ctx + 1)
        secs = 0.002 + 1e-5 * pt + 2e-9 * pk + 3e-5 * dt + 1e-8 * dk
        steps.append(
            {"prefill_tokens": pt, "prefill_keys": pk, "decode_tokens": dt, "decode_keys": dk,
             "seconds": secs}
        )  # fmt: skip
    doc = {"format": PROFILE_FORMAT, "device": device, "engine": engine, "steps": steps}
    path.write_text(json.dumps(doc))
    return str(path)


def _simulate(monkeypatch, capsys, tmp_path, *extra: str):
    return run_in_process(
        monkeypatch, capsys, "simulate", "synthetic:n=20", "llama-3.1-8b",
        "--out", str(tmp_path / "out"), *extra,
    )  # fmt: skip


def test_profile_engine_settings_are_applied_and_printed(monkeypatch, capsys, tmp_path):
    prof = _profile(tmp_path / "p.json", {"block_size": 128, "pool_tokens": 46592})
    r = _simulate(monkeypatch, capsys, tmp_path, "--profile", prof)
    assert r.code == 0, r.err
    assert "from the profile: page size 128 tokens" in r.err
    assert "from the profile: KV pool 46,592 tokens" in r.err
    assert "steps measured on vllm 0.32.0" in r.out and "x h100" not in r.out


def test_an_option_given_wins_over_the_profile(monkeypatch, capsys, tmp_path):
    prof = _profile(tmp_path / "p.json", {"block_size": 128, "pool_tokens": 46592})
    r = _simulate(monkeypatch, capsys, tmp_path, "--profile", prof, "--page-size", "16")
    assert r.code == 0, r.err
    assert "page size 128" not in r.err and "KV pool 46,592 tokens" in r.err


def test_a_profile_without_engine_settings_changes_nothing(monkeypatch, capsys, tmp_path):
    prof = _profile(tmp_path / "p.json", {"block_size": None, "pool_tokens": None})
    r = _simulate(monkeypatch, capsys, tmp_path, "--profile", prof)
    assert r.code == 0, r.err
    assert "from the profile" not in r.err


def test_the_pool_from_the_profile_changes_the_prediction(monkeypatch, capsys, tmp_path):
    """A 16,384-token pool must evict and preempt where the default pool does not."""
    prof = _profile(tmp_path / "p.json", {"block_size": 16, "pool_tokens": None})
    small = _profile(tmp_path / "s.json", {"block_size": 16, "pool_tokens": 16384})
    a = _simulate(monkeypatch, capsys, tmp_path, "--profile", prof, "--json")
    b = _simulate(monkeypatch, capsys, tmp_path, "--profile", small, "--json")
    assert a.code == 0 and b.code == 0, (a.err, b.err)
    ja, jb = json.loads(a.out), json.loads(b.out)
    assert jb["evictions"] + jb["preemptions"] > ja["evictions"] + ja["preemptions"]


def test_scheduling_limits_in_vllm_names_are_applied(monkeypatch, capsys, tmp_path):
    engine = {"block_size": 16, "max_num_seqs": 4, "max_num_batched_tokens": 512}
    prof = _profile(tmp_path / "p.json", engine)
    r = _simulate(monkeypatch, capsys, tmp_path, "--profile", prof, "--json")
    assert r.code == 0, r.err
    assert "at most 4 requests at once" in r.err and "at most 512 tokens a step" in r.err
    assert json.loads(r.out)["peak_running_requests"] <= 4


def test_the_command_the_probe_prints_runs(monkeypatch, capsys, tmp_path):
    import shlex

    from ctxlab.commands.probe import simulate_command

    prof = _profile(tmp_path / "p.json", {"block_size": 128, "pool_tokens": 46592})
    cmd = shlex.split(simulate_command("smollm2-135m", prof))
    assert cmd[:2] == ["ctxlab", "simulate"]
    args = [a if a != "out/simulate-probe" else str(tmp_path / "o") for a in cmd[1:]]
    r = run_in_process(monkeypatch, capsys, *args)
    assert r.code == 0, r.err
    assert "from the profile: page size 128 tokens" in r.err

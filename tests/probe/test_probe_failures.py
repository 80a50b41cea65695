"""Bad input and broken servers: one sentence each, the documented exit code, and the
sections finished before a server died kept in the report.

`ctxlab probe` runs in this process through the CLI's own entry point (`cli`); one test runs
the installed `ctxlab` script in its own process, as a user's shell does."""

from __future__ import annotations

import pytest

from tests.peers.hostile import Script as Hostile
from tests.peers.hostile import good_events, hostile
from tests.probe.conftest import Script, free_port, probe_cli, report, stand_in


def test_unreachable_url_is_one_sentence(tmp_path):
    """The smoke test of the installed script: a fresh process, as a user runs it."""
    res = probe_cli(
        "--server", f"http://127.0.0.1:{free_port()}", "--out", str(tmp_path / "p.json")
    )
    assert res.returncode == 2
    assert res.stderr.strip().startswith("error: cannot reach http://127.0.0.1:")
    assert "Traceback" not in res.stderr


def test_url_with_no_scheme_is_refused_and_v1_names_the_root(cli, tmp_path):
    res = cli("probe", "--server", "127.0.0.1:8000", "--out", str(tmp_path / "p.json"))
    assert res.code == 2 and res.err.startswith("error: --server"), res.err
    res = cli("probe", "--server", "http://127.0.0.1:1/v1", "--out", str(tmp_path / "p.json"))
    assert res.code == 2 and res.err.startswith("error: cannot reach http://127.0.0.1:1:"), res.err


def test_wrong_key_is_401(cli, tmp_path):
    with stand_in(Script(status=401)) as url:
        res = cli(
            "probe", "--server", url, "--api-key", "sk-wrong-key", "--out", str(tmp_path / "p.json")
        )
    assert res.code == 2
    assert "refused the API key (HTTP 401)" in res.err
    assert "sk-wrong-key" not in res.err


def test_not_openai_compatible(cli, tmp_path):
    with stand_in(Script(models_body="<html>hello</html>")) as url:
        res = cli("probe", "--server", url, "--out", str(tmp_path / "p.json"))
    assert res.code == 2
    assert "is not an OpenAI-compatible server" in res.err


def test_model_it_does_not_serve(cli, tmp_path):
    with stand_in(Script()) as url:
        res = cli("probe", "--server", url, "--model", "gpt-x", "--out", str(tmp_path / "p.json"))
    assert res.code == 2
    assert "does not serve model 'gpt-x'; it serves m" in res.err


VLLM_MODELS = '{"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "vllm"}]}'


@pytest.mark.parametrize("vllm", [False, True], ids=["any server", "a vLLM"])
def test_server_that_dies_mid_run_keeps_partial_results(cli, tmp_path, vllm):
    """A server (also one that identifies as vLLM: /version, owned_by) that closes after six
    completions: exit 3, one sentence naming the report, the report kept."""
    out = tmp_path / "p.json"
    who = {"models_body": VLLM_MODELS, "version": "0.32.0"} if vllm else {}
    with stand_in(Script(die_after=6, **who)) as url:
        res = cli("probe", "--server", url, "--sections", "prefix,isolation", "--longest", "40",
                  "--out", str(out))  # fmt: skip
    assert res.code == 3, res.err
    last = res.err.strip().splitlines()[-1]
    assert last.startswith("error: the server at http://127.0.0.1:")
    assert "stopped answering" in last and str(out) in last
    doc = report(out)
    assert doc["complete"] is False and doc["error"]
    assert doc["sent"]["requests"] >= 6
    assert doc["token_rule"].startswith("prompt tokens = words + 0")
    assert doc["server"]["engine"] == ("vllm" if vllm else "unknown")


def test_budget_caps_are_announced_and_kept(cli, tmp_path):
    out = tmp_path / "p.json"
    with stand_in(Script()) as url:
        res = cli("probe", "--server", url, "--sections", "prefix", "--max-requests", "10",
                  "--out", str(out))  # fmt: skip
    assert res.code == 0, res.err
    assert "it will send at most 10 requests" in res.err
    doc = report(out)
    assert doc["sent"]["requests"] <= 10
    assert "prefix" in doc["not_run"]


def _salted(garbage):
    """Answers well until the isolation section (its requests carry a cache_salt)."""
    return lambda body: garbage(body) if "cache_salt" in body else good_events(body)


def _usage_list(body):
    return [*good_events(body)[:2], {"choices": [], "usage": [1, 2]}]


HOSTILE_MID_RUN = {
    "data a list": (Hostile(events=_salted(lambda b: [[1, 2]])), "not a JSON object"),
    "usage a list": (Hostile(events=_salted(_usage_list)), "usage"),
    "HTTP 400": (
        Hostile(status_for=lambda b: 400 if "cache_salt" in b else 200),
        "refused a probe request (HTTP 400: scripted failure)",
    ),
    "HTTP 500": (
        Hostile(status_for=lambda b: 500 if "cache_salt" in b else 200),
        "stopped answering",
    ),
}


@pytest.mark.parametrize("mode", sorted(HOSTILE_MID_RUN))
def test_a_hostile_answer_mid_run_keeps_the_sections_before_it(cli, tmp_path, mode):
    """The calibration and the prefix section are answered; the isolation section gets
    garbage or an HTTP error: the report keeps the prefix section, marks isolation as failed
    with the reason, lists capacity as not run, and the run exits 3 with one sentence."""
    script, phrase = HOSTILE_MID_RUN[mode]
    out = tmp_path / "p.json"
    with hostile(script) as (url, _):
        res = cli("probe", "--server", url, "--sections", "prefix,isolation,capacity",
                  "--longest", "40", "--yes", "--out", str(out))  # fmt: skip
    assert res.code == 3, res.err
    assert "Traceback" not in res.err
    last = res.err.strip().splitlines()[-1]
    assert last.startswith("error: ") and phrase in last and str(out) in last, last
    doc = report(out)
    assert doc["complete"] is False and phrase in doc["error"]
    assert [f["name"] for f in doc["sections"]["prefix caching"]]  # measured before it
    assert "isolation" not in doc["sections"]
    assert list(doc["failed"]) == ["isolation"] and phrase in doc["failed"]["isolation"]
    assert doc["not_run"] == {"capacity": "the run ended in the isolation section, before it"}
    assert doc["token_rule"].startswith("prompt tokens = words + 0")


def test_vllm_without_prompt_token_details_names_the_flag(cli, tmp_path):
    """vLLM's default (no --enable-prompt-tokens-details) reports no cached tokens: the probe
    still finishes (exit 0), says the cache figures are inferred from time or not
    measurable, and names the flag that would make vLLM report them."""
    out = tmp_path / "p.json"
    with stand_in(Script(models_body=VLLM_MODELS, version="0.32.0", cached_details=False)) as url:
        res = cli("probe", "--server", url, "--sections", "prefix,isolation", "--longest", "40",
                  "--yes", "--out", str(out))  # fmt: skip
    assert res.code == 0, res.err
    doc = report(out)
    assert doc["server"]["engine"] == "vllm"
    figs = {f["name"]: f for fs in doc["sections"].values() for f in fs}
    flagged = [f for f in figs.values() if "--enable-prompt-tokens-details" in f["note"]]
    assert flagged, figs
    assert all(f["how"] != "measured" for f in flagged)
    assert figs["cache granularity"]["value"] is None
    assert "--enable-prompt-tokens-details" in res.out + res.err

"""Bad input and broken servers: one sentence each, the documented exit code, and the
sections finished before a server died kept in the report."""

from __future__ import annotations

from tests.probe.conftest import Script, free_port, probe_cli, report, stand_in


def test_unreachable_url_is_one_sentence(tmp_path):
    res = probe_cli(
        "--server", f"http://127.0.0.1:{free_port()}", "--out", str(tmp_path / "p.json")
    )
    assert res.returncode == 2
    assert res.stderr.strip().startswith("error: cannot reach http://127.0.0.1:")
    assert "Traceback" not in res.stderr


def test_url_with_v1_or_no_scheme_is_refused(tmp_path):
    for url in ("http://127.0.0.1:1/v1", "127.0.0.1:8000"):
        res = probe_cli("--server", url, "--out", str(tmp_path / "p.json"))
        assert res.returncode == 2 and res.stderr.startswith("error: --server"), res.stderr


def test_wrong_key_is_401(tmp_path):
    with stand_in(Script(status=401)) as url:
        res = probe_cli(
            "--server", url, "--api-key", "sk-wrong-key", "--out", str(tmp_path / "p.json")
        )
    assert res.returncode == 2
    assert "refused the API key (HTTP 401)" in res.stderr
    assert "sk-wrong-key" not in res.stderr


def test_not_openai_compatible(tmp_path):
    with stand_in(Script(models_body="<html>hello</html>")) as url:
        res = probe_cli("--server", url, "--out", str(tmp_path / "p.json"))
    assert res.returncode == 2
    assert "is not an OpenAI-compatible server" in res.stderr


def test_model_it_does_not_serve(tmp_path):
    with stand_in(Script()) as url:
        res = probe_cli("--server", url, "--model", "gpt-x", "--out", str(tmp_path / "p.json"))
    assert res.returncode == 2
    assert "does not serve model 'gpt-x'; it serves m" in res.stderr


def test_server_that_dies_mid_run_keeps_partial_results(tmp_path):
    out = tmp_path / "p.json"
    with stand_in(Script(die_after=6)) as url:
        res = probe_cli("--server", url, "--sections", "prefix,isolation", "--longest", "40",
                        "--out", str(out))  # fmt: skip
    assert res.returncode == 3, res.stderr
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("error: the server at http://127.0.0.1:")
    assert "stopped answering" in last and str(out) in last
    doc = report(out)
    assert doc["complete"] is False and doc["error"]
    assert doc["sent"]["requests"] >= 6
    assert doc["token_rule"].startswith("prompt tokens = words + 0")


def test_budget_caps_are_announced_and_kept(tmp_path):
    out = tmp_path / "p.json"
    with stand_in(Script()) as url:
        res = probe_cli("--server", url, "--sections", "prefix", "--max-requests", "10",
                        "--out", str(out))  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "it will send at most 10 requests" in res.stderr
    doc = report(out)
    assert doc["sent"]["requests"] <= 10
    assert "prefix" in doc["not_run"]

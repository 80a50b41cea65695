"""`ctxlab workshop --server` and `[[servers]]` on bad input: one sentence each, exit 2 for a
user's mistake before the model loads, exit 3 with the partial report kept when a server
stops answering mid-run (scripted stand-ins: a real server is hard to break on demand).

The workshop runs in this process through the CLI's own entry point (`cli`); one test runs
the installed `ctxlab` script in its own process, as a user's shell does."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.cli.conftest import Result
from tests.peers import hostile
from tests.probe.conftest import Script, free_port, installed, stand_in


def one_sentence(res: Result, code: int = 2) -> str:
    assert res.code == code, res.err[-2000:]
    assert "Traceback" not in res.err
    last = res.err.strip().splitlines()[-1]
    assert last.startswith("error: ")
    return last


def test_unreachable_server(tmp_path):
    """The smoke test of the installed script: a fresh process, as a user runs it."""
    url = f"http://127.0.0.1:{free_port()}"
    proc = installed("workshop", "--server", url, "--only", "1", "--out", str(tmp_path))
    line = one_sentence(Result(proc.returncode, proc.stdout, proc.stderr))
    assert line.startswith(f"error: cannot reach {url}")


def test_wrong_key(cli, tmp_path):
    with stand_in(Script(status=401)) as url:
        res = cli("workshop", "--server", url, "--api-key", "sk-wrong", "--out", str(tmp_path))
    line = one_sentence(res)
    assert "refused the API key (HTTP 401)" in line and "sk-wrong" not in res.err


def test_not_openai_compatible(cli, tmp_path):
    with stand_in(Script(models_body="<html>hello</html>")) as url:
        line = one_sentence(cli("workshop", "--server", url, "--out", str(tmp_path)))
    assert "is not an OpenAI-compatible server" in line


def test_model_it_does_not_serve(cli, tmp_path):
    with stand_in(Script()) as url:
        res = cli("workshop", "--server", url, "--server-model", "gpt-x", "--out", str(tmp_path))
    assert "does not serve model 'gpt-x'; it serves m" in one_sentence(res)


def _config(tmp_path: Path, body: str) -> str:
    path = tmp_path / "servers.toml"
    path.write_text(body)
    return str(path)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ('[[servers]]\nlabel = "a"\nurl = "http://127.0.0.1:1"\n'
         '[[servers]]\nlabel = "a"\nurl = "http://127.0.0.1:2"\n',
         "servers: label 'a' is given to two servers; labels must differ."),
        ('[[servers]]\nlabel = "a"\n', "key 'servers[0].url' is missing."),
        ('[[servers]]\nlabel = "a"\nurl = "127.0.0.1:8000"\napi_key = "sk-x"\n',
         "servers[0].url = '127.0.0.1:8000': '127.0.0.1:8000' must be an http(s) URL"),
        ('[[servers]]\nlabel = "a"\nurl = "http://127.0.0.1:1"\ntimeout = 0\n',
         "servers[0].timeout = 0: must be more than 0 and at most 86400 seconds (a day)."),
        ('[[servers]]\nlabel = "a"\nurl = "http://127.0.0.1:1"\ntimeout = 1e9\n',
         "servers[0].timeout = 1000000000.0: must be more than 0 and at most 86400 seconds"),
    ],
    ids=["duplicate-label", "missing-url", "bad-url", "timeout-0", "timeout-1e9"],
)  # fmt: skip
def test_bad_servers_list(cli, tmp_path, body, expected):
    path = _config(tmp_path, body)
    res = cli("workshop", path, "--out", str(tmp_path / "out"))
    line = one_sentence(res)
    assert line.startswith(f"error: {path}: ") and expected in line
    assert "sk-x" not in res.err


def test_one_bad_server_of_several_is_named(cli, tmp_path):
    with stand_in(Script()) as good:
        bad = f"http://127.0.0.1:{free_port()}"
        body = (
            f'[[servers]]\nlabel = "ok"\nurl = "{good}"\n'
            f'[[servers]]\nlabel = "gone"\nurl = "{bad}"\n'
        )
        line = one_sentence(cli("workshop", _config(tmp_path, body), "--out", str(tmp_path / "o")))
    assert line.startswith(f"error: [[servers]] 'gone': cannot reach {bad}")


@pytest.mark.model
def test_server_that_dies_mid_run_keeps_the_report(cli, tmp_path, keep_torch_threads):
    # the stand-in answers the setup (cached-token check, the staircase at 64 tokens and,
    # since it reports no cached tokens, again at 300, the probe summary: 70 requests) and
    # two of demonstration 1's, then closes
    with stand_in(Script(die_after=72)) as url:
        res = cli("workshop", "--server", url, "--quick", "--only", "1,2", "--out", str(tmp_path))
    line = one_sentence(res, 3)
    assert line.startswith(f"error: the server at {url} stopped answering in demonstration 1")
    assert str(tmp_path) in line
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["error"].startswith(f"the server at {url} stopped answering")
    demos = results["demos"]
    assert demos["prefix_miss"]["status"] == demos["warm_prefix"]["status"] == "not measurable"
    assert "not run: the server" in demos["warm_prefix"]["summary"]
    # what was measured before it died is kept: the server's probe summary
    assert results["servers"][0]["info"]["url"] == url
    assert "stopped early" in (tmp_path / "report.md").read_text()


@pytest.mark.model
def test_server_that_hangs_ends_at_server_timeout(cli, tmp_path, keep_torch_threads):
    """A server that lists its model and then accepts every completion and never answers:
    --server-timeout bounds each request, and the run stops early (exit 3) with its report."""
    with hostile.hostile(hostile.Script(hang="silent")) as (url, script):
        start = time.monotonic()
        res = cli("workshop", "--server", url, "--server-timeout", "2", "--quick", "--only", "1",
                  "--out", str(tmp_path))  # fmt: skip
        took = time.monotonic() - start
    assert took < 60, took  # the model loads once per session; the wait is the 2 s
    line = one_sentence(res, 3)
    assert line.startswith(
        f"error: the server at {url} stopped answering before the first demonstration, while "
        "its page size was measured"
    )  # ("stopped answering before (...)" named nothing)
    assert "within 2 s" in line
    assert script.posts.count("/v1/completions") == 1  # nothing after the first silence
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["status"] == "stopped early" and "stopped answering" in results["error"]
    assert results["demos"]["prefix_miss"]["status"] == "not measurable"
    report = (tmp_path / "report.md").read_text()
    assert "stopped answering" in report and "**Status: STOPPED EARLY**" in report
    assert "no demonstration went through it" in report  # not "demonstrations none went"


def test_server_timeout_reaches_every_client(tmp_path):
    """--server-timeout, else `[[servers]] timeout`, else 600 s, for each client of the run."""
    from ctxlab.commands.workshop import _run
    from ctxlab.workshop.config_file import load_config
    from ctxlab.workshop.server_chat import ServerChatBackend
    from ctxlab.workshop.server_eviction import _client

    with hostile.hostile() as (url, _):
        path = _config(tmp_path, f'[[servers]]\nlabel = "a"\nurl = "{url}"\ntimeout = 7.5\n'
                       f'[[servers]]\nlabel = "b"\nurl = "{url}"\n')  # fmt: skip
        cfg = load_config(Path(path))
        seen: list[tuple[str, float, float, float]] = []

        def run_workshop(*_a, servers, **_k):
            for name, s in servers:
                chat = ServerChatBackend(s, None, 2048, 16)
                seen.append((name, s.client.timeout, _client(s, 1, 1).timeout, chat.timeout_s))
                chat.close()
            return {}

        import ctxlab.workshop.runner as runner

        loaded = type(
            "Loaded", (), {"tokenizer": None, "config": type("C", (), {"vocab_size": 49152})}
        )
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(runner, "run_workshop", run_workshop)
            mp.setattr(runner, "load_default_model", lambda _cfg: loaded)
            _run(cfg, tmp_path, True, {1}, "x", (None, None, None, None))
            assert seen == [("a", 7.5, 7.5, 7.5), ("b", 600.0, 600.0, 600.0)]
            seen.clear()
            _run(cfg, tmp_path, True, {1}, "x", (None, None, None, 3.0))
            assert seen == [("a", 3.0, 3.0, 3.0), ("b", 3.0, 3.0, 3.0)]
            seen.clear()
            _run(cfg, tmp_path, True, {1}, "x", (url, None, None, 2.0))
            assert seen == [("server", 2.0, 2.0, 2.0)]


@pytest.mark.model
def test_vllm_without_prompt_token_details_names_the_flag(cli, tmp_path, keep_torch_threads):
    """A vLLM started without --enable-prompt-tokens-details (its default): the run finishes
    (exit 0), and every demonstration that needs cached-token counts is "not measurable" with
    the flag that would make vLLM report them."""
    models = '{"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "vllm"}]}'
    with stand_in(Script(models_body=models, version="0.32.0", cached_details=False)) as url:
        res = cli("workshop", "--server", url, "--quick", "--only", "1", "--out", str(tmp_path))
    assert res.code == 0, res.err[-2000:]
    demo = json.loads((tmp_path / "results.json").read_text())["demos"]["prefix_miss"]
    assert demo["status"] == "not measurable", demo["status"]
    assert "--enable-prompt-tokens-details" in demo["summary"], demo["summary"]

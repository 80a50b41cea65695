"""`ctxlab serve` refuses bad options with one sentence (exit 2) before the model loads, and
the API-key file is checked line by line."""

from __future__ import annotations

import socket

import pytest
from typer.testing import CliRunner

from ctxlab.cli import app
from ctxlab.errors import CtxlabError
from ctxlab.serve.tenants import Tenants, cache_salt
from tests.servers import installed


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--policy", "nope"], "policy 'nope' is unknown"),
        (["--budget", "0.5"], "--budget needs a --policy"),
        (["--policy", "snapkv", "--budget", "16"], "too small for snapkv"),
        (["--kv-format", "int4"], "--kv-format 'int4' is unknown"),
        (["--port", "70000"], "--port must be 0..65535"),
        (["--max-waiting", "0"], "--max-waiting must be at least 1"),
        (["--request-timeout", "0"], "--request-timeout must be positive"),
        (["--metrics-prefix", "prom"], "--metrics-prefix 'prom' is unknown"),
        (["--api-keys", "/nonexistent/keys.toml"], "does not exist"),
    ],
)
def test_bad_options_fail_before_the_model_loads(args, needle):
    res = CliRunner().invoke(app, ["serve", *args])
    assert isinstance(res.exception, CtxlabError), res.output
    assert needle in str(res.exception)


def test_a_taken_port_is_one_sentence_and_exit_2():
    """The smoke test of the installed script: a fresh process, as a user runs it."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = str(taken.getsockname()[1])
        res = installed("serve", "--port", port, timeout=120)
    assert res.returncode == 2
    assert res.stderr.strip().startswith(f"error: cannot listen on 127.0.0.1:{port}")
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize(
    "text,needle",
    [
        ("keys = 3", "needs a [keys] table"),
        ('[keys]\n"sk-long-enough" = ""', "must be a non-empty string"),
        ('[keys]\n"short" = "a"', "shorter than 8 characters"),
        ('[keys]\n"sk-long-enough" = "a"\n[other]\nx = 1', "unknown table or key 'other'"),
        ("[keys", "is not valid TOML"),
    ],
)
def test_key_file_checks(tmp_path, text, needle):
    path = tmp_path / "keys.toml"
    path.write_text(text)
    with pytest.raises(CtxlabError, match=needle.replace("[", r"\[")):
        Tenants.load(path)


def test_salts_of_tenants_never_collide():
    assert cache_salt(None, "x") == "x" and cache_salt(None, None) is None
    salts = {cache_salt(t, s) for t in ("a", "b", "a:b") for s in (None, "b", "x")}
    assert len(salts) == 9

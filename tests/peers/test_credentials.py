"""Credentials leak: a server URL may carry a password (`http://user:SECRET@host`); no
command that takes a URL prints it or writes it, whether the server answers, refuses or
cannot be reached."""

from __future__ import annotations

import socket
import string
from pathlib import Path
from urllib.parse import quote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ctxlab.peer.url import base_url, public, redact
from tests.peers.commands import COMMANDS, argv
from tests.peers.hostile import Script, hostile, with_secret

SECRET = "Pw-7f3e9c-SECRET"


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _assert_nowhere(result, folder: Path) -> None:
    assert SECRET not in result.out and SECRET not in result.err
    assert "Traceback" not in result.err
    for path in folder.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path


@pytest.mark.parametrize("name", COMMANDS)
@pytest.mark.parametrize("server", ["answers", "refuses", "unreachable"])
def test_no_command_prints_or_writes_the_password(cli, tmp_path, rag_db, name, server):
    if server == "unreachable":
        result = cli(*argv(name, with_secret(f"http://127.0.0.1:{_closed_port()}", SECRET),
                           tmp_path, rag_db))  # fmt: skip
        assert result.code == 2 and "127.0.0.1" in result.err
    else:
        script = Script(key="right-key" if server == "refuses" else None)
        with hostile(script) as (url, _):
            result = cli(*argv(name, with_secret(url, SECRET), tmp_path, rag_db))
        if server == "refuses":
            assert result.code == 2 and "401" in result.err + result.out
        else:
            assert result.code == 0, result.err
    _assert_nowhere(result, tmp_path)


def test_workshop_server_that_cannot_be_reached_is_named_without_its_password(cli, tmp_path):
    url = with_secret(f"http://127.0.0.1:{_closed_port()}", SECRET)
    result = cli("workshop", "--server", url, "--out", str(tmp_path / "w"))
    assert result.code == 2 and "cannot reach http://127.0.0.1" in result.err
    _assert_nowhere(result, tmp_path)


def test_a_bad_url_is_refused_without_its_password(cli, tmp_path):
    url = f"http://alice:{SECRET}@127.0.0.1:99999"
    for args in (("bench", "serve", "--base-url", url, "--model", "m"),
                 ("probe", "--server", url, "--out", str(tmp_path / "p.json"))):  # fmt: skip
        result = cli(*args)
        assert result.code == 2 and "bad port" in result.err, result.err
        _assert_nowhere(result, tmp_path)


def test_workshop_servers_are_written_without_their_password(tmp_path):
    """`[[servers]]` goes into results.json through the config's dump."""
    from ctxlab.workshop.config_file import load_config

    path = tmp_path / "w.toml"
    path.write_text(
        f'[[servers]]\nlabel = "a"\nurl = "http://bob:{SECRET}@gpu-box:8000/v1"\n'
        'api_key = "k-SECRET"\n',
        encoding="utf-8",
    )
    cfg = load_config(path)
    assert SECRET in cfg.servers[0].url  # the requests still carry it
    dumped = cfg.model_dump_json()
    assert SECRET not in dumped and "k-SECRET" not in dumped
    assert "http://***@gpu-box:8000" in dumped


_PART = st.text(string.ascii_letters + string.digits + string.punctuation + " ", max_size=12)


@given(user=_PART, password=_PART, path=st.sampled_from(["", "/", "/v1", "/base/v1/"]))
def test_redact_hides_any_userinfo(user, password, path):
    url = f"http://{quote(user, safe='')}:{quote('Z9' + password, safe='')}@gpu.example:8443{path}"
    for shown in (redact(f"cannot reach {url} (refused)"), public(url), redact(base_url(url))):
        assert quote("Z9" + password, safe="") not in shown.replace("gpu.example", "")
        assert "gpu.example:8443" in shown
    assert redact(url).startswith("http://***@gpu.example:8443")


@pytest.mark.parametrize("name", COMMANDS)
@pytest.mark.parametrize("where", ["?api_key=", "?token=a&key=", "#"])
def test_a_key_in_the_query_string_is_refused_without_being_shown(cli, tmp_path, rag_db, name,
                                                                  where):  # fmt: skip
    """A URL with a query or fragment is refused (ctxlab adds its own paths); the sentence
    that says so shows the query as `?***`, since a key is often passed there."""
    result = cli(*argv(name, f"http://127.0.0.1:{_closed_port()}/{where}{SECRET}", tmp_path,
                       rag_db))  # fmt: skip
    assert result.code == 2 and "must not have a query or fragment" in result.err, result.err
    _assert_nowhere(result, tmp_path)


@given(key=_PART, mark=st.sampled_from("?#"), path=st.sampled_from(["", "/", "/v1/models"]))
def test_redact_hides_any_query_or_fragment(key, mark, path):
    secret = quote("Z9" + key, safe="")
    text = f"error: --server 'http://gpu.example:8443{path}{mark}k={secret}' is refused"
    shown = redact(text)
    assert secret not in shown.replace("gpu.example", "")
    assert f"http://gpu.example:8443{path}{mark}***" in shown


@pytest.mark.parametrize("name", COMMANDS)
@pytest.mark.parametrize("key", [f"{SECRET}\r\nX-Injected: 1", f"{SECRET}-clé", f"{SECRET} x"])
def test_a_key_a_header_cannot_carry_is_one_sentence_that_does_not_show_it(
    cli, tmp_path, rag_db, name, key
):
    """A key with a line break was quoted whole in httpx's refusal (printed); one with an
    accented letter was a UnicodeEncodeError traceback. Now: one sentence, exit 2, the key
    nowhere, and nothing sent."""
    with hostile(Script(key="right")) as (url, script):
        result = cli(*argv(name, url, tmp_path, rag_db), "--api-key", key)
    assert result.code == 2, (result.out, result.err)
    assert "that ctxlab does not send in a header" in result.err_lines[-1], result.err
    _assert_nowhere(result, tmp_path)
    assert script.auth == []


def test_workshop_refuses_such_a_key_from_the_flag_and_the_config(cli, tmp_path):
    bad = f"{SECRET}\nX: 1"
    result = cli("workshop", "--server", "http://127.0.0.1:9", "--api-key", bad,
                 "--out", str(tmp_path / "w"))  # fmt: skip
    assert result.code == 2 and "that ctxlab does not send in a header" in result.err, result.err
    config = tmp_path / "w.toml"
    config.write_text(
        f'[[servers]]\nlabel = "a"\nurl = "http://127.0.0.1:9"\napi_key = "{SECRET}\\u00e9"\n',
        encoding="utf-8",
    )
    result = cli("workshop", str(config), "--out", str(tmp_path / "w2"))
    assert result.code == 2 and "that ctxlab does not send in a header" in result.err, result.err
    _assert_nowhere(result, tmp_path / "w2")


@given(st.text(max_size=20))
def test_check_key_accepts_exactly_what_a_header_carries(key):
    from ctxlab.errors import CtxlabError
    from ctxlab.peer.key import bearer, check_key

    fits = all(0x21 <= ord(ch) <= 0x7E for ch in key)
    try:
        assert check_key(key) == key and fits
        assert bearer(key) == ({"Authorization": f"Bearer {key}"} if key else {})
    except CtxlabError as exc:
        assert not fits
        # the message tells where the bad character is, never what the key holds: the same
        # key with its printable characters replaced gets the same message (a bare "key not
        # in message" fails on keys like " sh", which the fixed text "shown" contains)
        masked = "".join("x" if 0x21 <= ord(ch) <= 0x7E else ch for ch in key)
        with pytest.raises(CtxlabError) as other:
            check_key(masked)
        assert str(other.value) == str(exc)

"""`ctxlab lab` as a user runs it: a process that prints its URL and serves the page (the
lab's one fresh-process test); a busy port is checked through `main()` in this process."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import urllib.request

from tests.cli.conftest import run_in_process

LAUNCH = [sys.executable, "-c", "from ctxlab.cli import main; main()", "lab"]


def test_ctxlab_lab_prints_its_url_and_serves_the_page() -> None:
    proc = subprocess.Popen(
        [*LAUNCH, "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        assert match, line + (proc.stderr.read() if proc.poll() is not None else "")
        with urllib.request.urlopen(match.group(0), timeout=30) as resp:
            assert b"ctxlab lab" in resp.read()
        with urllib.request.urlopen(match.group(0) + "api/plan?context=4096", timeout=30) as resp:
            assert resp.status == 200
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_busy_port_is_one_sentence_and_exit_code_2(monkeypatch, capsys) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        result = run_in_process(monkeypatch, capsys, "lab", "--port", str(port))
    assert result.code == 2
    assert result.err.startswith(f"error: cannot listen on 127.0.0.1:{port}")
    assert "Traceback" not in result.err

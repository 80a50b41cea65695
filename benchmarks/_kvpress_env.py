"""What both sides of `vs_kvpress.py` share without importing ctxlab or torch: the kvpress
venv (built once, reused), the press names, and the peak-RSS probe. Stdlib only, because the
worker (`_kvpress_worker.py`) imports it from the kvpress venv, where ctxlab is not installed.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".bench" / "kvpress-venv"
WORKER = Path(__file__).resolve().with_name("_kvpress_worker.py")
KVPRESS_SPEC = "kvpress>=0.5,<0.6"
# The default PyPI torch is a multi-GiB CUDA build; the CPU wheel comes from PIP_FIND_LINKS.
TORCH_SPEC = "torch==2.13.0+cpu"


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def setup_venv(venv: Path, torch_spec: str, kvpress_spec: str) -> None:
    """Create the kvpress venv (once): kvpress, its transformers, the CPU torch, gguf."""
    py = venv_python(venv)
    if py.exists() and _has_kvpress(py):
        print(f"kvpress venv: {venv} (reused)", file=sys.stderr)
        return
    print(
        f"kvpress venv: building {venv} with {kvpress_spec}, {torch_spec}, gguf "
        "(one time; a few minutes, about 1.5 GiB on disk) ...",
        file=sys.stderr,
    )
    t0 = time.perf_counter()
    venv.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(py), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    links = os.environ.get("PIP_FIND_LINKS")
    if not links and Path("/opt/wheels").is_dir():
        pip += ["--find-links", "/opt/wheels"]
    res = subprocess.run([*pip, torch_spec, kvpress_spec, "gguf"], check=False)
    if res.returncode != 0:
        sys.exit(
            f"pip could not install {kvpress_spec} with {torch_spec} into {venv}; see the pip "
            "output above (pass --torch-spec to choose another torch, e.g. one in "
            "PIP_FIND_LINKS)."
        )
    print(f"kvpress venv ready in {time.perf_counter() - t0:.0f} s", file=sys.stderr)


def _has_kvpress(py: Path) -> bool:
    code = "import kvpress, gguf, transformers"
    return subprocess.run([str(py), "-c", code], capture_output=True).returncode == 0


PRESSES = {
    "snapkv": "SnapKVPress",
    "streaming": "StreamingLLMPress",
    "observed_attention": "ObservedAttentionPress",
    "knorm": "KnormPress",
}


def reset_peak_rss() -> bool:
    """Reset this process's RSS high-water mark (ru_maxrss follows it on Linux)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux

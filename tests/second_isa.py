"""Rerun the tests that pin float-sensitive choices under a lower instruction set.

`make test` runs the suite on the CPU's best kernels, then this script reruns the tests marked
`isa` (the golden policy records, the parity tests: whatever pins a choice or a value that
float kernels can move) with torch's ATen kernels, MKL, oneDNN and ctxlab's own C kernels
(`ctxlab/native.py`) held one instruction set lower (AVX-512 -> AVX2, AVX2 -> no vector
extensions), on the same machine. A record or a
tolerance that only holds on one CPU generation fails here, not on a user's machine. On a
CPU with nothing lower to fall back to it says so and passes.

    .venv/bin/python tests/second_isa.py [extra pytest args]
"""

from __future__ import annotations

import os
import subprocess
import sys

# torch's capability name -> (ATen, MKL, oneDNN, ctxlab's C kernels) settings one step below
LOWER: dict[str, tuple[str, str, str, str]] = {
    "AVX512": ("avx2", "AVX2", "AVX2", "x86-64-v3"),
    "AVX2": ("default", "SSE4_2", "SSE41", "x86-64-v2"),
}
# chosen by marker, not by folder: a float-sensitive test anywhere is rerun, nothing else is
SELECT = ("tests", "-m", "isa")
PROBE = "import torch; print(torch.backends.cpu.get_cpu_capability())"


def capability(env: dict[str, str]) -> str:
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def main() -> int:
    native = capability(dict(os.environ))
    if native not in LOWER:
        print(f"second instruction set: none below {native} on this CPU; nothing to rerun.")
        return 0
    aten, mkl, onednn, march = LOWER[native]
    env = {
        **os.environ,
        "ATEN_CPU_CAPABILITY": aten,
        "MKL_ENABLE_INSTRUCTIONS": mkl,
        "ONEDNN_MAX_CPU_ISA": onednn,
        "CTXLAB_NATIVE_MARCH": march,
    }
    lowered = capability(env)
    print(
        f"second instruction set: {native} -> {lowered} (MKL {mkl}, oneDNN {onednn}, "
        f"ctxlab's C kernels -march={march})"
    )
    if lowered == native:
        print("error: torch ignored ATEN_CPU_CAPABILITY; the second run would prove nothing.")
        return 1
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *SELECT, *sys.argv[1:]]
    return subprocess.run(cmd, env=env).returncode


if __name__ == "__main__":
    sys.exit(main())

"""`ctxlab serve --role prefill|decode` and `--disaggregated`: which process does what.

- `--role prefill --kv-socket ADDR`: no HTTP; computes prompts' KV and sends it to the decode
  process that connects to ADDR (`ctxlab.serve.disagg_prefill`).
- `--role decode --kv-socket ADDR`: the HTTP front; prompts' KV comes from the prefill
  process listening on ADDR (`ctxlab.serve.disagg_decode`).
- `--disaggregated`: the decode role, plus a prefill process it starts itself (same model
  and pool options, one torch thread, pinned with `--prefill-cpu`), ended with it.
`--prefill-cpu` / `--decode-cpu` pin each process to one core (`os.sched_setaffinity`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer

from ctxlab.errors import CtxlabError

ROLES = ("colocated", "prefill", "decode")
READY_TIMEOUT_S = 600.0

RoleOpt = typer.Option(
    "colocated",
    "--role",
    help="colocated (one process), prefill (computes prompts' KV, no HTTP) or decode (the HTTP "
    "front; KV from a prefill process at --kv-socket). docs/disaggregation.md",
)
DisaggOpt = typer.Option(
    False,
    "--disaggregated",
    help="Run decode here and start a prefill process (one core each with --prefill-cpu and "
    "--decode-cpu); the KV moves between them page by page over a Unix socket.",
)
KVSocketOpt = typer.Option(
    None,
    "--kv-socket",
    help="Where prefill listens and decode connects: a socket path, or HOST:PORT for TCP "
    "(--disaggregated: a temporary path).",
)
PrefillCPUOpt = typer.Option(
    None, "--prefill-cpu", help="Pin the prefill process to this core (--disaggregated)."
)
DecodeCPUOpt = typer.Option(
    None, "--decode-cpu", help="Pin this (HTTP-serving) process to this core."
)


@dataclass
class Roles:
    role: str
    disaggregated: bool
    kv_socket: str | None
    prefill_cpu: int | None
    decode_cpu: int | None
    child: subprocess.Popen | None = None

    @classmethod
    def check(
        cls,
        role: str,
        disaggregated: bool,
        kv_socket: str | None,
        prefill_cpu: int | None,
        decode_cpu: int | None,
        policy: str | None,
        kv_format: str | None,
        kv_cache_dtype: str = "auto",
    ) -> Roles:
        if role not in ROLES:
            raise CtxlabError(f"--role {role!r} is unknown; use one of {', '.join(ROLES)}.")
        if disaggregated and role != "colocated":
            raise CtxlabError("give either --disaggregated or --role, not both.")
        split = disaggregated or role != "colocated"
        if split and (policy or kv_format):
            raise CtxlabError(
                "disaggregated serving moves the plain cache: give no --policy or --kv-format."
            )
        if split and kv_cache_dtype != "auto":
            raise CtxlabError(
                "disaggregated serving moves the cache in the model's dtype: give no "
                "--kv-cache-dtype."
            )
        if role in ("prefill", "decode") and not kv_socket:
            raise CtxlabError(f"--role {role} needs --kv-socket (where the two processes meet).")
        if prefill_cpu is not None and not (disaggregated or role == "prefill"):
            raise CtxlabError("--prefill-cpu applies with --disaggregated or --role prefill.")
        if decode_cpu is not None and role == "prefill":
            raise CtxlabError("--decode-cpu does not apply to --role prefill; use --prefill-cpu.")
        cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
        for flag, cpu in (("--prefill-cpu", prefill_cpu), ("--decode-cpu", decode_cpu)):
            if cpu is not None and cpu not in cpus:
                raise CtxlabError(
                    f"{flag} {cpu} is not a core this process may use {sorted(cpus)}."
                )
        if disaggregated and not kv_socket:
            kv_socket = str(Path(tempfile.mkdtemp(prefix="ctxlab-kv-")) / "kv.sock")
        return cls(role, disaggregated, kv_socket, prefill_cpu, decode_cpu)

    @property
    def is_prefill(self) -> bool:
        return self.role == "prefill"

    @property
    def is_decode(self) -> bool:
        return self.role == "decode" or self.disaggregated

    def pin(self) -> None:
        """Pin this process to its core (--disaggregated: after the prefill child started,
        which would otherwise inherit the pin)."""
        cpu = self.prefill_cpu if self.is_prefill else self.decode_cpu
        if cpu is not None and not (self.disaggregated and self.child is None):
            os.sched_setaffinity(0, {cpu})

    def run_prefill(self, engine: Any, model_id: str) -> None:
        """Serve as the prefill process until killed; prints `ready kv ADDR` once listening."""
        from ctxlab.serve.disagg_prefill import PrefillWorker

        worker = PrefillWorker(engine, str(self.kv_socket), model_id)

        def ready() -> None:
            typer.echo(f"ready kv {self.kv_socket}")

        worker.serve_forever(on_ready=ready)

    def start_prefill(self, serve_args: list[str]) -> None:
        """--disaggregated: start the prefill process (it loads while this one does)."""
        if not self.disaggregated:
            return
        cmd = [sys.executable, "-c", "from ctxlab.cli import main; main()", "serve"]
        cmd += [*serve_args, "--role", "prefill", "--kv-socket", str(self.kv_socket)]
        if self.prefill_cpu is not None:
            cmd += ["--prefill-cpu", str(self.prefill_cpu)]  # the child pins itself
        env = dict(os.environ, OMP_NUM_THREADS="1")
        self.child = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, text=True, env=env, preexec_fn=_die_with_parent
        )
        self.pin()

    def connect(self, engine: Any, model_id: str) -> Any:
        """The decode engine over a channel to the prefill process."""
        from ctxlab.serve.disagg_channel import Channel, connect
        from ctxlab.serve.disagg_decode import DecodeEngine

        if self.child is not None:
            self._wait_child()
        end = time.monotonic() + (30.0 if self.child is None else 5.0)
        while True:
            try:
                sock = connect(str(self.kv_socket))
                break
            except OSError as exc:
                if time.monotonic() > end:
                    raise CtxlabError(
                        f"cannot reach the prefill process at {self.kv_socket}: {exc.strerror}."
                    ) from None
                time.sleep(0.2)
        return DecodeEngine(engine, Channel(sock), model_id)

    def _wait_child(self) -> None:
        child = self.child
        assert child is not None and child.stdout is not None
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(child.stdout.readline()), daemon=True)
        reader.start()
        reader.join(READY_TIMEOUT_S)
        if not line or not line[0].startswith("ready kv"):
            child.kill()
            raise CtxlabError(
                "the prefill process did not start (its error is above); "
                f"exit status {child.poll()}."
            )
        threading.Thread(target=_drain, args=(child,), daemon=True).start()


def serve_args(**values: Any) -> list[str]:
    """Command-line flags that give the prefill process this process's model and pool."""
    out: list[str] = []
    for flag, value in values.items():
        name = "--" + flag.replace("_", "-")
        if value is None or value is False:
            continue
        out += [name] if value is True else [name, str(value)]
    return out


def _die_with_parent() -> None:
    """The prefill child gets SIGTERM when the server that started it dies (Linux)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _drain(child: subprocess.Popen) -> None:
    for _ in child.stdout or ():
        pass

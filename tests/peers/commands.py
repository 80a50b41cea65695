"""Every command that talks to an OpenAI-compatible server, as argv for the in-process CLI,
with short limits so a hanging server costs a test seconds, not minutes."""

from __future__ import annotations

from pathlib import Path

COMMANDS = ("probe", "bench", "eval", "rag")
STREAMING = ("probe", "bench")  # read streamed /v1/completions answers
CHAT = ("eval", "rag")  # read whole /v1/chat/completions answers


def argv(name: str, url: str, out: Path, rag_db: Path, seconds: str = "2") -> list[str]:
    if name == "probe":
        return ["probe", "--server", url, "--out", str(out / "probe.json"), "--yes", "--sections",
                "prefix", "--max-requests", "6", "--max-seconds", seconds]  # fmt: skip
    if name == "bench":
        return ["bench", "serve", "--base-url", url, "--model", "m", "--num-prompts", "2",
                "--input-len", "8", "--output-len", "2", "--timeout", seconds,
                "--out", str(out / "bench")]  # fmt: skip
    if name == "eval":
        return ["eval", "--backend", "openai", "--base-url", url, "--tasks",
                "niah_single_noise", "--lengths", "300", "--depths", "1", "--samples", "1",
                "--timeout", seconds, "--out", str(out / "eval")]  # fmt: skip
    if name == "rag":
        return ["rag", "ask", "Who leads Acme Foundry?", "--db", str(rag_db),
                "--backend", "openai", "--base-url", url, "--timeout", seconds]  # fmt: skip
    raise ValueError(name)

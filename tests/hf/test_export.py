"""`ctxlab export-hf`: the GGUF model as a Hugging Face folder that loads back as the same
model (what vLLM serves in the reference deployment), reused while current."""

from __future__ import annotations

import json

import pytest

from tests.cli.conftest import run_in_process


def test_an_unknown_model_is_one_sentence(monkeypatch, capsys, tmp_path):
    r = run_in_process(monkeypatch, capsys, "export-hf", "no-such-model", "--out", str(tmp_path))
    assert r.code == 2 and len(r.err_lines) == 1 and "no-such-model" in r.err


def test_an_out_path_that_is_a_file_is_one_sentence(monkeypatch, capsys, tmp_path, gguf_path):
    f = tmp_path / "taken"
    f.write_text("x")
    r = run_in_process(monkeypatch, capsys, "export-hf", "smollm2-135m", "--out", str(f))
    assert r.code == 2 and len(r.err_lines) == 1 and "not a folder" in r.err


def test_a_disk_that_fills_mid_write_is_one_sentence_and_no_folder(monkeypatch, capsys, tmp_path):
    """safetensors reports a full disk as its own SafetensorError, not an OSError: it was a
    traceback (the issue 33 re-walk, a tmpfs with 60 KiB left)."""
    from safetensors import SafetensorError

    class Full:
        def parameters(self) -> list:
            return []

        def save_pretrained(self, folder: str) -> None:
            (tmp_path / "partial").write_text("x")
            raise SafetensorError("Error while serializing: I/O error: No space left on device")

    monkeypatch.setattr("ctxlab.hf.gguf.from_gguf", lambda model: (Full(), Full()))
    out = tmp_path / "hf"
    r = run_in_process(monkeypatch, capsys, "export-hf", "smollm2-135m", "--out", str(out))
    assert r.code == 2 and len(r.err_lines) == 1, r.err
    assert f"cannot write the model folder {out}" in r.err and "No space left" in r.err
    assert not out.exists() and not list(tmp_path.glob(".hf-*"))  # the temporary folder too


def test_an_export_the_disk_cannot_hold_is_refused_before_the_write(monkeypatch, capsys, tmp_path):
    """The weights' size is compared with the free space before anything is written."""
    import shutil

    class Weight:
        def numel(self) -> int:
            return 1000

        def element_size(self) -> int:
            return 4

    class Model:
        def parameters(self):
            return [Weight(), Weight()]

        def save_pretrained(self, folder: str) -> None:
            raise AssertionError("written although the disk cannot hold it")

    monkeypatch.setattr("ctxlab.hf.gguf.from_gguf", lambda model: (Model(), Model()))
    monkeypatch.setattr(
        shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**6, 10**6, 7000)
    )
    out = tmp_path / "hf"
    r = run_in_process(monkeypatch, capsys, "export-hf", "smollm2-135m", "--out", str(out))
    assert r.code == 2 and len(r.err_lines) == 1, r.err
    assert "more than the 0.0 MiB free" in r.err and not out.exists()


@pytest.mark.model
@pytest.mark.slow
def test_the_folder_loads_back_as_the_same_model(monkeypatch, capsys, tmp_path, hf_model):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "smollm2"
    args = ("export-hf", "smollm2-135m", "--out", str(out))
    r = run_in_process(monkeypatch, capsys, *args, "--json")
    assert r.code == 0, r.err
    assert json.loads(r.out) == {"model": "smollm2-135m", "folder": str(out), "reused": False}
    again = run_in_process(monkeypatch, capsys, *args)
    assert again.code == 0 and again.out.startswith("up to date")

    model = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(str(out))
    ids = tok("The capital of France is", return_tensors="pt").input_ids
    assert ids.shape[1] > 3
    with torch.no_grad():
        got = model(ids).logits
        want = hf_model(ids).logits
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4)
    assert tok.chat_template  # vLLM's chat API needs it

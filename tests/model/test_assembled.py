"""A model file an installed package reassembles: built once into the cache, then reused.

A stand-in package (a module with `EXPECTED_SHA256` and `assemble`) keeps this fast; the
real Gemma 3 package goes through the same code in the parity tests.
"""

from __future__ import annotations

import hashlib
import sys
import types
from pathlib import Path

import pytest

from ctxlab.errors import CtxlabError
from ctxlab.model.assembled import STAMP_SUFFIX, assembled_path

PAYLOAD = b"GGUF" + bytes(range(256)) * 64
NAME = "ctxlab_fake_assembled_model"


@pytest.fixture
def package(monkeypatch, tmp_path):
    monkeypatch.setenv("CTXLAB_CACHE_DIR", str(tmp_path / "cache"))
    mod = types.ModuleType(NAME)
    mod.EXPECTED_SHA256 = hashlib.sha256(PAYLOAD).hexdigest()
    mod.calls = 0
    mod.payload = PAYLOAD

    def assemble(path, overwrite=False):
        mod.calls += 1
        Path(path).write_bytes(mod.payload)
        if hashlib.sha256(mod.payload).hexdigest() != mod.EXPECTED_SHA256:
            raise ValueError("Assembled file sha256 did not match expected value")
        return Path(path)

    mod.assemble = assemble
    monkeypatch.setitem(sys.modules, NAME, mod)
    return mod


def resolve() -> Path:
    return assembled_path(NAME, "fake-model-gguf", "fake.gguf")


def test_assembled_once_then_reused_from_the_stamp(package, tmp_path):
    first = resolve()
    assert first.read_bytes() == PAYLOAD and package.calls == 1
    assert first.is_relative_to(tmp_path / "cache" / "models")
    assert (
        (first.parent / ("fake.gguf" + STAMP_SUFFIX))
        .read_text()
        .startswith(package.EXPECTED_SHA256)
    )
    assert resolve() == first and package.calls == 1
    assert not [p for p in first.parent.iterdir() if p.name.startswith(".tmp-")]


def test_a_changed_file_is_hashed_and_rebuilt(package):
    path = resolve()
    path.write_bytes(PAYLOAD[:-1] + b"x")  # same size, new mtime: the stamp no longer matches
    assert resolve().read_bytes() == PAYLOAD and package.calls == 2


def test_missing_package_or_bad_checksum_is_one_sentence(package, monkeypatch):
    package.payload = PAYLOAD + b"tail"
    with pytest.raises(
        CtxlabError, match=r"reinstall them with `pip install --force-reinstall fake-model-gguf`"
    ):
        resolve()
    monkeypatch.delitem(sys.modules, NAME)
    with pytest.raises(CtxlabError, match=r"fake-model-gguf package .* not installed"):
        resolve()

"""The weights cache: a cached load is the dequantized one, a damaged entry is rebuilt, the
key follows the file, and the cache can be turned off."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import gguf
import pytest
import torch

from ctxlab.cache_dir import CACHE_ENV
from ctxlab.model import loader
from ctxlab.model import weights_cache as wc

pytestmark = pytest.mark.model


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(wc.ENV, raising=False)
    return tmp_path / "cache"


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].dtype == b[name].dtype and torch.equal(a[name], b[name]), name


def test_a_cached_load_equals_the_dequantized_one_and_never_dequantizes(
    cache, gguf_path, monkeypatch
):
    cfg, first, freqs = loader.read_gguf(gguf_path)  # empty cache: dequantizes and stores
    entries = list((cache / "weights").iterdir())
    assert [e.name for e in entries] == [f"{wc.cache_key(gguf_path)}.safetensors"]

    def refuse(*args, **kwargs):
        raise AssertionError("a cache hit must not dequantize")

    monkeypatch.setattr(gguf.quants, "dequantize", refuse)
    cfg2, second, freqs2 = loader.read_gguf(gguf_path)
    assert cfg2 == cfg
    _same(first, second)
    assert (freqs is None) == (freqs2 is None)
    second[next(iter(second))].add_(1.0)  # the model may write its tensors ...
    monkeypatch.undo()
    monkeypatch.setenv(CACHE_ENV, str(cache))
    _, third, _ = loader.read_gguf(gguf_path)
    _same(first, third)  # ... without changing the cache entry


def test_a_damaged_entry_is_rebuilt(cache, gguf_path):
    _, first, _ = loader.read_gguf(gguf_path)
    entry = wc.entry_path(gguf_path)
    entry.write_bytes(entry.read_bytes()[:1000])  # truncated
    _, again, _ = loader.read_gguf(gguf_path)
    _same(first, again)
    assert entry.stat().st_size > 1000  # written whole again


def test_the_key_follows_the_file_and_the_cache_can_be_off(cache, gguf_path, tmp_path, monkeypatch):
    copy = tmp_path / "copy.gguf"
    shutil.copyfile(gguf_path, copy)
    key = wc.cache_key(copy)
    assert key == wc.cache_key(copy)
    st = copy.stat()
    os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # rewritten later
    assert wc.cache_key(copy) != key
    monkeypatch.setenv(wc.ENV, "0")
    calls = []
    out = wc.cached_tensors(copy, lambda: (calls.append(1) or {"x": torch.ones(2)}, None))
    assert calls == [1] and torch.equal(out[0]["x"], torch.ones(2))
    assert not (cache / "weights").exists()

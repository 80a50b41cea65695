"""The lean GGUF reader against the gguf package's own reader on a file gguf writes."""

from __future__ import annotations

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from ctxlab.errors import CtxlabError  # noqa: E402
from ctxlab.model.gguf_file import read_gguf_file  # noqa: E402


@pytest.fixture
def small_gguf(tmp_path):
    path = tmp_path / "small.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(2)
    w.add_float32("llama.rope.freq_base", 500000.0)
    w.add_string("general.name", "tiny test")
    w.add_array("tokenizer.ggml.tokens", ["a", "bb", "ccc"])
    w.add_array("llama.some_ints", [3, 1, 4, 1, 5])
    w.add_bool("llama.flag", True)
    rng = np.random.default_rng(0)
    w.add_tensor("norm.weight", rng.standard_normal(64).astype(np.float32))
    q8 = gguf.quants.quantize(
        rng.standard_normal((4, 64)).astype(np.float32), gguf.GGMLQuantizationType.Q8_0
    )
    w.add_tensor("w.weight", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_matches_gguf_reader(small_gguf):
    mine = read_gguf_file(small_gguf)
    ref = gguf.GGUFReader(str(small_gguf))
    assert mine.metadata["general.architecture"] == "llama"
    assert mine.metadata["llama.block_count"] == 2
    assert mine.metadata["llama.rope.freq_base"] == 500000.0
    assert mine.metadata["general.name"] == "tiny test"
    assert mine.metadata["tokenizer.ggml.tokens"] == 3  # string arrays: length only
    assert mine.metadata["llama.some_ints"] == [3, 1, 4, 1, 5]
    assert mine.metadata["llama.flag"] is True
    assert [t.name for t in mine.tensors] == [t.name for t in ref.tensors]
    for a, b in zip(mine.tensors, ref.tensors, strict=True):
        x = gguf.quants.dequantize(a.data, gguf.GGMLQuantizationType(a.qtype))
        y = gguf.quants.dequantize(b.data, b.tensor_type)
        assert x.shape == y.shape and np.array_equal(x, y)


def test_truncated_and_foreign_files(small_gguf, tmp_path):
    data = small_gguf.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:-100])  # more than the alignment padding at the end
    with pytest.raises(
        CtxlabError, match=r"cut\.gguf is a truncated or corrupt GGUF file \(tensor"
    ):
        read_gguf_file(cut)
    head = tmp_path / "head.gguf"
    head.write_bytes(data[:40])
    with pytest.raises(CtxlabError, match="truncated or corrupt"):
        read_gguf_file(head)
    foreign = tmp_path / "foreign.gguf"
    foreign.write_bytes(b"PK\x03\x04" + data[4:])
    with pytest.raises(CtxlabError, match="not a GGUF file"):
        read_gguf_file(foreign)

"""Weights moved into one huge-page region at load (`model/huge_pages.py`).

The move must keep every value, every parameter object (tied weights stay one object), and
every sharing of storage (views stay views of one copy); it must do nothing where the kernel
would not give huge pages anyway, where madvise is refused, or for a file-mapped storage.
"""

from __future__ import annotations

import torch
from torch import nn

from ctxlab.model import huge_pages


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.embed = nn.Embedding(1024, 768)  # 3 MiB: the region passes 2 MiB
        with torch.no_grad():
            self.embed.weight.copy_(torch.randn(1024, 768, generator=g))
        self.head = nn.Linear(768, 1024, bias=False)
        self.head.weight = self.embed.weight  # tied
        self.register_buffer("rows", self.embed.weight.detach()[10:20])  # a view of it
        self.norm = nn.Parameter(torch.ones(768))


def snapshot(m: Tied) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in m.state_dict().items()}


def test_a_move_keeps_values_objects_and_sharing(monkeypatch):
    monkeypatch.setattr(huge_pages, "thp_mode", lambda: "madvise")
    m = Tied()
    before, weight, old = snapshot(m), m.embed.weight, m.embed.weight.data_ptr()
    moved = huge_pages.move_into_huge_pages(m)
    assert moved >= 1024 * 768 * 4
    assert m.embed.weight is weight and m.head.weight is weight  # the same Parameter
    assert m.embed.weight.data_ptr() != old  # it moved
    assert m.rows.data_ptr() == m.embed.weight[10].data_ptr()  # still a view of it
    for k, v in m.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert m.head(torch.ones(1, 768)).shape == (1, 1024)


def test_nothing_moves_where_it_would_not_help(monkeypatch, tmp_path):
    m = Tied()
    where = m.embed.weight.data_ptr()
    for mode in ("always", "never", ""):
        monkeypatch.setattr(huge_pages, "thp_mode", lambda mode=mode: mode)
        assert huge_pages.move_into_huge_pages(m) == 0
    monkeypatch.setattr(huge_pages, "thp_mode", lambda: "madvise")
    monkeypatch.setenv(huge_pages.ENV, "off")
    assert huge_pages.move_into_huge_pages(m) == 0
    monkeypatch.delenv(huge_pages.ENV)
    monkeypatch.setattr(huge_pages, "_advise", lambda address, length: False)
    assert huge_pages.move_into_huge_pages(m) == 0
    assert m.embed.weight.data_ptr() == where


def test_a_file_mapped_storage_stays_where_it_is(monkeypatch, tmp_path):
    monkeypatch.setattr(huge_pages, "thp_mode", lambda: "madvise")
    path = tmp_path / "weights.bin"
    torch.randn(1024 * 1024).numpy().tofile(path)
    mapped = torch.from_file(str(path), shared=True, size=1024 * 1024, dtype=torch.float32)
    m = nn.Module()
    m.register_buffer("w", mapped)
    assert huge_pages.move_into_huge_pages(m) == 0
    assert m.w.data_ptr() == mapped.data_ptr()


def test_the_mode_is_read_from_the_kernel_s_file(monkeypatch, tmp_path):
    f = tmp_path / "enabled"
    f.write_text("always [madvise] never\n")
    monkeypatch.setattr(huge_pages, "THP", f)
    assert huge_pages.thp_mode() == "madvise"
    monkeypatch.setattr(huge_pages, "THP", tmp_path / "absent")
    assert huge_pages.thp_mode() == ""

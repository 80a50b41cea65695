"""Threads per phase: small decode-only steps run on CTXLAB_DECODE_THREADS (default 1), every
other step on the configured count, which is restored after the step."""

from __future__ import annotations

import pytest
import torch

from ctxlab.engine.phase_threads import DECODE_ALL_THREADS_FROM, ENV, step_threads, threads_for
from ctxlab.errors import CtxlabError


def test_threads_by_shape(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    assert threads_for(1, 0, 4) == 1
    assert threads_for(16, 0, 4) == 1
    assert threads_for(DECODE_ALL_THREADS_FROM, 0, 4) == 4
    assert threads_for(1, 200, 4) == 4  # a step that prefills uses every thread
    monkeypatch.setenv(ENV, "0")
    assert threads_for(1, 0, 4) == 4
    monkeypatch.setenv(ENV, "3")
    assert threads_for(1, 0, 2) == 2  # never more than configured


def test_bad_env_is_one_sentence(monkeypatch):
    monkeypatch.setenv(ENV, "two")
    with pytest.raises(CtxlabError, match="CTXLAB_DECODE_THREADS must be"):
        threads_for(1, 0, 2)


def test_step_threads_restores_the_configured_count(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with step_threads(1, 0) as n:
            assert n == 1 and torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
        with step_threads(0, 64) as n:
            assert n == 2 and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)

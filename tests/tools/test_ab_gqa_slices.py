"""CPU tests of bench/ab_gqa_slices.py (the fwd+bwd A/B of Note [GQA head slices]): the variant
names it accepts, the FA4_BWD_TILE_ORDER each variant captures under (and that it is unset
after), the eager fallback when a graph cannot be captured, and the training step's gradients."""

import os
import sys
from pathlib import Path

import pytest
import torch
from helpers import load_script

BENCH = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

ab = load_script(BENCH / "ab_gqa_slices.py", "ab_gqa_slices")


def test_variants(monkeypatch):
    monkeypatch.delenv("PEER", raising=False)
    monkeypatch.delenv("VARIANTS", raising=False)
    assert ab.variants() == {"whole": "heads64", "auto": "", "s1": "heads1", "s2": "heads2"}
    monkeypatch.setenv("VARIANTS", "whole,s3")
    monkeypatch.setenv("PEER", "1")
    assert ab.variants() == {"whole": "heads64", "s3": "heads3", "flash-attn-4": None}
    for bad in ("whole,s9", "auto,s1"):  # unknown; no baseline to compare against
        monkeypatch.setenv("VARIANTS", bad)
        with pytest.raises(SystemExit, match="VARIANTS"):
            ab.variants()


def test_capture_sets_the_order_then_unsets_it(monkeypatch):
    seen = []

    def step():
        seen.append(os.environ.get("FA4_BWD_TILE_ORDER"))
        return [torch.ones(2)]

    monkeypatch.delenv("FA4_BWD_TILE_ORDER", raising=False)
    monkeypatch.setattr(ab.bi, "peak_extra_mib", lambda fn: fn() and 7.0)
    monkeypatch.setattr(ab.bi, "graph_replay", lambda fn: fn)
    g, grads, mib = ab.capture(step, "heads2")
    assert seen == ["heads2"] * 3 and mib == 7.0 and torch.equal(grads[0], torch.ones(2))
    assert "FA4_BWD_TILE_ORDER" not in os.environ
    g()
    assert seen[-1] is None  # replays run under no setting of their own

    def no_graph(fn):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(ab.bi, "graph_replay", no_graph)
    g, _, _ = ab.capture(step, None)  # the peer: no setting, timed eagerly
    assert g is step and seen[-1] is None


def test_training_step_gradients():
    q, k, v = (torch.randn(1, 4, 2, 8, requires_grad=True) for _ in range(3))
    do = torch.randn(1, 4, 2, 8)

    def fn(q, k, v, causal):
        assert causal
        return (q * k + v, "lse")  # a tuple, as flash-attn-4 returns

    dq, dk, dv = ab.training_step(fn, (q, k, v, do), True)()
    assert torch.equal(dq, do * k) and torch.equal(dk, do * q) and torch.equal(dv, do)

"""tools/bwd_l2_model.py, the DRAM-traffic model of the backward's walks (docs/perf.md, "Backward
against flash-attn-4 under ncu"): its cache counts bytes as a cache must, its walks visit every
(q head, Q block) a causal tile sees exactly once, and scaled-down shapes keep the orderings the
H100 measured (fa4 = flash-attn-4 in MHA, fa4 far above at a GQA group of 7). Plain CPU test."""

from collections import Counter
from pathlib import Path

import pytest
from helpers import load_script

ROOT = Path(__file__).resolve().parents[2]
m = load_script(ROOT / "tools" / "bwd_l2_model.py", "bwd_l2_model")


@pytest.mark.parametrize("policy", ["lru", "random"])
def test_cache_counts_misses_and_dirty_writebacks(policy):
    c = m.Cache(100, policy)
    c.touch("a", 60, dirty=True)
    c.touch("a", 60)  # a hit: nothing read
    assert c.read == 60 and c.written == 0
    c.touch("b", 60)  # evicts a, which is dirty
    assert c.read == 120 and c.written == 60 and c.used == 60
    c.touch("c", 30, dirty=True)
    c.flush()
    assert c.used <= 100 and c.written == 90


def test_lru_keeps_the_recent_line():
    c = m.Cache(100, "lru")
    for key in ("a", "b", "a", "c"):  # c evicts b, the least recently used
        c.touch(key, 40)
    assert set(c.lines) == {"a", "c"}


@pytest.mark.parametrize("walk_of", ["fa4", "heads2", "flash"])
def test_walks_cover_each_causal_block_once(walk_of):
    hq, hkv, n_tiles = 6, 2, 4
    if walk_of == "flash":
        items = m.flash_items(hq, hkv, n_tiles)
    else:
        per = 3 if walk_of == "fa4" else 2
        items = m.fa4_items(hq, hkv, n_tiles, ctas=8, heads_per=per)
    seen = Counter(
        (h, n, q) for kv, n, heads in items for h in heads for q in m.q_blocks(n, n_tiles, 64)
    )
    want = Counter(
        (h, n, q) for h in range(hq) for n in range(n_tiles) for q in range(2 * n, 2 * n_tiles)
    )
    assert seen == want
    assert all(h // (hq // hkv) == kv for kv, _, heads in items for h in heads)


def test_scaled_shapes_keep_the_measured_orderings():
    # MHA: both walks read the same bytes (H100: 0.66 GB each at 16k)
    mha = [sum(m.run(4096, 8, 8, 128, w, ctas=66, l2_mb=25)) for w in ("fa4", "flash-attn-4")]
    assert mha[0] == pytest.approx(mha[1], rel=0.1)
    # group 7: fa4's walk several times flash-attn-4's (H100 Qwen 8k: 5.8x); one head per CTA
    # brings it back
    # (flash-attn-4 and the sliced walks also reduce-add their fp32 dK / dV accumulators)
    gqa = {w: sum(m.run(2048, 28, 4, 128, w, ctas=33, l2_mb=12.5)) for w in
           ("fa4", "fa4-heads1", "fa4-heads2", "flash-attn-4")}  # fmt: skip
    assert gqa["fa4"] > 2 * gqa["flash-attn-4"]
    assert gqa["fa4-heads1"] < 1.2 * gqa["flash-attn-4"]
    assert gqa["fa4-heads2"] < 1.2 * gqa["flash-attn-4"]
    with pytest.raises(ValueError):
        m.run(2048, 28, 4, 128, "other")

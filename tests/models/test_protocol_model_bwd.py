"""Protocol model of the SM100 backward kernel's barriers (tools/protocol_model_bwd.py).

Plain CPU test. The barrier table, kStagesQ and kStagesDo come from csrc/sm100/bwd/kernel.cuh;
the role programs mirror csrc/sm100/bwd/roles.cuh. The kernel's protocol must show no deadlock,
overwrite, stale read or phase error in any interleaving; each mutation must be caught with its
kind, which shows the checks can fail. Waits that the model shows to be implied by others are
listed too (dropping them alone is not caught).
"""

from dataclasses import replace
from pathlib import Path

import pytest
from helpers import load_script

ROOT = Path(__file__).resolve().parents[2]
pb = load_script(ROOT / "tools" / "protocol_model_bwd.py", "protocol_model_bwd")

TABLE = pb.parse_kernel()


def test_parse_matches_kernel():
    assert len(TABLE.bars) == 13
    assert list(TABLE.bars)[0] == "kKVFull" and list(TABLE.bars)[-1] == "kDkvFull"
    assert TABLE.bars["kPFull"].arrivals == 256 and TABLE.bars["kDsFull"].arrivals == 256
    assert TABLE.bars["kDqEmpty"].arrivals == 128
    assert all(
        b.arrivals == 1 for n, b in TABLE.bars.items() if n not in ("kPFull", "kDsFull", "kDqEmpty")
    )
    assert TABLE.stages == {
        (64, 64): (2, 2),
        (96, 96): (2, 2),
        (128, 128): (2, 1),
        (192, 192): (2, 2),
        (192, 128): (2, 2),
        (256, 256): (1, 1),
    }
    assert [TABLE.stages_do(d) for d in (64, 96, 128)] == [2, 2, 1]
    assert TABLE.bars["kQFull"].dst == "mma and compute" and TABLE.bars["kQFull"].src == "load"
    assert TABLE.bars["kQFull"].copies == "kPerQStage"
    assert TABLE.bars["kDoEmpty"].copies == "kPerDoStage" and TABLE.bars["kDoEmpty"].src == "mma"
    assert TABLE.bars["kDqEmpty"].copies == "kOnce" and TABLE.bars["kDqEmpty"].src == "reduce"
    assert TABLE.copies("kQEmpty", 2, 1) == 2 and TABLE.copies("kDoFull", 2, 1) == 1


@pytest.mark.parametrize("iters", [0, 1, 2, 3])
@pytest.mark.parametrize(
    "dims",
    sorted(TABLE.stages),
    ids=[f"d{d}x{dv}-{TABLE.stages[(d, dv)]}" for d, dv in sorted(TABLE.stages)],
)
def test_kernel_protocol_is_clean(iters, dims):
    res = pb.explore(TABLE, pb.Config(iters=iters, head_dim=dims[0], head_dim_v=dims[1]))
    print(f"I {iters}, d {dims}: {res.states} states explored")
    assert res.violations == []
    assert res.states > (1000 if iters > 1 else 3)


def test_one_q_stage_needs_its_mma_order():
    """d = 256 has one Q stage (kStageTable): S(i+1) must wait for dK(i) to free it. With the
    two-stage order (S(i+1) right after dV(i)) the MMA thread would wait for Q(i+1), which the
    load issues only after the kQEmpty that dK(i) commits: a deadlock the model finds."""
    assert TABLE.stages_of(256) == (1, 1)
    res = pb.explore(TABLE, pb.Config(iters=2, head_dim=256, s_early=True))
    assert "deadlock" in res.kinds(), res.violations[:3]
    assert pb.explore(TABLE, pb.Config(iters=2, head_dim=256)).violations == []
    # The one-stage order is also safe with two stages (it only overlaps less).
    assert pb.explore(TABLE, pb.Config(iters=3, head_dim=64, s_early=False)).violations == []


@pytest.mark.parametrize("head_dim", [64, 128])
def test_read_counts_are_exact(head_dim):
    # Every complete run makes the same reads: along one run to the end, each value must have
    # been read exactly as often as its write declared (so the counts cannot hide a reader).
    m = pb.Model(TABLE, pb.Config(iters=3, head_dim=head_dim))
    state = m.initial()
    while True:
        succ, bad = m.successors(state)
        assert bad == []
        if not succ:
            break
        state = succ[0][1]
    assert state[0] == tuple(len(m.progs[r]) for r in m.roles)
    assert not state[4] and not state[5]
    left = {b: state[3][i] for b, i in m.buf.items() if state[3][i][1]}
    assert left == {}


def _drop(*keys):
    return set(keys)


# (description, config, expected violation kind, a substring of one of its messages)
MUTATIONS = [
    (
        "mma skips the kDqEmpty wait (dP(1) over dQ(0) before the reduce loaded it)",
        pb.Config(iters=2, drop=_drop(("mma", "Wait", "kDqEmpty", 0))),
        "overwrite",
        "overwritten with ('dP', 1) while ('dQ', 0)",
    ),
    (
        "mma skips the first kPFull wait (dV(0) reads S as P)",
        pb.Config(iters=2, drop=_drop(("mma", "Wait", "kPFull", 0))),
        "stale read",
        "read for ('P', 0) but holds ('S', 0)",
    ),
    (
        "load skips the kQEmpty wait of Q(2) (stage 0 reused)",
        pb.Config(iters=3, drop=_drop(("load", "Wait", "kQEmpty", 2))),
        "overwrite",
        "sQ0 overwritten with ('tma', ('Q', 2))",
    ),
    (
        "load skips the kDoEmpty wait of dO(1) at kStagesDo 1",
        pb.Config(iters=2, head_dim=128, drop=_drop(("load", "Wait", "kDoEmpty", 1))),
        "overwrite",
        "sDO0 overwritten with ('tma', ('dO', 1))",
    ),
    (
        "mma skips the first kDsFull wait (dK / dQ read dS before written)",
        pb.Config(iters=2, drop=_drop(("mma", "Wait", "kDsFull", 0))),
        "stale read",
        "read for ('dS', 0)",
    ),
    (
        "reduce skips the first kDqFull wait",
        pb.Config(iters=2, drop=_drop(("reduce", "Wait", "kDqFull", 0))),
        "stale read",
        "read for ('dQ', 0)",
    ),
    (
        "compute1 skips the kDkvFull wait (dV read before the last dV MMA)",
        pb.Config(iters=2, drop=_drop(("compute1", "Wait", "kDkvFull", 0))),
        "stale read",
        "dV read for ('dV', 1)",
    ),
    (
        "compute1's second kSFull wait with the wrong parity",
        pb.Config(iters=2, flip={("compute1", "kSFull", 1)}),
        "phase",
        "compute1",
    ),
    (
        "mma's kDqEmpty wait with the wrong parity",
        pb.Config(iters=2, flip={("mma", "kDqEmpty", 0)}),
        "phase",
        "kDqEmpty",
    ),
    (
        "load's first kQEmpty wait with the wrong parity",
        pb.Config(iters=1, flip={("load", "kQEmpty", 0)}),
        "deadlock",
        "load at Wait(bar='kQEmpty'",
    ),
    (
        "tcgen05 MMAs complete out of issue order: S(1) over P(0) before dV(0)",
        pb.Config(iters=2, mma_in_order=False),
        "overwrite",
        "S_0 overwritten with ('S', 1) while ('P', 0)",
    ),
    (
        "tcgen05 MMAs complete out of issue order: dQ(0) over dS(0) before dK(0)",
        pb.Config(iters=2, mma_in_order=False),
        "overwrite",
        "overwritten with ('dQ', 0) while ('dS', 0)",
    ),
]


@pytest.mark.parametrize("desc, cfg, kind, detail", MUTATIONS, ids=[m[0] for m in MUTATIONS])
def test_mutation_is_caught(desc, cfg, kind, detail):
    res = pb.explore(TABLE, cfg)  # exhaustive: each mutated run is < 40 k states
    found = [msg for k, msg in res.violations if k == kind]
    print(f"{desc}: {kind}: {found[:1]} ({res.states} states)")
    assert found, res.violations[:5]
    assert any(detail in msg for msg in found), found[:5]


# Waits whose removal alone the model does not catch, because another barrier already orders
# the same accesses (each stays in the kernel as the direct statement of its dependency).
IMPLIED = [
    # kDpFull(i) is committed after dQ(i-1) (issue order dQ(i-1), dP(i)), and tcgen05.commit
    # tracks every earlier MMA of the thread: once dP(i) is visible, dQ(i-1) has read sDS.
    (
        "compute skips its kDsEmpty waits (implied by kDpFull)",
        pb.Config(
            iters=3,
            drop={(c, "Wait", "kDsEmpty", k) for c in ("compute0", "compute1") for k in (0, 1)},
        ),
    ),
    # kSFull(i) follows S(i), which the MMA issued after its own kQFull wait for Q(i).
    (
        "compute0 skips its kQFull waits (implied by kSFull)",
        pb.Config(iters=3, drop={("compute0", "Wait", "kQFull", k) for k in range(3)}),
    ),
    # With kStagesDo == kStagesQ the load waits for kQEmpty of the same block first, committed
    # after dK(i), which is issued after dV(i): dO(i) has been read.
    (
        "load skips its kDoEmpty wait of dO(2) at kStagesDo 2",
        pb.Config(iters=3, head_dim=64, drop={("load", "Wait", "kDoEmpty", 2)}),
    ),
]


@pytest.mark.parametrize("desc, cfg", IMPLIED, ids=[m[0] for m in IMPLIED])
def test_implied_wait_is_not_caught(desc, cfg):
    assert pb.explore(TABLE, cfg).violations == []


def test_arrival_count_mutation_is_caught():
    # kDsFull expecting one warpgroup: each warpgroup's 128 arrivals complete a phase of their
    # own, the MMA thread's parity waits fall out of step and it hangs.
    bars = dict(TABLE.bars, kDsFull=replace(TABLE.bars["kDsFull"], arrivals=128))
    table = replace(TABLE, bars=bars)
    res = pb.explore(table, pb.Config(iters=2))
    assert "deadlock" in res.kinds()
    assert "arrivals" not in res.kinds()  # 128 never exceeds the pending count
    # ... and the reduce warpgroup's 128 arrivals overrun a kDqEmpty of one thread.
    bars = dict(TABLE.bars, kDqEmpty=replace(TABLE.bars["kDqEmpty"], arrivals=1))
    res = pb.explore(replace(TABLE, bars=bars), pb.Config(iters=2), stop_on={"arrivals"})
    assert "arrivals" in res.kinds()


def test_table_drift_fails_loudly():
    text = pb.KERNEL.read_text()
    # An enumerator without its comment.
    bare = text.replace(
        "  kDsEmpty,  // from mma to compute, protects sDS: dQ = dSᵀ·K done (commit)\n",
        "  kDsEmpty,\n",
    )
    assert bare != text
    with pytest.raises(ValueError, match=r"without a 'from X to Y.*kDsEmpty"):
        pb.parse_kernel(bare)
    # A barrier added to the kernel but not to the model's programs.
    extra = text.replace(
        "  kCount\n", "  kFoo,  // from load to mma, protects nothing: test\n  kCount\n"
    ).replace(
        "    {Bar::kDkvFull, BarCopies::kOnce,         1},\n",
        "    {Bar::kDkvFull, BarCopies::kOnce,         1},\n"
        "    {Bar::kFoo,     BarCopies::kOnce,         1},\n",
    )
    assert extra.count("kFoo") == 2
    with pytest.raises(ValueError, match="kFoo is in kBarriers but no role program uses it"):
        pb.Model(pb.parse_kernel(extra), pb.Config(iters=1))
    # A comment that no longer names a waiting role.
    fewer = text.replace("from load to mma and compute,", "from load to mma,")
    with pytest.raises(ValueError, match="compute0 waits on kQFull, whose comment says mma"):
        pb.Model(pb.parse_kernel(fewer), pb.Config(iters=1))
    # ... or names one that does not wait.
    more = text.replace(
        "kDqFull,   // from mma to reduce,", "kDqFull,   // from mma to reduce and compute,"
    )
    assert more != text
    with pytest.raises(ValueError, match="compute0 does not wait on kDqFull"):
        pb.Model(pb.parse_kernel(more), pb.Config(iters=0))
    # Copies the parser does not know, and stage counts it cannot find.
    with pytest.raises(ValueError, match="BarCopies"):
        pb.parse_kernel(text.replace("BarCopies::kPerDoStage,   1}", "BarCopies::kPerFoo,   1}"))
    with pytest.raises(ValueError, match="kStageTable not found"):
        pb.parse_kernel(text.replace("kStageTable[] = {", "kStages[] = {"))
    with pytest.raises(ValueError, match="below 1"):
        pb.parse_kernel(text.replace("{256, 256, 1, 1}", "{256, 256, 0, 1}"))
    with pytest.raises(ValueError, match=r"\(256, 256\) missing from kStageTable"):
        pb.Model(pb.parse_kernel(text.replace("{256, 256, 1, 1}", "")), pb.Config(head_dim=256))
    # A changed row is what the model runs.
    assert pb.parse_kernel(text.replace("{ 64,  64, 2, 2}", "{ 64,  64, 2, 1}")).stages_do(64) == 1

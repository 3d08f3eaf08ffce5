"""Protocol model of the 2-CTA SM100 backward (tools/protocol_model_bwd2.py).

Plain CPU test. The barrier table comes from csrc/sm100/bwd/kernel_2cta.cuh; the programs of both
CTAs' roles mirror csrc/sm100/bwd/roles_2cta.cuh. The kernel's protocol must show no deadlock,
overwrite, stale read, phase or arrival error in any interleaving of both CTAs; each mutation (a
dropped relay arrival or wait, a commit that reaches one CTA only, an arrival count of one CTA, the
dQ MMA before the DSMEM writes, out-of-order MMAs) must be caught, which shows the checks can fail.
The compute warpgroups' kDsEmpty wait is implied in this order, as in the 1-CTA model (dP(i)
completes after dQ(i - 1)); dropping it is not caught, and the full exploration that shows it (34 s)
is not run here.
"""

from pathlib import Path

import pytest
from helpers import load_script

ROOT = Path(__file__).resolve().parents[2]
pb2 = load_script(ROOT / "tools" / "protocol_model_bwd2.py", "protocol_model_bwd2")

SPECS = pb2.parse_kernel()


def test_parse_matches_kernel():
    assert len(SPECS) == 16
    assert {n: s.arrivals for n, s in SPECS.items() if s.arrivals != 1} == {
        "kPFull": 512,
        "kDsFull": 512,
        "kDqEmpty": 256,
    }
    assert {n for n, s in SPECS.items() if s.even_only} == {
        "kPeerKVFull",
        "kPeerQFull",
        "kPeerDoFull",
        "kPFull",
        "kDsFull",
        "kDqEmpty",
    }
    assert SPECS["kQFull"].dst == ("mma", "compute", "relay")


def test_table_drift_fails_loudly():
    text = pb2.KERNEL.read_text()
    # A copies kind the model does not have (it keeps one copy per barrier and CTA).
    staged = text.replace(
        "enum class BarCopies : int { kOnce };", "enum class BarCopies : int { kOnce, kPerQStage };"
    )
    assert staged != text
    with pytest.raises(ValueError, match="BarCopies is not"):
        pb2.parse_kernel(staged)
    # Rows out of the enum's order (the kernel static_asserts the same).
    swapped = text.replace("{Bar::kQFull,", "{Bar::kTmp,").replace(
        "{Bar::kPeerQFull,", "{Bar::kQFull,"
    )
    with pytest.raises(ValueError, match="kBarriers rows"):
        pb2.parse_kernel(swapped.replace("{Bar::kTmp,", "{Bar::kPeerQFull,"))
    # An enumerator without its comment.
    bare = text.replace("  kDsEmpty,     // from mma to compute,", "  kDsEmpty,  // to compute,")
    assert bare != text
    with pytest.raises(ValueError, match="kDsEmpty: no 'from X to Y"):
        pb2.parse_kernel(bare)
    assert SPECS["kPeerQFull"].src == ("relay",) and SPECS["kPeerQFull"].dst == ("mma",)


@pytest.mark.parametrize("iters", [0, 1, 2])
def test_kernel_protocol_is_clean(iters):
    res = pb2.explore(SPECS, pb2.Config(iters=iters))
    print(f"I {iters}: {res.states} states explored")
    assert res.violations == []
    assert res.states > (100_000 if iters else 10)


def test_read_counts_are_exact():
    # Along one complete run every value is read exactly as often as its write declared.
    m = pb2.Model(SPECS, pb2.Config(iters=2))
    state = m.initial()
    while True:
        succ, bad = m.successors(state)
        assert bad == []
        if not succ:
            break
        state = succ[0][1]
    assert state[0] == tuple(len(m.progs[r]) for r in m.roles)
    assert all(unread == 0 for _, unread in state[3])


BAD = {"stale read", "phase", "arrivals", "overwrite"}
MUTATIONS = {
    # the odd CTA's Q never reported to the MMA warp
    "relay drops kPeerQFull": (
        dict(drop={("relay@1", "Arrive", "kPeerQFull@0", 0)}),
        {"deadlock"},
    ),
    # S(0) reads the odd CTA's Q half before it landed
    "mma skips kPeerQFull": (dict(drop={("mma@0", "Wait", "kPeerQFull@0", 0)}), {"stale read"}),
    # dK(0) and dQ(0) before the dS of both CTAs (TMEM, and sDS through DSMEM) is written
    "mma skips kDsFull": (dict(drop={("mma@0", "Wait", "kDsFull@0", 0)}), {"stale read"}),
    # a commit that reaches the even CTA only: the odd CTA's compute never sees S
    "commit to the even CTA only": (dict(commit_to=(0,)), {"deadlock"}),
    # P counted for one CTA: dV(0) may read the other CTA's S as P
    "kPFull counts one CTA": (dict(arrivals={"kPFull": 256}), BAD),
    # dS counted for one CTA: dQ(0) may read an sDS the peer has not written
    "kDsFull counts one CTA": (dict(arrivals={"kDsFull": 256}), BAD),
    # dP(1) over dQ(0) before the odd CTA's reduce loaded it
    "kDqEmpty counts one CTA": (dict(arrivals={"kDqEmpty": 128}), BAD),
    # the odd CTA reloads Q before dK(0) read it
    "odd load skips kQEmpty": (
        dict(drop={("load@1", "Wait", "kQEmpty@1", 1)}),
        {"overwrite"},
    ),
    # the odd CTA's reduce reads dQ(0) before the MMA wrote it
    "odd reduce skips kDqFull": (
        dict(drop={("reduce@1", "Wait", "kDqFull@1", 0)}),
        {"stale read"},
    ),
    # the kernel relies on in-order tcgen05 execution (S(i + 1) over P(i), dQ(i) over dS(i))
    "MMAs out of order": (dict(mma_in_order=False), {"stale read", "overwrite"}),
}


@pytest.mark.parametrize("name", list(MUTATIONS))
def test_mutation_is_caught(name):
    change, kinds = MUTATIONS[name]
    # One Q block shows the missing waits of the first block (the DFS finds them in seconds
    # there, in ~35 s at two blocks); reuse across blocks needs two.
    iters = 1 if name in ("mma skips kPeerQFull", "mma skips kDsFull") else 2
    res = pb2.explore(SPECS, pb2.Config(iters=iters, **change), stop_on=kinds)
    assert res.kinds() & kinds, (name, res.violations[:3])

"""Protocol models whose role programs are extracted from the kernel source
(tools/sync_extract.py), and a sample of the sync mutants of tools/mutate_sync.py.

Plain CPU test; needs tree-sitter and tree-sitter-cpp (requirements.txt). Covered: the SM100
forward kernel, two Q tiles (hd <= 192) and one Q tile (hd 256, Note [one-tile order]), with
the TMA-store epilogue and without it; the SM100 1-CTA backward at every kStageTable row (the
head-dim split's rows included); the 2-CTA backward (both CTAs of the pair). The full mutation
run is `python tools/mutate_sync.py --all --kernel all` (docs/testing.md, "Mutation score").
"""

import os
import random
import time
from pathlib import Path

import pytest
from helpers import load_script

pytest.importorskip("tree_sitter_cpp")

ROOT = Path(__file__).resolve().parents[2]
pm = load_script(ROOT / "tools" / "protocol_model.py", "protocol_model")
se = load_script(ROOT / "tools" / "sync_extract.py", "sync_extract")
ms = load_script(ROOT / "tools" / "mutate_sync.py", "mutate_sync")
pmb = load_script(ROOT / "tools" / "protocol_model_bwd.py", "protocol_model_bwd")

SOURCES = se.read_sources(ROOT)
BWD_SOURCES = se.read_sources(ROOT, se.BWD_FILES)
BWD_ROWS = [(64, 64), (96, 96), (128, 128), (192, 192), (192, 128), (256, 256)]


@pytest.mark.parametrize(
    "cfg",
    [
        se.FwdConfig(tiles=(3,), q_tiles=2),
        se.FwdConfig(tiles=(1, 1), q_tiles=2),
        se.FwdConfig(tiles=(3,), q_tiles=2, tma_store_o=False),
        se.FwdConfig(tiles=(3,), q_tiles=1),
        se.FwdConfig(tiles=(1, 1), q_tiles=1),
        se.FwdConfig(tiles=(2, 1), q_tiles=1, tma_store_o=True),
    ],
    ids=["2q-N3", "2q-two-tiles", "2q-N3-no-staging", "1q-N3", "1q-two-tiles", "1q-staging"],
)
def test_extracted_fwd_is_clean(cfg):
    res, _ = se.explore_fwd(cfg, SOURCES)
    print(f"{cfg}: {res.states} states")
    assert res.violations == []
    assert res.states > 1000


def _skeleton(prog):
    """The sync operations of a program, with the fused steps split again."""
    out = []
    for st in prog:
        if isinstance(st, (pm.Take, pm.Publish)):
            other = st.empty if isinstance(st, pm.Take) else st.full
            out += [("W", st.bar, st.idx, st.parity), ("A", other, st.idx, st.count)]
        elif isinstance(st, pm.Wait):
            out.append(("W", st.bar, st.idx, st.parity))
        elif isinstance(st, pm.Arrive):
            out.append(("A", st.bar, st.idx, st.count))
        elif isinstance(st, pm.Commit):
            out.append(("C", st.bar, st.idx))
        elif isinstance(st, pm.Tma):
            out.append(("T", st.bar, st.idx))
    return out


@pytest.mark.parametrize("q_tiles", [2, 1])
@pytest.mark.parametrize("tiles", [(3,), (1, 1), (2, 3, 1)])
def test_extracted_equals_hand_written(q_tiles, tiles):
    # Cross-check of the extraction against the hand-written programs of
    # tools/protocol_model.py (which model the staging epilogue at both shapes).
    hand = pm.programs(pm.Config(tiles=tiles, q_tiles=q_tiles), pm.parse_kernel().stages)
    cfg = se.FwdConfig(tiles=tiles, q_tiles=q_tiles, tma_store_o=True)
    ext, _ = se.finish(se.extract_fwd(cfg, SOURCES))
    assert sorted(ext) == sorted(hand)
    for role in hand:
        assert _skeleton(ext[role]) == _skeleton(hand[role]), role


@pytest.fixture(scope="module")
def baseline():
    return ms.Baseline(SOURCES)


@pytest.fixture(scope="module")
def mutants():
    return ms.enumerate_mutants(SOURCES)


def test_mutants_cover_every_sync_site(mutants):
    ops = {m.op for m in mutants}
    assert {"delete-wait", "delete-arrive", "delete-commit", "flip-parity", "move-wait"} <= ops
    assert {"arrivals+1", "arrivals-1"} <= ops
    assert len([m for m in mutants if m.op == "delete-wait"]) >= 20


# The two deletions no CPU test caught before the programs were extracted.
@pytest.mark.parametrize(
    "op, what",
    [
        ("delete-wait", "bar_wait(kPFull) in mma_role"),
        ("delete-arrive", "arrive_mma(kPFull) in softmax_role"),
        ("delete-wait", "bar_wait(kPFull) in mma_role_one_tile"),
    ],
)
def test_reviewer_mutants_killed(mutants, baseline, op, what):
    (m,) = [m for m in mutants if m.op == op and m.what == what]
    status, why = ms.evaluate(m, baseline)
    assert status == "killed", why


def test_random_mutants(mutants, baseline):
    # ~10 mutants per run, a different sample each run (the seed is printed to reproduce a
    # failure: FA4_MUTANT_SEED=<seed>). Ops the full run shows redundant are skipped here
    # (their check explores every configuration to the end, too slow for CI).
    seed = int(os.environ.get("FA4_MUTANT_SEED", time.time()))
    print(f"FA4_MUTANT_SEED={seed}")
    pool = [m for m in mutants if m.describe().split(" (")[0] not in ms.REDUNDANT]
    for m in random.Random(seed).sample(pool, min(10, len(pool))):
        status, why = ms.evaluate(m, baseline)
        assert status == "killed", f"{m.describe()}: {status}: {why}"


@pytest.mark.parametrize(
    "old, new, message",
    [
        # a barrier op in a construct the interpreter does not model
        (
            "bar_wait(bar_ptr<T, Bar::kPFull>(ss, q), v_ready.parity(1));",
            "while (false) bar_wait(bar_ptr<T, Bar::kPFull>(ss, q), v_ready.parity(1));",
            "unsupported statement",
        ),
        # a barrier op under a run-time condition with no ORACLES entry
        (
            "bar_wait(bar_ptr<T, Bar::kPFull>(ss, q), v_ready.parity(1));",
            "if (kp.p.seqlen_q) bar_wait(bar_ptr<T, Bar::kPFull>(ss, q), v_ready.parity(1));",
            "opaque condition",
        ),
        # a parity the interpreter cannot evaluate
        (
            "Bar::kPFull>(ss, q), v_ready.parity(1));",
            "Bar::kPFull>(ss, q), kp.p.parity);",
            "not known",
        ),
    ],
    ids=["while", "opaque-if", "opaque-parity"],
)
def test_extractor_fails_loudly(old, new, message):
    kernel = SOURCES[se.FWD_FILES[0]]
    assert kernel.count(old) == 1
    sources = {**SOURCES, se.FWD_FILES[0]: kernel.replace(old, new)}
    with pytest.raises(se.ExtractError, match=message):
        se.extract_fwd(se.FwdConfig(tiles=(2,)), sources)


# ---- The SM100 1-CTA backward (and its head-dim split) ----------------------------------------
def test_bwd_rows_are_the_stage_table():
    assert sorted(pmb.parse_kernel(BWD_SOURCES[se.BWD_FILES[0]]).stages) == sorted(BWD_ROWS)


@pytest.mark.parametrize("d, dv", BWD_ROWS)
def test_extracted_bwd_is_clean(d, dv):
    # 3 Q blocks where a stage is reused twice (d = 128: one dO stage; d = 256: one Q and one
    # dO stage), 2 elsewhere (the two-stage rows differ only in TMEM columns; ~0.3 s each).
    iters = 3 if d in (128, 256) else 2
    res, _ = se.explore_bwd(se.BwdConfig(iters=iters, head_dim=d, head_dim_v=dv), BWD_SOURCES)
    print(f"d ({d}, {dv}): {res.states} states")
    assert res.violations == []
    assert res.states > 1000


@pytest.mark.parametrize("iters", [0, 1, 2, 4])
@pytest.mark.parametrize("d, dv", BWD_ROWS)
def test_extracted_bwd_equals_hand_written(d, dv, iters):
    # Cross-check against tools/protocol_model_bwd.py (roles with no op at iters = 0, the
    # compute warpgroups with nothing to wait for, are absent from the extraction).
    sq, sdo = pmb.parse_kernel().stages_of(d, dv)
    hand = pmb.programs(pmb.Config(iters=iters, head_dim=d, head_dim_v=dv), sq, sdo)
    hand = {r: p for r, p in hand.items() if p}
    cfg = se.BwdConfig(iters=iters, head_dim=d, head_dim_v=dv)
    ext, _ = se.finish_bwd(se.extract_bwd(cfg, BWD_SOURCES))
    assert sorted(ext) == sorted(hand)
    for role in hand:
        assert _skeleton(ext[role]) == _skeleton(hand[role]), role


@pytest.fixture(scope="module")
def baseline_bwd():
    return ms.Baseline(BWD_SOURCES, "bwd")


@pytest.fixture(scope="module")
def mutants_bwd():
    return ms.enumerate_mutants(BWD_SOURCES, "bwd")


def test_bwd_mutants_cover_every_sync_site(mutants_bwd):
    ops = {m.op for m in mutants_bwd}
    assert {"delete-wait", "delete-arrive", "delete-commit", "flip-parity", "move-wait"} <= ops
    # every elected commit of the MMA role, every expect_tx of the load thread
    assert len([m for m in mutants_bwd if m.op == "delete-commit"]) == 7
    assert len([m for m in mutants_bwd if "arrive_and_expect_tx" in m.what]) == 3


def test_random_bwd_mutants(mutants_bwd, baseline_bwd):
    # As test_random_mutants, 6 backward mutants (FA4_MUTANT_SEED reproduces a sample).
    seed = int(os.environ.get("FA4_MUTANT_SEED", time.time()))
    print(f"FA4_MUTANT_SEED={seed}")
    pool = [m for m in mutants_bwd if m.describe().split(" (")[0] not in ms.REDUNDANT_BWD]
    for m in random.Random(seed).sample(pool, min(6, len(pool))):
        status, why = ms.evaluate(m, baseline_bwd)
        assert status == "killed", f"{m.describe()}: {status}: {why}"


@pytest.mark.parametrize(
    "old, new, message",
    [
        # an elected commit in a construct the interpreter does not model
        (
            "elected_umma_commit(bar_ptr<T, Bar::kDkvFull>(ss));",
            "while (false) elected_umma_commit(bar_ptr<T, Bar::kDkvFull>(ss));",
            "unsupported statement",
        ),
        # the Q copy and its two bulk copies with no expect_tx before them
        (
            "cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(q_full, T::kQBytes);",
            "",
            "without its arrive_and_expect_tx",
        ),
        # an MMA whose operands the spec does not name
        ("dDOt(_0{}, _0{}, k, ds * kSplit + h)", "dQt(_0{}, _0{}, k, ds * kSplit + h)", "spec"),
    ],
    ids=["while", "copy-without-expect", "unknown-mma"],
)
def test_bwd_extractor_fails_loudly(old, new, message):
    roles = BWD_SOURCES[se.BWD_FILES[1]]
    assert roles.count(old) == 1
    sources = {**BWD_SOURCES, se.BWD_FILES[1]: roles.replace(old, new)}
    with pytest.raises(se.ExtractError, match=message):
        se.extract_bwd(se.BwdConfig(iters=2), sources)


# ---- The SM100 2-CTA backward (both CTAs of the pair) --------------------------------------------
pmb2 = load_script(ROOT / "tools" / "protocol_model_bwd2.py", "protocol_model_bwd2")
BWD2_SOURCES = se.read_sources(ROOT, se.BWD2_FILES)


def test_extracted_bwd2_is_clean():
    # One Q block: 184k states, ~4 s (two: 713k, ~17 s, run by tools/mutate_sync.py).
    res, _ = se.explore_bwd2(se.Bwd2Config(iters=1), BWD2_SOURCES)
    print(f"2-CTA, 1 Q block: {res.states} states")
    assert res.violations == []
    assert res.states > 100_000


@pytest.mark.parametrize("iters", [0, 1, 2, 3])
def test_extracted_bwd2_equals_hand_written(iters):
    # Cross-check against tools/protocol_model_bwd2.py: every process (role@CTA) of the pair.
    hand = {r: p for r, p in pmb2.raw_programs(iters).items() if p}
    ext, _ = se.finish_bwd2(se.extract_bwd2(se.Bwd2Config(iters=iters), BWD2_SOURCES))
    assert sorted(ext) == sorted(hand)
    for role in hand:
        assert _skeleton(ext[role]) == _skeleton(hand[role]), role


def test_random_bwd2_mutants():
    # 1 mutant per run (it may explore the 2-block pair up to its violation: ~4 s).
    seed = int(os.environ.get("FA4_MUTANT_SEED", time.time()))
    print(f"FA4_MUTANT_SEED={seed}")
    base = ms.Baseline(BWD2_SOURCES, "bwd2")
    pool = [
        m
        for m in ms.enumerate_mutants(BWD2_SOURCES, "bwd2")
        if m.describe().split(" (")[0] not in ms.REDUNDANT_BWD2
    ]
    for m in random.Random(seed).sample(pool, 1):
        status, why = ms.evaluate(m, base)
        assert status == "killed", f"{m.describe()}: {status}: {why}"

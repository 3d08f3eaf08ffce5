"""Protocol model of the SM100 2-CTA forward (csrc/sm100/fwd/kernel_2cta.cuh, Note [fwd 2-CTA]),
its role programs extracted from the source for both CTAs of the pair (tools/sync_extract.py,
extract_fwd2): role@rank programs, @rank barrier copies of kBarriersPair, the even CTA's
multicast commits, the relay's and arrive_mma's arrivals on the even CTA's copies.

The explorer runs with Machine(exit_drained=True): the kernel ends with cluster_sync, so once
every role of both CTAs has finished the CTAs may exit; a commit or TMA load still in flight
then arrives in the shared memory of a CTA that left ("exit"). That is what the load role's
tail (its waits on the last kKEmpty / kVEmpty commits) is for, and the model sees it.

Finding (a kernel bug, fixed in 7b9867d): the load tail's loop was bounded by
`s < kStages && s < t.blocks()`; with one KV block it ran once, at k_free.index 1, a stage never
used, whose "free" parity passes at once: no thread waited for the even CTA's kVEmpty commit of
block 0 (multicast to both CTAs, issued after the kOFull commit that the correction warpgroups
wait for), and both CTAs could pass the closing cluster_sync and exit with it in flight. The
tail now waits on every stage (test_tail_bounded_by_the_blocks_exits_with_a_commit_in_flight
keeps the old loop as a planted mutation). One block (250k states, ~6 s) and two blocks (3.9 M,
~2 min) are clean; three blocks (15 M, ~8 min) were clean when last run (not run here).

Planted mutations (test_planted_mutation_is_caught), each at the smallest block count that
catches it: the relay's kPeerKFull arrival deleted, the softmax's arrive_mma(kPFull) deleted,
kPFull's and kORescaled's 256 arrivals (both CTAs' threads) made 128, a multicast commit made a
single-CTA one (elected_umma_commit: the even CTA's copy only), and the tail's kVEmpty wait
deleted. tools/mutate_sync.py --kernel fwd2 runs every sync mutant (docs/testing.md).
"""

import os
import random
import time
from pathlib import Path

import pytest
from helpers import load_script

pytest.importorskip("tree_sitter_cpp")

ROOT = Path(__file__).resolve().parents[2]
se = load_script(ROOT / "tools" / "sync_extract.py", "sync_extract")
ms = load_script(ROOT / "tools" / "mutate_sync.py", "mutate_sync")
SOURCES = se.read_sources(ROOT, se.FWD2_FILES)
TAIL = "for (int s = 0; s < T::kStages; ++s) {"
TAIL_BOUNDED = "for (int s = 0; s < T::kStages && s < t.blocks(); ++s) {"


def test_empty_item_has_no_protocol():
    # t.blocks() == 0: every role returns before its first barrier (correction writes zeros)
    res, _ = se.explore_fwd2(se.Fwd2Config(blocks=0), SOURCES)
    assert res.violations == []


def test_programs_of_both_ctas():
    progs, _ = se.finish_fwd2(se.extract_fwd2(se.Fwd2Config(blocks=2), SOURCES))
    # the odd CTA runs no MMA role; its epilogue warp's lane 0 is the relay
    roles = [f"{r}@{c}" for r in ("load", "softmax0", "correction") for c in (0, 1)]
    assert sorted(progs) == sorted([*roles, "epilogue@1", "mma@0"])
    assert {st.bar for st in progs["epilogue@1"] if hasattr(st, "bar")} >= {
        "kPeerQFull@0", "kPeerKFull@0", "kPeerVFull@0"
    }  # fmt: skip


def test_one_block_is_clean():
    res, _ = se.explore_fwd2(se.Fwd2Config(blocks=1), SOURCES)
    assert res.violations == [], res.violations[:2]
    assert res.states > 100_000


def test_tail_bounded_by_the_blocks_exits_with_a_commit_in_flight():
    # The kernel's first version bounded the load tail by the item's blocks: with one block it
    # waited on the unused stage 1 only, and both CTAs could leave while the even CTA's
    # multicast kVEmpty commit for block 0 was still in flight (found by this model).
    k = SOURCES[se.FWD2_FILES[0]]
    assert k.count(TAIL) == 1
    bounded = {**SOURCES, se.FWD2_FILES[0]: k.replace(TAIL, TAIL_BOUNDED)}
    res, _ = se.explore_fwd2(se.Fwd2Config(blocks=1), bounded, stop_on={"exit"})
    assert res.kinds() == {"exit"}
    assert any("kVEmpty" in msg for _, msg in res.violations)


PAIR, SOFTMAX = se.FWD2_FILES[0], se.FWD2_FILES[3]


def _mutate(file, old, new):
    text = SOURCES[file]
    assert text.count(old) == 1, old
    return {**SOURCES, file: text.replace(old, new)}


# (file, old, new, KV blocks, the violation kinds it may give, what the message names)
PLANTED = {
    "relay-kPeerKFull-arrival": (
        PAIR, "bar_arrive_cta(bar_ptr<T, Bar::kPeerKFull>(ss, ks), 0);", "", 1,
        {"deadlock"}, "",
    ),
    "softmax-kPFull-arrival": (
        SOFTMAX, "arrive_mma<T>(bar_ptr<T, Bar::kPFull>(ss, b));", "", 1, {"deadlock"}, "",
    ),
    "kPFull-128-arrivals": (
        PAIR, "{Bar::kPFull,       BarCopies::kPerSBuffer, 256},",
        "{Bar::kPFull,       BarCopies::kPerSBuffer, 128},", 1,
        {"stale read", "phase", "arrivals", "overwrite", "deadlock"}, "",
    ),
    "kORescaled-128-arrivals": (
        PAIR, "{Bar::kORescaled,   BarCopies::kPerQTile, 256},",
        "{Bar::kORescaled,   BarCopies::kPerQTile, 128},", 1,
        {"stale read", "phase", "arrivals", "overwrite", "deadlock"}, "",
    ),
    # a multicast commit made a single-CTA one: the odd CTA's softmax never sees its S
    "kSFull-commit-one-cta": (
        PAIR, "elected_umma_commit_pair(bar_ptr<T, Bar::kSFull>(ss, b));",
        "elected_umma_commit(bar_ptr<T, Bar::kSFull>(ss, b));", 1, {"deadlock"}, "",
    ),
    # ... or the odd CTA's load tail never sees its V stage free
    "kVEmpty-commit-one-cta": (
        PAIR, "elected_umma_commit_pair(bar_ptr<T, Bar::kVEmpty>(ss, vs));",
        "elected_umma_commit(bar_ptr<T, Bar::kVEmpty>(ss, vs));", 1, {"deadlock"}, "",
    ),
    # the tail without its kVEmpty wait: block 0's multicast kVEmpty commit may be in flight
    # when both CTAs leave
    "tail-kVEmpty-wait": (
        PAIR, """    bar_wait_cluster(bar_ptr<T, Bar::kVEmpty>(ss, v_free.index(T::kStages)),
                     v_free.parity(T::kStages) ^ 1u);
    ++v_free.count;
  }
}""", """    ++v_free.count;
  }
}""", 1, {"exit"}, "kVEmpty",
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", list(PLANTED))
def test_planted_mutation_is_caught(name):
    file, old, new, blocks, kinds, word = PLANTED[name]
    res, _ = se.explore_fwd2(
        se.Fwd2Config(blocks=blocks), _mutate(file, old, new), stop_on=set(ms.KINDS)
    )
    assert res.violations, name
    assert res.kinds() <= kinds, res.violations[:2]
    assert any(word in msg for _, msg in res.violations), res.violations[:2]


@pytest.mark.parametrize("bar", ["kKEmpty", "kVEmpty"])
def test_load_loop_empty_wait_matters_from_the_third_block(bar):
    # The load loop's kKEmpty / kVEmpty waits pass on the start phase while every stage is filled
    # for the first time (1 and 2 blocks: the mutation run finds their deletion equivalent);
    # the third block reuses stage 0, and without the wait its TMA overwrites block 0's K / V
    # before the MMA read it (found at once: the search stops at the first violation).
    m = {mu.key(): mu for mu in ms.enumerate_mutants(SOURCES, "fwd2")}[
        f"delete-wait bar_wait_cluster({bar}) in load_role_pair"
    ]
    res, _ = se.explore_fwd2(se.Fwd2Config(blocks=3), m.apply(SOURCES), stop_on={"overwrite"})
    assert "overwrite" in res.kinds(), res.violations[:2]


def test_random_fwd2_mutants():
    # 2 mutants per run of tools/mutate_sync.py's fwd2 set (FA4_MUTANT_SEED replays a sample);
    # a killed one stops at its first violation: under 6 s each with 1 and 2 KV blocks. The full
    # run is `python tools/mutate_sync.py --all --kernel fwd2` (docs/testing.md).
    seed = int(os.environ.get("FA4_MUTANT_SEED", time.time()))
    print(f"FA4_MUTANT_SEED={seed}")
    base = ms.Baseline(SOURCES, "fwd2")
    pool = [m for m in ms.enumerate_mutants(SOURCES, "fwd2") if m.key() not in ms.REDUNDANT_FWD2]
    assert len(pool) == 68
    for m in random.Random(seed).sample(pool, 2):
        status, why = ms.evaluate(m, base)
        assert status == "killed", f"{m.describe()}: {status}: {why}"

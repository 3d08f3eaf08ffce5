"""Protocol model of the SM100 2-CTA forward (csrc/sm100/fwd/kernel_2cta.cuh, Note [fwd 2-CTA]),
its role programs extracted from the source for both CTAs of the pair (tools/sync_extract.py,
extract_fwd2): role@rank programs, @rank barrier copies of kBarriersPair, the even CTA's
multicast commits, the relay's and arrive_mma's arrivals on the even CTA's copies.

The explorer runs with Machine(exit_drained=True): the kernel ends with cluster_sync, so once
every role of both CTAs has finished the CTAs may exit; a commit or TMA load still in flight
then arrives in the shared memory of a CTA that left ("exit"). That is what the load role's
tail (its waits on the last kKEmpty / kVEmpty commits) is for, and the model sees it.

Finding (kernel bug, not fixed here: csrc is not this test's to edit): with one KV block the
tail's loop `for (s = 0; s < kStages && s < t.blocks(); ++s)` runs once, at k_free.index = 1,
a stage never used, whose "free" parity passes at once; no thread waits for the even CTA's
kVEmpty commit of block 0 (multicast to both CTAs, issued after the kOFull commit that the
correction warpgroups wait for), and both CTAs may pass the closing cluster_sync and exit with
it in flight. Without `&& s < t.blocks()` the tail's second wait is stage 0's, and the model is
clean (test_tail_without_block_bound_is_clean). Two and three blocks are clean as written
(3.9 M and 15 M states, 2 and 8 minutes: not run here).
"""

from pathlib import Path

import pytest
from helpers import load_script

pytest.importorskip("tree_sitter_cpp")

ROOT = Path(__file__).resolve().parents[2]
se = load_script(ROOT / "tools" / "sync_extract.py", "sync_extract")
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

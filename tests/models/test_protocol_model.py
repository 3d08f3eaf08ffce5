"""Protocol model of the SM100 forward kernel's barriers (tools/protocol_model.py).

Plain CPU test. The barrier table and kStages come from csrc/sm100/fwd/kernel.cuh; the role
programs mirror the kernel's loops. The kernel's protocol must show no deadlock, overwrite,
stale read or phase error in any interleaving; each mutation must be caught, which shows the
checks can fail.
"""

import re
from dataclasses import replace
from pathlib import Path

import pytest
from helpers import load_script

ROOT = Path(__file__).resolve().parents[2]
pm = load_script(ROOT / "tools" / "protocol_model.py", "protocol_model")

TABLE = pm.parse_kernel()


def test_parse_matches_kernel():
    assert TABLE.stages == 2
    # 17 rows of the 1-CTA kernel and the 2-CTA forward's three peer rows, which it has none of
    assert len(TABLE.bars) == 20
    assert [n for n, b in TABLE.bars.items() if TABLE.copies(n) == 0] == [
        "kPeerQFull",
        "kPeerKFull",
        "kPeerVFull",
    ]
    # the tile ring (Note [dynamic tiles]): 3 warpgroups + the MMA and epilogue threads
    assert TABLE.bars["kTileEmpty"].arrivals == 3 * 128 + 2
    assert TABLE.copies("kTileFull") == pm.tile_slots() == 2
    assert TABLE.bars["kPFull"].arrivals == 128 and not TABLE.bars["kPFull"].per_stage
    assert TABLE.bars["kKEmpty"].per_stage and TABLE.bars["kKEmpty"].src == "mma"
    assert TABLE.bars["kStatsFull"].src == "softmax_t"


@pytest.mark.parametrize(
    "tiles, stages",
    [((3,), None), ((1, 1), None), ((3,), 1)],
    ids=["N3", "two-tiles-N1", "N3-kStages1"],
)
def test_kernel_protocol_is_clean(tiles, stages):
    # (1, 1): two consecutive work tiles, so that kQEmpty and kOEmpty are waited on a second
    # time and every Ring counter carries over a tile boundary (larger two-tile cases take
    # too long for CI: `python tools/protocol_model.py 2 2`).
    res = pm.explore(TABLE, pm.Config(tiles=tiles, stages=stages))
    print(f"tiles {tiles}, kStages {stages or TABLE.stages}: {res.states} states explored")
    assert res.violations == []
    assert res.states > 1000


# (description, config, expected violation kind)
MUTATIONS = [
    (
        "load skips the kKEmpty wait of K block 2 (stage 0 reused)",
        pm.Config(drop={("load", "Wait", "kKEmpty", 2)}),
        "overwrite",
    ),
    (
        "load skips the kVEmpty wait of V block 2",
        pm.Config(drop={("load", "Wait", "kVEmpty", 2)}),
        "overwrite",
    ),
    (
        "mma skips the first kPFull wait of Q tile 0 (P read before written)",
        pm.Config(drop={("mma", "Wait", "kPFull", 0)}),
        "stale read",
    ),
    (
        "mma skips the second kORescaled wait (O added before rescale)",
        pm.Config(drop={("mma", "Wait", "kORescaled", 2)}),
        "stale read",
    ),
    # Per block the wait is implied by kORescaled -> PV -> S -> kSFull (dropping softmax0's
    # second one finds nothing); it matters before the 1/l message and before the next
    # tile's first factor, which nothing else orders after the correction's read.
    (
        "softmax0 skips the kStatsEmpty wait before its 1/l, LSE message",
        pm.Config(drop={("softmax0", "Wait", "kStatsEmpty", 3)}),
        "overwrite",
    ),
    (
        "softmax0 skips the kStatsEmpty wait of the second tile's first factor",
        pm.Config(tiles=(1, 1), drop={("softmax0", "Wait", "kStatsEmpty", 2)}),
        "overwrite",
    ),
    (
        "mma's first kKFull wait with the wrong parity",
        pm.Config(flip={("mma", "kKFull", 0)}),
        "phase",
    ),
    (
        "softmax1's second kSFull wait with the wrong parity",
        pm.Config(flip={("softmax1", "kSFull", 1)}),
        "phase",
    ),
    (
        "load's first kQEmpty wait with the wrong parity",
        pm.Config(flip={("load", "kQEmpty", 0)}),
        "deadlock",
    ),
    (
        "tcgen05 MMAs complete out of issue order (S_t(i+1) over P_t(i) before PV_t(i))",
        pm.Config(mma_in_order=False),
        "overwrite",
    ),
    # kOEmpty alone is implied by kORescaled (the correction arrives on the next tile's first
    # kORescaled after its epilogue); without both, the next tile's PV overwrites O.
    (
        "mma skips kOEmpty and kORescaled of the second tile's first block",
        pm.Config(
            tiles=(1, 1), drop={("mma", "Wait", "kOEmpty", 2), ("mma", "Wait", "kORescaled", 2)}
        ),
        "overwrite",
    ),
    (
        "load skips kQEmpty in the second tile (Q overwritten while S MMAs pending)",
        pm.Config(tiles=(1, 1), drop={("load", "Wait", "kQEmpty", 2)}),
        "overwrite",
    ),
]


@pytest.mark.parametrize("desc, cfg, kind", MUTATIONS, ids=[m[0] for m in MUTATIONS])
def test_mutation_is_caught(desc, cfg, kind):
    res = pm.explore(TABLE, cfg, stop_on={kind})
    found = [msg for k, msg in res.violations if k == kind]
    print(f"{desc}: {kind}: {found[:1]} after {res.states} states")
    assert kind in res.kinds(), res.violations


def test_arrival_count_mutation_is_caught():
    # kPFull expecting two warpgroups: the phase never completes and the MMA thread hangs.
    bars = dict(TABLE.bars, kPFull=replace(TABLE.bars["kPFull"], arrivals=256))
    res = pm.explore(pm.Table(bars, TABLE.stages), pm.Config(tiles=(1,)), stop_on={"deadlock"})
    assert "deadlock" in res.kinds()
    # ... or one thread: 128 arrivals overrun it.
    bars = dict(TABLE.bars, kPFull=replace(TABLE.bars["kPFull"], arrivals=1))
    res = pm.explore(pm.Table(bars, TABLE.stages), pm.Config(tiles=(1,)), stop_on={"arrivals"})
    assert "arrivals" in res.kinds()


def test_tile_ring_mutations_are_caught():
    """Note [dynamic tiles]: the load thread may rewrite a ring slot only after every reader
    took its item, and the arrival count must be the readers' threads."""
    # The load thread's wait before the third item (slot 0's second use, its first wait on the
    # ring) passes a phase early: the slot is rewritten while readers still need the first item.
    early = pm.Config(tiles=(1, 1), flip={("load", "kTileEmpty", 0)})
    res = pm.explore(TABLE, early, stop_on={"phase", "overwrite"})
    assert res.kinds() & {"phase", "overwrite"}, res.violations
    # The MMA and epilogue threads left out of the count: their arrivals overrun the phase.
    bars = dict(TABLE.bars, kTileEmpty=replace(TABLE.bars["kTileEmpty"], arrivals=3 * 128))
    res = pm.explore(pm.Table(bars, TABLE.stages), pm.Config(tiles=(1,)), stop_on={"arrivals"})
    assert "arrivals" in res.kinds()
    # An extra reader counted that never reads: the load thread hangs before the third item.
    bars = dict(TABLE.bars, kTileEmpty=replace(TABLE.bars["kTileEmpty"], arrivals=3 * 128 + 3))
    res = pm.explore(pm.Table(bars, TABLE.stages), pm.Config(tiles=(1, 1)), stop_on={"deadlock"})
    assert "deadlock" in res.kinds()


@pytest.mark.parametrize(
    "kernel", ["sm100/fwd/kernel.cuh", "sm100/bwd/kernel.cuh", "sm100/bwd/kernel_2cta.cuh"]
)
def test_every_sm100_kernel_writes_one_table_form(kernel):
    """The three SM100 kernels declare their barriers in csrc/common/barrier_table.cuh's form,
    which parse_bar_table reads for all three models."""
    text = (ROOT / "csrc" / kernel).read_text()
    assert "BarrierTable<kBarriers, " in text
    lines, kinds, rows = pm.parse_bar_table(text)
    assert [name for name, _, _ in rows] == list(lines)
    assert all(kind in kinds and arrivals >= 1 for _, kind, arrivals in rows)


def test_table_drift_fails_loudly():
    text = pm.KERNEL.read_text()
    # A barrier added to the kernel but not to the model's programs.
    extra = text.replace(
        "  kCount\n",
        "  kFoo,  // from load to mma, protects nothing: test\n  kCount\n",
    ).replace(
        "    {Bar::kPeerVFull,   BarCopies::kNone,       1},\n",
        "    {Bar::kPeerVFull,   BarCopies::kNone,       1},\n"
        "    {Bar::kFoo,         BarCopies::kPerQTile, 1},\n",
    )
    with pytest.raises(ValueError, match="kFoo is in kBarriers but no role program uses it"):
        pm.Model(pm.parse_kernel(extra), pm.Config(tiles=(1,)))
    # A barrier the programs use but the table lost.
    missing = re.sub(r"\s*\{Bar::kVEmpty,[^}]*\},", "", text)
    missing = missing.replace("  kVEmpty,", "  // kVEmpty removed")
    with pytest.raises(ValueError, match="kVEmpty"):
        pm.Model(pm.parse_kernel(missing), pm.Config(tiles=(1,)))
    # The table out of the enum's order (the kernel static_asserts the same).
    swapped = text.replace("{Bar::kQFull,", "{Bar::kTmp,").replace(
        "{Bar::kQEmpty,", "{Bar::kQFull,"
    )
    with pytest.raises(ValueError, match="kBarriers rows"):
        pm.parse_kernel(swapped.replace("{Bar::kTmp,", "{Bar::kQEmpty,"))
    # A role arriving on a barrier its comment does not name.
    wrong = re.sub(r"kPFull,(\s*)// from softmax_t to mma", r"kPFull,\1// from load to mma", text)
    assert wrong != text
    with pytest.raises(ValueError, match="softmax0 arrives on kPFull, whose comment says load"):
        pm.Model(pm.parse_kernel(wrong), pm.Config(tiles=(1,)))


# ---- hd 256: one Q tile, double-buffered S (Note [one-tile order]) ---------------------------
@pytest.mark.parametrize("tiles", [(3,), (1, 1), (2, 2), (4,)], ids=lambda t: "-".join(map(str, t)))
@pytest.mark.parametrize("stages", [None, 1])
def test_one_tile_protocol_is_clean(tiles, stages):
    res = pm.explore(TABLE, pm.Config(tiles=tiles, stages=stages, q_tiles=1))
    assert res.violations == []
    assert res.states > 500


@pytest.mark.parametrize(
    "what, cfg, kind",
    [
        ("mma skips its first kPFull wait", {"drop": {("mma", "Wait", "kPFull", 0)}}, "stale read"),
        ("MMAs out of order: S(2) over P(0) before PV(0)", {"mma_in_order": False}, "overwrite"),
        (
            "load skips kKEmpty of K block 2",
            {"drop": {("load", "Wait", "kKEmpty", 2)}},
            "overwrite",
        ),
        ("softmax0 waits S(2) on the wrong parity", {"flip": {("softmax0", "kSFull", 2)}}, "phase"),
    ],
    ids=lambda x: x if isinstance(x, str) else "",
)
def test_one_tile_mutations_are_caught(what, cfg, kind):
    res = pm.explore(TABLE, pm.Config(tiles=(3,), q_tiles=1, **cfg), stop_on={kind})
    assert kind in res.kinds(), (what, res.violations[:3])


@pytest.mark.parametrize("q_tiles", [2, 1])
def test_epilogue_staging_mutations_are_caught(q_tiles):
    """Note [sm100 TMA-store epilogue]: the epilogue warp must wait for the staged O, and the
    correction warpgroup for the previous store to have read the staging buffer."""
    drop_full = pm.Config(
        tiles=(1, 1), q_tiles=q_tiles, drop={("epilogue", "Wait", "kOStageFull", 0)}
    )
    assert "stale read" in pm.explore(TABLE, drop_full, stop_on={"stale read"}).kinds()
    drop_empty = pm.Config(
        tiles=(1, 1), q_tiles=q_tiles, drop={("correction", "Wait", "kOStageEmpty", 1)}
    )
    assert "overwrite" in pm.explore(TABLE, drop_empty, stop_on={"overwrite"}).kinds()

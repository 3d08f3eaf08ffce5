"""Protocol models of the SM90 forward and backward (d <= 128) kernels and of the decode
kernel, their role programs extracted from the source (tools/sync_extract_sm90.py,
tools/sync_extract_sm90_bwd.py), and a sample of their sync mutants (tools/mutate_sync.py
--kernel sm90fwd / sm90bwd / decode).

Plain CPU test; needs tree-sitter and tree-sitter-cpp (requirements.txt). The full mutation
runs are `python tools/mutate_sync.py --all --kernel sm90fwd` (sm90bwd, decode; docs/testing.md,
"Mutation score").
"""

import dataclasses
import os
import random
import re
import time
from pathlib import Path

import pytest
from helpers import load_script

pytest.importorskip("tree_sitter_cpp")

ROOT = Path(__file__).resolve().parents[2]
pm = load_script(ROOT / "tools" / "protocol_model.py", "protocol_model")
se = load_script(ROOT / "tools" / "sync_extract.py", "sync_extract")
s9 = load_script(ROOT / "tools" / "sync_extract_sm90.py", "sync_extract_sm90")
sb = load_script(ROOT / "tools" / "sync_extract_sm90_bwd.py", "sync_extract_sm90_bwd")
ms = load_script(ROOT / "tools" / "mutate_sync.py", "mutate_sync")

FWD = se.read_sources(ROOT, s9.FWD90_FILES)
DECODE = se.read_sources(ROOT, s9.DECODE_FILES)
BWD = se.read_sources(ROOT, sb.BWD90_FILES)


@pytest.mark.parametrize(
    "cfg",
    [
        s9.Fwd90Config(tiles=(5,)),
        s9.Fwd90Config(tiles=(1, 2)),
        s9.Fwd90Config(tiles=(0, 2)),
        s9.Fwd90Config(tiles=(2, 2), q_stages=1),
        s9.Fwd90Config(tiles=(3, 1), wgs=3, idle=((0, 1),)),
        s9.Fwd90Config(tiles=(4,), wgs=3, sliced=((0, 0, 2), (0, 1, 1))),
        s9.Fwd90Config(tiles=(3,), wgs=1),
    ],
    ids=["N5", "two-tiles", "empty-tile", "one-q-buffer", "idle-wg", "sliced", "one-wg"],
)
def test_extracted_sm90_fwd_is_clean(cfg):
    progs = s9.extract_fwd90(cfg, FWD)
    assert set(progs) == {"producer"} | {f"consumer{g}" for g in range(cfg.wgs)}
    res, _ = s9.explore(s9.extract_fwd90, cfg, FWD)
    print(f"{cfg}: {res.states} states")
    assert res.violations == []
    assert res.states > 100


def test_sm90_fwd_barrier_table():
    # The inits the producer thread runs, with CUTLASS's pipeline counts (one arrival per
    # consumer warpgroup on empty) and the ping-pong's named barriers of 256 threads.
    progs = s9.extract_fwd90(s9.Fwd90Config(tiles=(2,), wgs=3, q_stages=2, stages=2), FWD)
    assert progs.bars == {
        "q_full": (2, 1), "q_empty": (2, 384), "tile_full": (2, 1), "tile_empty": (2, 384),
        "pipe_k.full": (2, 1), "pipe_k.empty": (2, 3), "pipe_v.full": (2, 1),
        "pipe_v.empty": (2, 3), "named0": (1, 256), "named1": (1, 256), "named2": (1, 256),
    }  # fmt: skip
    # the epilogue's per-warpgroup barrier orders threads of one modelled process only
    assert any(f == "csrc/sm90/fwd/epilogue.cuh" for f, _ in s9.INTERNAL_BARRIERS)


@pytest.mark.parametrize(
    "cfg",
    [
        sb.hd128((2, 1)),
        sb.hd128((1, 2), tma_store=False),
        sb.hd128((1,), group=2),
        sb.hd64((2, 1)),
        sb.hd64((1, 2), dq_regs=False),
        sb.hd256((1, 2)),
        sb.hd256((2, 1), deterministic=True),
        sb.hd128((2, 1), tma_store=False, group=2, slices=True),
        sb.hd128((1, 0, 2), tma_store=False, slices=True),
        sb.hd64((2, 1), slices=True),
        sb.hd256((1, 2), slices=True),
    ],
    ids=["hd128-tma-store", "hd128-row-stores", "hd128-gqa", "hd64", "hd64-deterministic",
         "split", "split-deterministic", "hd128-slices", "hd128-slices-empty-tile", "hd64-slices",
         "split-slices"],
)  # fmt: skip
def test_extracted_sm90_bwd_is_clean(cfg):
    progs = sb.extract_bwd90(cfg, BWD)
    roles = {"producer", "consumer0", "consumer1"}
    assert set(progs) == (roles if cfg.split else roles | {"reducer"})  # split: no reducer
    res, _ = s9.explore(sb.extract_bwd90, cfg, BWD)
    print(f"{cfg}: {res.states} states")
    assert res.violations == []
    assert res.states > 1000


def test_sm90_bwd_barrier_table():
    # kv_full / kv_empty, the tile ring (read by both warpgroups and the reducer warp), the two
    # pipelines, and the named barriers of enum BwdBarrier with their calls' counts
    progs = sb.extract_bwd90(sb.hd128((1,)), BWD)
    assert progs.bars == {
        "kv_full": (1, 1), "kv_empty": (1, 256), "tile_full": (2, 1), "tile_empty": (2, 288),
        "pipe_q.full": (2, 1), "pipe_q.empty": (2, 2), "pipe_do.full": (2, 1),
        "pipe_do.empty": (2, 2), "named0": (1, 256), "named1": (1, 160), "named2": (1, 160),
        "named3": (1, 160), "named4": (1, 160), "named5": (1, 288), "named6": (1, 256),
        "named7": (1, 288),
    }  # fmt: skip
    # hd64 without the reducer's dQ traffic: no kDqFull / kDqEmpty, no TMA-store barriers
    assert set(sb.extract_bwd90(sb.hd64((1,)), BWD).bars) == {
        "kv_full", "kv_empty", "tile_full", "tile_empty", "pipe_q.full", "pipe_q.empty",
        "pipe_do.full", "pipe_do.empty", "named0",
    }  # fmt: skip


@pytest.mark.parametrize(
    "cfg",
    [
        s9.DecodeConfig(blocks=1),
        s9.DecodeConfig(blocks=5, stages=2),
        s9.DecodeConfig(blocks=4, stages=4),
        s9.DecodeConfig(blocks=2, fp8=True, warps_n=2),
        s9.DecodeConfig(blocks=3, variant=3, paths="ttg"),
        s9.DecodeConfig(blocks=5, stages=3, variant=3, paths="tgtgt"),
        s9.DecodeConfig(blocks=2, variant=3, fp8=True, warps_n=2, paths="tg"),
        s9.DecodeConfig(blocks=4, variant=3, paths="bgbt"),
        s9.DecodeConfig(blocks=3, variant=3, fp8=True, warps_n=2, paths="bbg"),
    ],
    ids=["1-block", "5-blocks", "4-stages", "fp8", "tma-gathered-last",
         "tma-alternating", "fp8-tma", "tma-boxes", "fp8-tma-boxes"],
)  # fmt: skip
def test_extracted_decode_is_clean(cfg):
    res, _ = s9.explore(s9.extract_decode, cfg, DECODE)
    print(f"{cfg}: {res.states} states")
    assert res.violations == []
    assert res.states > 1000


def _sync(prog):
    return [(type(op.step).__name__, op.step.bar, op.step.idx) for op in prog
            if isinstance(op.step, (pm.Wait, pm.Arrive, pm.Tma))]  # fmt: skip


@pytest.mark.parametrize("blocks, stages", [(1, 2), (5, 2), (7, 3)])
def test_decode_equals_ring_formula(blocks, stages):
    # Cross-check against the ring of tests/models/test_decode_ring_model.py: the producer
    # waits on empty[it % S] with parity (it / S - 1) & 1 once it >= S, then fills the stage
    # (32 lanes' cp.async arrivals on full); each consumer warp waits on full[it % S] with
    # parity (it / S) & 1 and releases empty; before the loop, the bar.sync 1 that publishes the
    # query tile the consumers load (Note [stream first]); after it, the epilogue's two.
    # Variant 3 (Note [tma blocks]): a TMA block's fill is lane 0's transaction (one arrival
    # when K's and V's tiles land) and lanes 1-31's 31 plain arrivals, after the same wait; by
    # boxes (Note [tma boxes]) the same step, its boxes parts of the same K and V writes.
    paths = (
        "t" * blocks,
        ("tg" * blocks)[:blocks],
        "g" * (blocks - 1) + "t",
        ("bgt" * blocks)[:blocks],
    )
    for variant, path in [(2, "")] + [(3, p) for p in paths]:
        progs = s9.extract_decode(s9.DecodeConfig(blocks=blocks, stages=stages, variant=variant,
                                                  paths=path), DECODE)  # fmt: skip
        prod = []
        for it in range(blocks):
            s = it % stages
            if it >= stages:
                prod.append(pm.Wait("empty", s, (it // stages - 1) & 1))
            if path and path[it] in "tb":
                prod += [("Tma", "full", s, 1, f"K{s}", f"V{s}"), pm.Arrive("full", s, 31)]
            else:
                prod.append(("Tma", "full", s, 32, f"K{s}", f"V{s}"))
        steps = [op.step for op in progs["producer"]]
        got = [(st.bar, st.idx, st.parity) if isinstance(st, pm.Wait) else
               ("Tma", st.bar, st.idx, st.count, st.buf, *(b for b, _, _ in st.more))
               if isinstance(st, pm.Tma) else st for st in steps]  # fmt: skip
        assert got == [(w.bar, w.idx, w.parity) if isinstance(w, pm.Wait) else w for w in prod]
        for w in range(4):
            want = [("Arrive", "named1", 0), ("Wait", "named1", 0)]
            for it in range(blocks):
                want += [("Wait", "full", it % stages), ("Arrive", "empty", it % stages)]
            want += [("Arrive", "named1", 0), ("Wait", "named1", 0)] * 2
            assert _sync(progs[f"consumer{w}"]) == want
        assert progs.bars == {"full": (stages, 32), "empty": (stages, 128), "named1": (1, 128)}


def test_decode_variants_have_the_same_protocol():
    # Variant 3 with every block gathered is variant 2's gather (into the swizzled tiles); with
    # TMA blocks only the producer's fill of those blocks differs
    # (test_decode_equals_ring_formula)
    steps = lambda p: {r: [op.step for op in ops] for r, ops in p.items()}  # noqa: E731
    for fp8, warps_n in ((False, 1), (True, 2)):
        cfgs = [s9.DecodeConfig(blocks=4, variant=v, fp8=fp8, warps_n=warps_n, paths=p)
                for v, p in ((2, ""), (3, "gggg"))]  # fmt: skip
        a, *rest = [s9.extract_decode(c, DECODE) for c in cfgs]
        for c, b in zip(cfgs[1:], rest, strict=True):
            assert steps(b) == steps(a), c
            assert b.bars == a.bars, c
        tma = s9.extract_decode(s9.DecodeConfig(blocks=4, variant=3, fp8=fp8, warps_n=warps_n,
                                                paths="tgtt"), DECODE)  # fmt: skip
        consumers = lambda p: {r: s for r, s in steps(p).items() if r != "producer"}  # noqa: E731
        assert steps(tma)["producer"] != steps(a)["producer"]
        assert consumers(tma) == consumers(a)


@pytest.fixture(scope="module")
def kernels():
    out = {}
    for name, sources in (("sm90fwd", FWD), ("sm90bwd", BWD), ("decode", DECODE)):
        out[name] = (ms.enumerate_mutants(sources, name), ms.Baseline(sources, name))
    return out


def _call_lines(text, pattern):
    return {i + 1 for i, line in enumerate(text.splitlines())
            if re.search(pattern, line) and not line.lstrip().startswith("//")}  # fmt: skip


def test_mutants_cover_every_sync_site(kernels):
    fwd, _ = kernels["sm90fwd"]
    lines = {(m.file, m.line) for m in fwd if m.op in ("delete-wait", "delete-arrive")}
    kernel = "csrc/sm90/fwd/kernel.cuh"
    sites = _call_lines(FWD[kernel], r"consumer_wait\(|consumer_release\(|producer_tail\(|"
                        r"\]\.wait\(|\]\.arrive|NamedBarrier::(sync|arrive)")  # fmt: skip
    assert sites and {(kernel, n) for n in sites} <= lines
    assert {m.op for m in fwd} == {"delete-wait", "delete-arrive", "flip-parity", "move-wait",
                                   "arrivals+1", "arrivals-1"}  # fmt: skip
    dec, _ = kernels["decode"]
    lines = {(m.file, m.line) for m in dec if m.op in ("delete-wait", "delete-arrive")}
    kernel = "csrc/decode/kernel.cuh"
    sites = _call_lines(DECODE[kernel], r"wait_barrier\(&|cp_async_arrive\(&|"
                        r"ClusterBarrier::arrive\(|arrive_and_expect_tx\(&|bar\.sync")  # fmt: skip
    assert sites and {(kernel, n) for n in sites} <= lines
    bwd, _ = kernels["sm90bwd"]
    lines = {(m.file, m.line) for m in bwd if m.op in ("delete-wait", "delete-arrive")}
    for file in ("csrc/sm90/bwd/consumer.cuh", "csrc/sm90/bwd/consumer_split.cuh",
                 "csrc/sm90/bwd/epilogue.cuh"):  # fmt: skip
        sites = _call_lines(BWD[file], r"consumer_wait\(|consumer_release\(|\.wait\(|"
                            r"\.arrive\(|NamedBarrier::(sync|arrive)")  # fmt: skip
        assert sites and {(file, n) for n in sites} <= lines, file


def test_decode_sync_sites_executed(kernels):
    # Every decode wait and arrival (deleted: a mutant) is executed by some configuration of
    # the mutation run: variant 3's TMA-path expect_tx and plain arrivals by its TMA blocks.
    # A site none executes would be an "equivalent" mutant the configurations cannot kill.
    mutants, base = kernels["decode"]
    assert ms.unexecuted(DECODE, mutants, base.kernel) == []
    assert any(m.what.startswith("arrive_and_expect_tx(") for m in mutants)


V3_CONFIGS = tuple(c for c in ms.CONFIGS_DECODE if c.variant == 3)


@pytest.fixture(scope="module")
def decode_v3():
    # the decode mutation run restricted to its variant-3 configurations
    return ms.Baseline(DECODE, dataclasses.replace(ms.KERNELS["decode"], configs=V3_CONFIGS))


@pytest.mark.parametrize(
    "op, what, kind",
    [
        # without lane 0's expect_tx, its TMA copies have none (the extractor refuses)
        ("delete-arrive", "arrive_and_expect_tx(&full[stage]) in decode_kernel", "extractor"),
        # without lanes 1-31's arrivals full[] never completes (32 arrivals: 1 + 31)
        ("delete-arrive", "arrive(&full[stage]) in decode_kernel", "deadlock"),
        ("delete-wait", "wait_barrier(&empty[stage]) in decode_kernel", "overwrite"),
        ("flip-parity", "wait_barrier(&empty[stage]) in decode_kernel", "phase"),
        # the wait moved after the `if constexpr (kTma)` block: a TMA block skips it
        ("move-wait", "wait_barrier(&empty[stage]) in decode_kernel", "overwrite"),
        ("arrivals-1", "init &full[s] 32 in decode_kernel", "arrivals"),
        ("arrivals+1", "init &full[s] 32 in decode_kernel", "deadlock"),
        ("delete-wait", "wait_barrier(&full[stage]) in decode_kernel", "stale read"),
    ],
)  # fmt: skip
def test_decode_tma_mutants_killed(kernels, decode_v3, op, what, kind):
    assert V3_CONFIGS and all("t" in c.paths for c in V3_CONFIGS)
    mutants, _ = kernels["decode"]
    (m,) = [m for m in mutants if m.op == op and m.what == what]
    status, why = ms.evaluate(m, decode_v3)
    assert status == "killed" and why.startswith(kind), why
    assert kind == "extractor" or "variant 3" in why, why


@pytest.mark.parametrize(
    "kernel, op, what, kind",
    [
        ("sm90fwd", "delete-wait", "consumer_wait(v_state) in consumer/issue_pv", "stale read"),
        ("sm90fwd", "delete-arrive", "arrive() in consumer/s_done", "deadlock"),
        ("sm90fwd", "delete-wait", "wait(&empty[slot]) in publish_item", "overwrite"),
        ("sm90bwd", "delete-wait", "sync(T::kConsumerThreads) in bwd_consumer", "stale read"),
        (
            "sm90bwd",
            "delete-wait",
            "sync(kHalfBarrierThreads) in bwd_dq_reducer_tile #2",
            "stale read",
        ),
        ("sm90bwd", "delete-wait", "sync(T::kConsumerThreads) in stage_dk_dv_tma", "overwrite"),
        ("sm90bwd", "delete-wait", "sync(T::kConsumerThreads) in bwd_consumer_split", "stale read"),
        ("sm90bwd", "delete-wait", "sync(threads) in dq_turn_pass_all", "overwrite"),
        ("decode", "delete-wait", "bar.sync in decode_kernel", "phase"),  # Q's (stream first)
        ("decode", "delete-wait", "bar.sync in decode_kernel #2", "overwrite"),
        ("decode", "flip-parity", "wait_barrier(&empty[stage]) in decode_kernel", "phase"),
    ],
)
def test_reviewer_mutants_killed(kernels, kernel, op, what, kind):
    mutants, base = kernels[kernel]
    (m,) = [m for m in mutants if m.op == op and m.what == what]
    status, why = ms.evaluate(m, base)
    assert status == "killed" and why.startswith(kind), why


def test_random_mutants(kernels):
    # 8 mutants per run, a different sample each run (FA4_MUTANT_SEED=<seed> replays one).
    # Ops the full run shows equivalent or redundant are skipped (their check explores every
    # configuration to the end).
    seed = int(os.environ.get("FA4_MUTANT_SEED", time.time()))
    print(f"FA4_MUTANT_SEED={seed}")
    pool = [(m, base, k) for name, (mutants, base) in kernels.items() for m in mutants
            if m.key() not in (k := ms.KERNELS[name]).redundant
            and m.key() not in (k.safe_only or {})]  # fmt: skip
    for m, base, _ in random.Random(seed).sample(pool, 8):
        status, why = ms.evaluate(m, base)
        assert status == "killed", f"{m.describe()}: {status}: {why}"


@pytest.mark.parametrize(
    "sources, file, old, new, message",
    [
        # a pipeline call whose state the interpreter cannot know
        (FWD, "csrc/sm90/fwd/kernel.cuh", "pipe_k.consumer_wait(k_state);\n        ss.trace",
         "pipe_k.consumer_wait(states[wg]);\n        ss.trace", "without a known state"),
        # a TMA copy whose barrier has no expect_tx
        (FWD, "csrc/sm90/fwd/kernel.cuh", "ss.q_full[q_slot].arrive_and_expect_tx(T::kQBytes);",
         "", "without its arrive_and_expect_tx"),
        # a barrier wait under a condition that is neither known nor an oracle
        (DECODE, "csrc/decode/kernel.cuh", "if (it >= T::kStages) detail::wait_barrier",
         "if (p.page_size > 1) detail::wait_barrier", "opaque condition"),
    ],
)  # fmt: skip
def test_extractor_fails_loudly(sources, file, old, new, message):
    assert old in sources[file]
    mutated = {**sources, file: sources[file].replace(old, new, 1)}
    extract = s9.extract_fwd90 if sources is FWD else s9.extract_decode
    cfg = s9.Fwd90Config(tiles=(2, 1)) if sources is FWD else s9.DecodeConfig(blocks=3)
    with pytest.raises(se.ExtractError, match=message):
        extract(cfg, mutated)


@pytest.mark.parametrize(
    "old, new, message",
    [
        # every lane of a TMA block announcing the transaction (the lane branch removed)
        ("if (lane == 0) {", "if (true) {", "arrive_and_expect_tx by 32 threads"),
        # a wait on one side of the lane branch: its lanes would not wait for the other side
        ("cutlass::arch::ClusterBarrier::arrive(&full[stage]);",
         "detail::wait_barrier(&full[stage], 0);", "a wait under a branch on the lane"),
        # TMA copies with no expect_tx before them
        ("cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&full[stage],",
         "(void)(&full[stage],", "without its arrive_and_expect_tx"),
    ],
)  # fmt: skip
def test_decode_tma_extractor_fails_loudly(old, new, message):
    file = "csrc/decode/kernel.cuh"
    assert DECODE[file].count(old) == 1
    mutated = {**DECODE, file: DECODE[file].replace(old, new, 1)}
    with pytest.raises(se.ExtractError, match=message):
        s9.extract_decode(s9.DecodeConfig(blocks=3, variant=3, paths="tgt"), mutated)


def test_decode_tma_needs_paths():
    # tma_block's vote is the Config's: a variant-3 run without a path per block is refused
    for paths in ("", "tg", "tgx"):
        with pytest.raises(ValueError, match="a path of 't' / 'b' / 'g' per block"):
            s9.extract_decode(s9.DecodeConfig(blocks=3, variant=3, paths=paths), DECODE)
    with pytest.raises(ValueError, match="variant 3 only"):
        s9.extract_decode(s9.DecodeConfig(blocks=3, variant=2, paths="ttt"), DECODE)

#!/usr/bin/env python3
"""Mutation harness for the extracted protocol models (tools/sync_extract.py,
tools/sync_extract_sm90.py, tools/sync_extract_sm90_bwd.py).

Enumerates every sync operation of the covered sources (the functions a kernel's extraction
runs; --kernel fwd: the SM100 forward, csrc/sm100/fwd/*.cuh and csrc/common/tile_ring.cuh;
--kernel fwd2: the SM100 2-CTA forward, csrc/sm100/fwd/kernel_2cta.cuh with the shared roles;
--kernel bwd: the SM100 1-CTA backward with its head-dim split, csrc/sm100/bwd/kernel.cuh,
roles.cuh, compute.cuh; --kernel bwd2: the 2-CTA backward, kernel_2cta.cuh, roles_2cta.cuh;
--kernel sm90fwd / sm90bwd: the SM90 forward and the d <= 128 backward, csrc/sm90/fwd/*.cuh,
csrc/sm90/bwd/*.cuh, csrc/sm90/common.cuh, the tile ring; --kernel decode:
csrc/decode/kernel.cuh) and applies one mutation at a time to a copy of the source text, in
memory (the real files are only read):
  delete-wait     blank a bar_wait / ClusterBarrier::wait call
  delete-arrive   blank a bar_arrive / ClusterBarrier::arrive / arrive_and_expect_tx call
  delete-commit   blank a umma_commit call
  flip-parity     parity P of a wait -> (P) ^ 1u
  move-wait       the wait's statement moved after the next statement of its block that
                  performs an operation (the operation it guards)
  arrivals+1/-1   one kBarriers row's arrival count changed (not a kNone row: no copy)
The SM90 and decode kernels' ops (enumerate_mutants90): ClusterBarrier waits and arrivals,
CUTLASS pipeline calls (consumer_wait, producer_acquire, producer_tail count as waits,
consumer_release as an arrival), expect_tx, cp.async arrivals, named barriers (sync: a wait,
arrive: an arrival; asm bar.sync too); flip-parity of a pipeline
state is its start phase (producer <-> consumer state); arrivals+-1 change a barrier init's
count, and a pipeline's num_consumers changes by +-128 (CUTLASS counts warpgroups).
Each mutant is extracted and explored in CONFIGS (stop at the first violation):
  killed          a violation (deadlock, overwrite, stale read, phase, arrivals, exit), or the
                  extractor refuses the mutant (a TMA copy without its expect_tx)
  equivalent      no violation, and every configuration reaches exactly the data states
                  (buffer contents and unread counts) of the unmutated kernel: the op is
                  redundant in the model
  redundant       no violation, new data states, and the kernel's safe_only list gives the
                  model's reason why the op is not needed for the checked properties
  survived        no violation, but new data states: a gap of the model (or of its tags)
A wait keeps the completion it meant in the unmutated source (its site and occurrence), so a
deleted or moved wait does not shift the meaning of the others. A configuration whose programs
the mutant leaves unchanged is skipped (SM90 / decode: their machine is the programs and their
barrier table; the SM100 machines also read the kernel text). The SM90 / decode runs first list
the delete mutants whose site no configuration executes (unexecuted): they cannot be killed.

Usage: python tools/mutate_sync.py --all [--kernel fwd|fwd2|bwd|bwd2|sm90fwd|sm90bwd|decode|all]
       python tools/mutate_sync.py --sample N [--seed S] [--kernel ...]
       python tools/mutate_sync.py --list [--kernel ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import protocol_model as pm  # noqa: E402
import sync_extract as se  # noqa: E402
import sync_extract_sm90 as s9  # noqa: E402
import sync_extract_sm90_bwd as sb  # noqa: E402

# Cheapest first: a killed mutant usually stops in the first one. Each op must matter in one
# of them: two work tiles (the tile ring wraps; kQEmpty and kOEmpty are waited on a second
# time after a tile of one block, (1, 1), and of three, (3, 1), whose kQEmpty commit is the
# loop's), and four K blocks (a K stage released by the MMA loop's commit is reused). An op
# no configuration needs is reported equivalent: the claim holds for these configurations.
CONFIGS = (
    se.FwdConfig(tiles=(1, 1), q_tiles=1),
    se.FwdConfig(tiles=(3, 1), q_tiles=1),
    se.FwdConfig(tiles=(3,), q_tiles=2),
    se.FwdConfig(tiles=(1, 1), q_tiles=2),
    se.FwdConfig(tiles=(3, 1), q_tiles=2),
)
# Ops the full run finds equivalent (docs/testing.md, "Mutation score"): the kOEmpty wait of
# both MMA roles is implied by kORescaled (the correction warpgroup arrives on the next tile's
# first kORescaled only after its epilogue read O). The CI sample skips them: showing
# equivalence explores every configuration to the end.
REDUNDANT = {
    "delete-wait bar_wait(kOEmpty) in mma_role",
    "move-wait bar_wait(kOEmpty) in mma_role",
    "delete-wait bar_wait(kOEmpty) in mma_role_one_tile",
    "move-wait bar_wait(kOEmpty) in mma_role_one_tile",
}
# The backward: one Q stage (d = 256: S(i+1) after dQ(i)) and two (d = 128 with one dO
# stage, d = 64 with two), with 2 and 3 Q blocks (the Q stages wrap; kDsEmpty and kDqEmpty
# are waited on from the second block). The split's (192, 128) and 192 rows have d = 64's
# stages and orders; only their TMEM columns differ (the clean runs of the test cover them).
CONFIGS_BWD = (
    se.BwdConfig(iters=2, head_dim=256),
    se.BwdConfig(iters=3, head_dim=256),
    se.BwdConfig(iters=2, head_dim=128),
    se.BwdConfig(iters=3, head_dim=128),
    se.BwdConfig(iters=3, head_dim=64),
)
# Ops the full backward run finds equivalent (docs/testing.md, "Mutation score"), skipped by
# the CI sample as REDUNDANT: compute's kQFull wait (implied by kSFull: the MMA waited for
# the same transaction before S(i)), compute's kDsEmpty wait (implied by kDpFull: dP(i) is
# issued after dQ(i - 1), and a commit waits for every earlier MMA), and the kKVFull wait
# moved after wait_q (the harness's "next operation" is the lambda holding another wait).
REDUNDANT_BWD = {
    "delete-wait bar_wait(kQFull) in compute_role",
    "delete-wait bar_wait(kDsEmpty) in compute_role",
    "move-wait bar_wait(kKVFull) in mma_role",
}
# The 2-CTA backward: 1 and 2 Q blocks of the pair (one stage each: the second block reuses
# every buffer and flips every parity; 713k states at 2 blocks, 3 would be ~2M).
CONFIGS_BWD2 = (se.Bwd2Config(iters=1), se.Bwd2Config(iters=2))
# Equivalent in the full 2-CTA run (docs/testing.md), skipped by the CI sample: compute's
# kQFull and kDsEmpty waits (implied by kSFull and kDpFull, as in the 1-CTA kernel), the
# load's kDoEmpty wait (its kQEmpty wait before it, dK(i)'s commit, comes after dV(i), which
# read the one dO stage), and the relay's kKVFull wait moved after its kPeerKVFull arrival
# (the MMA's S(0) also waits for the relay's kPeerQFull, which follows that wait).
REDUNDANT_BWD2 = {
    "delete-wait bar_wait_cluster(kQFull) in compute_role",
    "delete-wait bar_wait_cluster(kDsEmpty) in compute_role",
    "delete-wait bar_wait_cluster(kDoEmpty) in load_role",
    "move-wait bar_wait_cluster(kKVFull) in relay_role",
}
# The SM90 forward: two consumer warpgroups with one, two and three work tiles (the Q buffers,
# the tile ring and the K / V stages wrap), one Q buffer, three warpgroups with an idle one
# (Note [idle warpgroup]; two tiles follow it, so that its Q buffer is reused) and with
# masked-off blocks (Note [slice block end]), and one warpgroup (no ping-pong).
CONFIGS_SM90 = (
    s9.Fwd90Config(tiles=(1, 1)),
    s9.Fwd90Config(tiles=(3,)),
    s9.Fwd90Config(tiles=(2, 1, 1)),
    s9.Fwd90Config(tiles=(2, 2), q_stages=1),
    s9.Fwd90Config(tiles=(3, 1, 1), wgs=3, idle=((0, 2),)),
    s9.Fwd90Config(tiles=(4,), wgs=3, sliced=((0, 0, 2), (0, 1, 2))),
    s9.Fwd90Config(tiles=(1, 3), wgs=3, sliced=((1, 0, 1), (1, 1, 1))),
    s9.Fwd90Config(tiles=(3,), wgs=1),
)
# The decode kernel: 1, 3 and 5 KV blocks through 2 and 3 stages, the producer variants 0, 1
# and 2, and the FP8 cache (Note [fp8 cache]) with two key groups of two warps and one group of
# four; variant 3 (Note [tma blocks]) with a stage filled by TMA after a gather (gtt: the TMA
# path's empty wait), alternating paths through 3 stages (a gather after a TMA fill, and a
# gathered last block), TMA blocks dequantized from the FP8 cache, and blocks by boxes (Note
# [tma boxes]) around a gather and a whole tile.
CONFIGS_DECODE = (
    s9.DecodeConfig(blocks=1),
    s9.DecodeConfig(blocks=3),
    s9.DecodeConfig(blocks=5),
    s9.DecodeConfig(blocks=5, stages=3),
    s9.DecodeConfig(blocks=2, fp8=True, warps_n=2),
    s9.DecodeConfig(blocks=3, fp8=True, warps_n=1),
    s9.DecodeConfig(blocks=3, variant=3, paths="gtt"),
    s9.DecodeConfig(blocks=4, stages=3, variant=3, paths="tgtg"),
    s9.DecodeConfig(blocks=3, variant=3, fp8=True, warps_n=2, paths="ttg"),
    s9.DecodeConfig(blocks=4, variant=3, paths="bgbt"),
)
# The full decode run finds one equivalent op (docs/testing.md, "Mutation score"): the bar.sync
# that publishes the query tile (Note [stream first]) moved past the next statement still
# precedes every read of Q (that statement sets up registers; the first ldmatrix of Q follows
# the first full wait). Every other site, the variant-3 ones included, is killed in
# CONFIGS_DECODE.
REDUNDANT_DECODE = {"move-wait bar.sync in decode_kernel"}
SAFE_ONLY_DECODE: dict = {}
# The SM90 backward: hd128's order (early dPᵀ; dK / dV staged for the reducer's TMA stores, or
# stored by rows) and hd64's (dQ and dK / dV from registers; deterministic mode: dQ through the
# reducer), two and three kv tiles (the tile ring, K/V buffer and dS stages wrap), a tile that
# no Q block sees; the split variant (d > 128) with odd block counts (its P / dS stage runs on
# across tiles) and in deterministic mode (its consumers' turn barriers).
CONFIGS_SM90_BWD = (
    sb.hd128((1, 1)),
    sb.hd128((2, 1)),
    sb.hd128((2, 1), tma_store=False),
    sb.hd128((0, 2)),
    sb.hd64((2, 1)),
    sb.hd64((2, 1), dq_regs=False),
    sb.hd256((1, 2)),
    sb.hd256((3, 1)),
    sb.hd256((1, 1), deterministic=True),
)
# Ops the full SM90 run finds equivalent (docs/testing.md, "Mutation score"), skipped by the CI
# sample: producer_tail (without a cluster the CTA lives while its consumers run), and the
# waits of a warpgroup that passes a stage or Q buffer it does not read (pass_k; the idle
# warpgroup's q_full): its release follows, in the ping-pong's turn order, every other
# warpgroup's release of the previous fill.
REDUNDANT_SM90 = {
    "delete-wait producer_tail(k_state) in producer",
    "delete-wait producer_tail(v_state) in producer",
    "delete-wait consumer_wait(k_state) in consumer/pass_k",
    "delete-wait wait((tiles_loaded / T::kQStages) & 1) in consumer",
    "move-wait wait((tiles_loaded / T::kQStages) & 1) in consumer",
}
# Mutants after which no configuration reaches a violation but new data states are reachable
# (status "redundant": the op is not needed for the checked properties; the reason is the
# model's): the ping-pong's turn wait orders the warpgroups' wgmma issue and no buffer, and
# pass_v's V wait, whose release the turn order already places after every other
# warpgroup's release of the stage's previous fill (the producer may now refill earlier).
SAFE_ONLY_SM90 = {
    "delete-wait sync(kTurnThreads) in consumer/turn_begin": "scheduling only (Note [warpgroup "
    "ping-pong])",
    "delete-wait consumer_wait(v_state) in consumer/pass_v": "implied by the turn order",
}
# Equivalent in the full SM90 backward run (docs/testing.md), skipped by the CI sample:
# producer_tail (no cluster), and the consumers' waits after their last tile on dq_empty
# (Note [dK/dV from registers]) and kDkDvRead: they match the reducer's last arrivals, and no
# buffer is written after them (the reducer's own wait_group keeps the CTA alive for its
# stores).
REDUNDANT_SM90_BWD = {
    "delete-wait producer_tail(q_state) in bwd_producer",
    "delete-wait producer_tail(do_state) in bwd_producer",
    "delete-wait sync(kHalfBarrierThreads) in bwd_consumer #2",
    "delete-wait sync(T::kConsumerThreads + kReducerThreads) in bwd_consumer #2",
}
# No violation with new data states in the backward: the move rule's "next operation" of the
# dO wait (hd64, split) is the Sᵀ GEMM, which reads no dO (the wait still precedes dPᵀ); and the
# epilogue's second kEpilogue barrier moved after the dK staging over dQ's buffer: the reducer
# arrives on both warpgroups' dq_empty after one reduce-add of both halves, so a warpgroup's
# own wait_dq covers the other's half (the barrier still orders both dV stagings before their
# reads).
SAFE_ONLY_SM90_BWD = {
    "move-wait consumer_wait(do_state) in bwd_consumer #2": "the moved-past Sᵀ GEMM reads no dO",
    "move-wait consumer_wait(do_state) in bwd_consumer_split": "the moved-past Sᵀ GEMM reads no dO",
    "move-wait sync(T::kConsumerThreads) in store_dk_dv #2": "implied by the joint dq_empty",
    "move-wait sync(T::kConsumerThreads) in stage_dk_dv_tma #2": "implied by the joint dq_empty",
}
# The SM100 2-CTA forward: 1 and 2 KV blocks of the cluster's one work item (2 blocks use both
# K / V stages and both S buffers, and rescale O; 3 blocks, the first to reuse a K / V stage,
# take ~8 min a mutant: 15 M states).
CONFIGS_FWD2 = (se.Fwd2Config(blocks=1), se.Fwd2Config(blocks=2))
# Equivalent in the full 2-CTA forward run (docs/testing.md), skipped by the CI sample: the load
# loop's kKEmpty and kVEmpty waits (with 1 and 2 blocks every stage is filled once: the waits
# pass on the barriers' start phase; 3 blocks reuse stage 0), the tail's kKEmpty wait (implied
# by its kVEmpty wait: the MMA thread's commits complete in issue order, and the last S's
# kKEmpty commit is issued before the last two P·Vs' kVEmpty commits), the relay's kQFull wait
# moved after its kPeerQFull arrival (S(0) also waits for kPeerKFull, which the relay sends
# after that wait), and correction's kOEmpty arrival (under `if constexpr (!T::kPair)`: the
# pair's programs do not change).
REDUNDANT_FWD2 = {
    "delete-wait bar_wait_cluster(kKEmpty) in load_role_pair",
    "delete-wait bar_wait_cluster(kVEmpty) in load_role_pair",
    "delete-wait bar_wait_cluster(kKEmpty) in load_role_pair #2",
    "move-wait bar_wait_cluster(kQFull) in relay_role_pair",
    "delete-arrive bar_arrive(kOEmpty) in correction_role",
}
KINDS = ("deadlock", "overwrite", "stale read", "phase", "arrivals", "exit")


@dataclass(frozen=True)
class Kernel:
    """What the harness needs of a covered kernel."""

    name: str
    files: tuple
    configs: tuple
    redundant: set
    extract: object  # (cfg, sources, called=None) -> {role: ops}
    finish: object  # (raw, needs) -> (programs, needs)
    machine: object  # (kernel text, cfg, programs) -> pm.Machine
    describe: object  # cfg -> str
    mutants: object = None  # (sources, reached) -> [Mutant]; None: the SM100 enumeration
    safe_only: dict = None  # mutant key -> why no violation with new data states is expected
    # whether machine reads the kernel text (the SM100 tables); if not, a mutant whose programs
    # (with their barrier table) equal the unmutated ones leaves that configuration unchanged
    uses_text: bool = True


def _fwd_machine(text, cfg, progs):
    return se.machine(pm.parse_kernel(text), cfg, progs)


def _bwd_machine(text, cfg, progs):
    return se.machine_bwd(se._pmb().parse_kernel(text), cfg, progs)


def _fwd2_machine(text, cfg, progs):
    return se.machine_fwd2(text, progs)


def _bwd2_machine(text, cfg, progs):
    return se.machine_bwd2(se._pmb2().parse_kernel(text), cfg, progs)


KERNELS = {
    "fwd": Kernel("fwd", se.FWD_FILES, CONFIGS, REDUNDANT, se.extract_fwd, se.finish,
                  _fwd_machine, lambda c: f"tiles {c.tiles}, {c.q_tiles} Q tiles"),
    "fwd2": Kernel("fwd2", se.FWD2_FILES, CONFIGS_FWD2, REDUNDANT_FWD2, se.extract_fwd2,
                   se.finish_fwd2, _fwd2_machine, lambda c: f"2-CTA, {c.blocks} KV blocks"),
    "bwd": Kernel("bwd", se.BWD_FILES, CONFIGS_BWD, REDUNDANT_BWD, se.extract_bwd,
                  se.finish_bwd, _bwd_machine,
                  lambda c: f"d {c.head_dim}, {c.iters} Q blocks"),
    "bwd2": Kernel("bwd2", se.BWD2_FILES, CONFIGS_BWD2, REDUNDANT_BWD2, se.extract_bwd2,
                   se.finish_bwd2, _bwd2_machine, lambda c: f"2-CTA, {c.iters} Q blocks"),
    "sm90fwd": Kernel("sm90fwd", s9.FWD90_FILES, CONFIGS_SM90, REDUNDANT_SM90, s9.extract_fwd90,
                      s9.finish,
                      lambda text, cfg, progs: s9.machine(progs),
                      lambda c: f"tiles {c.tiles}, {c.wgs} WGs, {c.q_stages} Q stages"
                                f"{f', sliced {c.sliced}' if c.sliced else ''}"
                                f"{f', idle {c.idle}' if c.idle else ''}",
                      lambda src, reached: enumerate_mutants90(src, reached), SAFE_ONLY_SM90,
                      uses_text=False),
    "sm90bwd": Kernel("sm90bwd", sb.BWD90_FILES, CONFIGS_SM90_BWD, REDUNDANT_SM90_BWD,
                      sb.extract_bwd90,
                      s9.finish, lambda text, cfg, progs: s9.machine(progs),
                      lambda c: f"Q blocks {c.tiles}, "
                                f"{'hd256' if c.split else 'hd128' if c.early_dp else 'hd64'}"
                                f"{', deterministic' if c.deterministic else ''}"
                                f"{', TMA store' if c.tma_store else ''}"
                                f"{', dQ regs' if c.dq_regs else ''}",
                      lambda src, reached: enumerate_mutants90(src, reached), SAFE_ONLY_SM90_BWD,
                      uses_text=False),
    "decode": Kernel("decode", s9.DECODE_FILES, CONFIGS_DECODE, REDUNDANT_DECODE,
                     s9.extract_decode,
                     s9.finish, lambda text, cfg, progs: s9.machine(progs),
                     lambda c: f"{c.blocks} blocks, {c.stages} stages, variant {c.variant}"
                               f"{' ' + c.paths if c.paths else ''}"
                               f"{', fp8, kWarpsN ' + str(c.warps_n) if c.fp8 else ''}",
                     lambda src, reached: enumerate_mutants90(src, reached), SAFE_ONLY_DECODE,
                     uses_text=False),
}  # fmt: skip


@dataclass(frozen=True)
class Mutant:
    op: str  # delete-wait, delete-arrive, delete-commit, flip-parity, move-wait, arrivals+1/-1
    file: str
    line: int
    what: str  # the call or table row
    edits: tuple  # ((start, end, replacement),): one edit of file
    moved: int = 0  # move-wait: length of the moved statement (last in the replacement)

    def describe(self):
        return f"{self.op} {self.what} ({self.file}:{self.line})"

    def key(self):  # as REDUNDANT* and SAFE_ONLY* name it (no line number)
        return f"{self.op} {self.what}"

    def apply(self, sources):
        """The sources with the edit made (offsets are UTF-8 bytes, as tree-sitter's)."""
        raw = sources[self.file].encode()
        ((start, end, repl),) = self.edits
        return {**sources, self.file: (raw[:start] + repl.encode() + raw[end:]).decode()}


# ---- Enumeration -------------------------------------------------------------------------
def reached_functions(sources, kernel=KERNELS["fwd"]):
    """Names of the functions the extraction runs, over the kernel's configurations."""
    seen = set()
    for cfg in kernel.configs:
        kernel.extract(cfg, sources, called=seen)
    return seen


def _sync_calls(tree):
    """(call node, callee name, enclosing function name) of every sync primitive call."""
    out = []

    def walk(n, fn):
        if n.type in ("preproc_else", "preproc_elif"):
            return  # the extractor runs a preprocessor block's first branch only
        if n.type == "function_definition":
            d = n.child_by_field_name("declarator")
            while d is not None and d.type != "function_declarator":
                d = d.child_by_field_name("declarator")
            fn = se.txt(d.child_by_field_name("declarator")).split("::")[-1] if d else fn
        if n.type == "call_expression":
            name = se.callee_name(n.child_by_field_name("function"))
            if name in se.SYNC_NAMES:
                out.append((n, name, fn))
        for c in n.children:
            walk(c, fn)

    walk(tree.root_node, None)
    return out


def _what(node, name):
    m = re.search(r"Bar::(k\w+)", se.txt(node))
    arg = m.group(1) if m else se.txt(node.child_by_field_name("arguments").named_children[0])
    return f"{name}({arg})"


def _statement(call):
    """The statement of a block that holds the call: its expression statement, or the if
    statement whose whole body it is."""
    s = call.parent
    if s.type != "expression_statement":
        return None
    while s.parent is not None and s.parent.type != "compound_statement":
        s = s.parent
        if s.type not in ("if_statement", "condition_clause", "else_clause"):
            return None
    return s if s.parent is not None else None


EFFECT_RE = re.compile(se.OP_RE.pattern + r"|\b(stat_a|items|lse2|dpsum)\[|\b(sO|sDS)\(")
# Not the guarded operation: another wait (a cluster wait too), or the expect_tx that announces
# the guarded copy.
WAIT_RE = re.compile(r"\b(bar_wait|bar_wait_cluster|wait|arrive_and_expect_tx)\s*\(")


def _guarded_next(stmt, callable_names):
    """The first later statement of stmt's block that performs an operation other than a
    wait or an expect_tx (the operation the wait guards: a copy, an MMA, a read, ...)."""
    s = stmt.next_named_sibling
    while s is not None:
        text = WAIT_RE.sub("(", se.txt(s))
        calls = set(re.findall(r"\b(\w+)\s*(?:<[^<>()]*>)?\s*\(", text))
        if EFFECT_RE.search(text) or calls & callable_names:
            return s
        s = s.next_named_sibling
    return None


def enumerate_mutants(sources, kernel="fwd") -> list[Mutant]:
    kernel = KERNELS[kernel]
    reached = reached_functions(sources, kernel)
    if kernel.mutants is not None:
        return kernel.mutants(sources, reached)
    mutants = []
    for fname, text in sources.items():
        tree = se.parse(text)
        callable_names = set(se.functions(tree, fname)) | set(
            re.findall(r"auto (\w+) = \[", text)
        )  # the file's functions and lambdas
        for call, name, fn in _sync_calls(tree):
            if fn not in reached:
                continue
            what = f"{_what(call, name)} in {fn}"
            line = call.start_point[0] + 1
            a, b = call.start_byte, call.end_byte
            kind = (
                "delete-wait" if name in se.WAITS
                else "delete-commit" if name in se.COMMITS
                else "delete-arrive"
            )  # fmt: skip
            mutants.append(Mutant(kind, fname, line, what, ((a, b, " " * (b - a)),)))
            if name not in se.WAITS:
                continue
            par = call.child_by_field_name("arguments").named_children[1]
            p = se.txt(par)
            mutants.append(
                Mutant("flip-parity", fname, line, what,
                       ((par.start_byte, par.end_byte, f"({p}) ^ 1u"),))
            )  # fmt: skip
            stmt = _statement(call)
            nxt = _guarded_next(stmt, callable_names) if stmt is not None else None
            if nxt is not None:
                s0, s1, n1 = stmt.start_byte, stmt.end_byte, nxt.end_byte
                raw = text.encode()
                moved = (raw[s1:n1] + b"\n" + raw[s0:s1]).decode()
                mutants.append(Mutant("move-wait", fname, line, what, ((s0, n1, moved),), s1 - s0))
        if fname == kernel.files[0]:
            mutants += _table_mutants(fname, text)
    seen = {}  # the same call twice in a function: its second site is "#2"
    for i, m in enumerate(mutants):
        k = seen.setdefault((m.op, m.what), set())
        k.add((m.file, m.line))
        if len(k) > 1:
            mutants[i] = dataclasses.replace(m, what=f"{m.what} #{len(k)}")
    return mutants


# ---- SM90 forward and decode (tools/sync_extract_sm90.py) --------------------------------------
EFFECT90_RE = re.compile(
    r"\b(copy|gemm|gemm_zero_acc|cp_async_16|ldmatrix_x4|ldmatrix_x4_trans|arrive|"
    r"consumer_release|cp_async_arrive|arrive_and_expect_tx|producer_acquire|issue_gemm|"
    r"stage_rows|stage_swizzled|write_rows|tma_store_rows)\s*[<(]|"
    r"\bitems\[|\(\s*epi\s*\+|\bepi_lse\s*\[|bar\.sync|cp\.reduce|"
    r"\bss\.(lse2|dpsum|dq)\s*\["
)
# Not the guarded operation: another wait, or the expect_tx that announces the guarded copy.
WAIT90_RE = re.compile(r"\b(wait|wait_barrier|consumer_wait|sync|arrive_and_expect_tx)\s*\(")


def _callee90(call):
    return s9.callee_name(call.child_by_field_name("function"))


def enumerate_mutants90(sources, reached) -> list[Mutant]:
    """The sync mutants of the SM90 / decode sources: every wait (ClusterBarrier, pipeline,
    named) and arrival (ClusterBarrier, expect_tx, consumer_release, cp.async arrive, named)
    of a function the extraction ran, deleted; the parity of each wait with one flipped (a
    pipeline state's: its start state, producer <-> consumer); each wait moved after the
    operation it guards; each barrier init count +-1 and each pipeline's num_consumers +-128
    (CUTLASS counts consumer warpgroups). Named barriers internal to one role
    (sync_extract_sm90.INTERNAL_BARRIERS) are left out."""
    mutants = []
    for fname, text in sources.items():
        tree = se.parse(text)
        raw = text.encode()
        funcs = se.functions(tree, fname)  # those that record an op, and the lambdas
        callable_names = (set(funcs) - s9._pure(funcs)) | set(re.findall(r"auto (\w+) = \[", text))
        for node, fn in _walk90(tree.root_node, None):
            if fn not in reached:
                continue
            line = node.start_point[0] + 1
            if (fname, line) in s9.INTERNAL_BARRIERS:
                continue
            fn = _where(node, fn)
            a, b = node.start_byte, node.end_byte
            if node.type == "expression_statement":  # asm("bar.sync ...")
                what = f"bar.sync in {fn}"
                mutants.append(Mutant("delete-wait", fname, line, what, ((a, b, " " * (b - a)),)))
                _move90(mutants, node, fname, line, what, raw, callable_names)
                continue
            if node.type == "declaration":  # a PipelineState: flip its start phase
                init = node.child_by_field_name("declarator").child_by_field_name("value")
                t = se.txt(init)
                m = re.fullmatch(r"cutlass::make_producer_start_state<\s*([\w:]+)>\(\)", t)
                new = (f"{m.group(1)}::PipelineState{{}}" if m else
                       "cutlass::make_producer_start_state<" + t[: -len("::PipelineState{}")]
                       .strip() + ">()")  # fmt: skip
                var = se.txt(node.child_by_field_name("declarator")).split()[0]
                what = f"PipelineState {var} in {fn}"
                start = init.start_byte  # with the `typename` before it (blanked by the parser)
                if raw[:start].rstrip().endswith(b"typename"):
                    start = raw.rindex(b"typename", 0, start)
                edit = (start, init.end_byte, new)
                mutants.append(Mutant("flip-parity", fname, line, what, (edit,)))
                continue
            if node.type == "assignment_expression":  # pk.num_consumers = X
                r = node.child_by_field_name("right")
                for delta in (128, -128):
                    mutants.append(Mutant(f"arrivals{delta // 128:+d}", fname, line,
                                          f"num_consumers {se.txt(r)} {delta:+d} in {fn}",
                                          ((r.start_byte, r.end_byte,
                                            f"({se.txt(r)}) {'+-'[delta < 0]} 128"),)))  # fmt: skip
                continue
            name = _callee90(node)
            args = node.child_by_field_name("arguments").named_children
            func = node.child_by_field_name("function")
            method = func.type == "field_expression"
            what = f"{name}({se.txt(args[0]) if args else ''}) in {fn}"
            if name == "init":
                count = args[0] if method else args[1]
                c = se.txt(count)
                bar = se.txt(func.child_by_field_name("argument")) if method else se.txt(args[0])
                for delta in (1, -1):
                    edit = (count.start_byte, count.end_byte, f"({c}) {'+-'[delta < 0]} 1")
                    mutants.append(Mutant(f"arrivals{delta:+d}", fname, line,
                                          f"init {bar} {c} in {fn}", (edit,)))  # fmt: skip
                continue
            kind = "delete-wait" if name in s9.WAITS else "delete-arrive"
            mutants.append(Mutant(kind, fname, line, what, ((a, b, " " * (b - a)),)))
            if kind != "delete-wait":
                continue
            par = None
            if name == "wait" and method:
                par = args[0]
            elif name in ("wait", "wait_barrier") and len(args) == 2:
                par = args[1]
            if par is not None:
                edit = (par.start_byte, par.end_byte, f"({se.txt(par)}) ^ 1u")
                mutants.append(Mutant("flip-parity", fname, line, what, (edit,)))
            stmt = _statement(node)
            if stmt is not None:
                _move90(mutants, stmt, fname, line, what, raw, callable_names)
    seen = {}  # the same call twice in a function: its second site is "#2"
    for i, m in enumerate(mutants):
        k = seen.setdefault((m.op, m.what), set())
        k.add((m.file, m.line))
        if len(k) > 1:
            mutants[i] = dataclasses.replace(m, what=f"{m.what} #{len(k)}")
    return mutants


def _where(node, fn):
    """fn, or fn/lambda for a call inside a named lambda (consumer/pass_k)."""
    n = node.parent
    while n is not None and n.type != "function_definition":
        if n.type == "lambda_expression" and n.parent.type == "init_declarator":
            return f"{fn}/{se.txt(n.parent.child_by_field_name('declarator'))}"
        n = n.parent
    return fn


def _move90(mutants, stmt, fname, line, what, raw, callable_names):
    s = stmt.next_named_sibling
    while s is not None:
        t = WAIT90_RE.sub("(", se.txt(s))
        calls = set(re.findall(r"\b(\w+)\s*(?:<[^<>()]*>)?\s*\(", t))
        if EFFECT90_RE.search(t) or calls & callable_names:
            s0, s1, n1 = stmt.start_byte, stmt.end_byte, s.end_byte
            moved = (raw[s1:n1] + b"\n" + raw[s0:s1]).decode()
            mutants.append(Mutant("move-wait", fname, line, what, ((s0, n1, moved),), s1 - s0))
            return
        s = s.next_named_sibling


def _walk90(root, fn):
    """(node, enclosing function) of every sync call, barrier init, pipeline-state declaration,
    num_consumers assignment and asm bar.sync statement."""
    out = []

    def walk(n, fn):
        if n.type in ("preproc_else", "preproc_elif"):
            return  # the extractor runs a preprocessor block's first branch only
        if n.type == "function_definition":
            d = n.child_by_field_name("declarator")
            while d is not None and d.type != "function_declarator":
                d = d.child_by_field_name("declarator")
            fn = se.txt(d.child_by_field_name("declarator")).split("::")[-1] if d else fn
        t = se.txt(n)
        if n.type == "call_expression":
            name = _callee90(n)
            func = n.child_by_field_name("function")
            if name in s9.SYNC_NAMES and not (
                    name == "sync" and "NamedBarrier" not in t):  # fmt: skip
                out.append((n, fn))
            elif name == "init" and (
                "Barrier::init" in se.txt(func)
                or (
                    func.type == "field_expression"
                    and re.match(r"ss\.(?!tiles\b|trace\b)\w+(\[.*\])?\.init$", se.txt(func))
                )
            ):
                out.append((n, fn))  # fmt: skip
        elif n.type == "expression_statement" and t.lstrip().startswith("asm") and "bar.sync" in t:
            out.append((n, fn))
            return
        elif n.type == "declaration" and re.search(
            r"make_producer_start_state<|::PipelineState\{\}", t
        ) and n.child_by_field_name("declarator") is not None and n.child_by_field_name(
            "declarator").type == "init_declarator":  # fmt: skip
            out.append((n, fn))
        elif n.type == "assignment_expression" and re.match(r"\w+\.num_consumers\b", t):
            out.append((n, fn))
        for c in n.children:
            walk(c, fn)

    walk(root, fn)
    return out


def _table_mutants(fname, text):
    out = []
    raw = text.encode()
    for m in re.finditer(rb"\{Bar::(k\w+),\s*BarCopies::(\w+),\s*(\d+)\}", raw):
        if m.group(2) == b"kNone":
            continue  # no copy: not a barrier of this kernel
        n = int(m.group(3))
        line = raw.count(b"\n", 0, m.start()) + 1
        for delta in (1, -1):
            if n + delta < 1:
                continue
            edit = (m.start(3), m.end(3), str(n + delta))
            op = f"arrivals{delta:+d}"
            what = f"kBarriers {m.group(1).decode()} {n}"
            out.append(Mutant(op, fname, line, what, (edit,)))
    return out


def unexecuted(sources, mutants, kernel):
    """The delete mutants whose call (asm statement) no configuration of the kernel executes
    (sync_extract_sm90's Programs.executed; [] for the SM100 kernels): mutants the
    configurations cannot kill, which the full run would report equivalent."""
    sites, known = set(), False
    for cfg in kernel.configs:
        progs = kernel.extract(cfg, sources)
        if hasattr(progs, "executed"):
            sites |= progs.executed
            known = True
    return [m for m in mutants if known and m.op.startswith("delete-")
            and (m.file, m.edits[0][0]) not in sites]  # fmt: skip


# ---- Evaluation --------------------------------------------------------------------------
def back_map(mutant):
    """Offset in the mutant's file -> offset in the original (the sites of the waits)."""
    ((start, end, repl),) = mutant.edits
    repl = repl.encode()
    delta = len(repl) - (end - start)
    if mutant.op != "move-wait":
        return lambda off: off - delta if off >= end else off
    stmt = mutant.moved  # repl = guarded stretch + "\n" + the wait's statement
    stretch = end - start - stmt

    def f(off):
        if start <= off < start + stretch:  # the guarded stretch, moved up
            return off + stmt
        if start + stretch + 1 <= off < start + len(repl):  # the wait, moved down
            return off - stretch - 1
        return off - delta if off >= end + delta else off

    return f


def observe(m: pm.Machine, stop_on=None):
    """pm.search, also collecting the reachable data states (buffer contents)."""
    start = m.initial()
    seen, stack, violations, data = {start}, [start], [], set()
    lens = tuple(len(m.progs[r]) for r in m.roles)
    while stack:
        state = stack.pop()
        data.add(state[3])
        succ, bad = m.successors(state)
        violations.extend(bad)
        if not succ and not bad and (state[0] != lens or state[4] or state[5]):
            violations.append(("deadlock", f"at {state[0]}"))
        if stop_on and violations:
            break
        for _, nxt in reversed(succ):
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return violations, data


def _model(cfg, sources, needs, remap=None, kernel=KERNELS["fwd"]):
    raw = kernel.extract(cfg, sources)
    if remap is not None:
        for ops in raw.values():
            for op in ops:
                if op.site is not None and op.site[0] == remap[0]:
                    op.site = (op.site[0], remap[1](op.site[1]))
    progs, own = kernel.finish(raw, needs)
    text = sources[kernel.files[0]]
    return kernel.machine(text, cfg, progs), own, (progs, text if kernel.uses_text else None)


class Baseline:
    """The unmutated kernel: the waits' meanings and, lazily, its data states per config."""

    def __init__(self, sources, kernel="fwd"):  # kernel: a KERNELS name, or a Kernel
        self.sources = sources
        self.kernel = KERNELS[kernel] if isinstance(kernel, str) else kernel
        self.needs, self.programs = {}, {}
        for cfg in self.kernel.configs:
            _, own, progs = _model(cfg, sources, None, kernel=self.kernel)
            self.needs[_key(cfg)] = own
            self.programs[_key(cfg)] = progs
        self._data = {}

    def data(self, cfg):
        if _key(cfg) not in self._data:
            m, _, _ = _model(cfg, self.sources, None, kernel=self.kernel)
            violations, data = observe(m)
            if violations:
                raise RuntimeError(f"the unmutated kernel fails: {violations[:3]}")
            self._data[_key(cfg)] = data
        return self._data[_key(cfg)]


def _key(cfg):
    return repr(cfg)


def evaluate(mutant: Mutant, base: Baseline):
    """('killed' | 'equivalent' | 'survived', reason)."""
    sources = mutant.apply(base.sources)
    remap = (mutant.file, back_map(mutant))
    survivors, kernel, changed = [], base.kernel, False
    for cfg in kernel.configs:
        try:
            m, _, progs = _model(cfg, sources, base.needs[_key(cfg)], remap, kernel)
        except se.ExtractError as e:
            return "killed", f"extractor: {e}"
        except ValueError as e:  # parse_kernel refuses the table
            return "killed", f"table: {e}"
        if progs == base.programs[_key(cfg)]:
            continue  # the mutant does not change this configuration's programs
        changed = True
        violations, data = observe(m, stop_on=True)
        if violations:
            kind, msg = violations[0]
            return "killed", f"{kind} ({kernel.describe(cfg)}): {msg[:100]}"
        survivors.append((cfg, data))  # explored to the end: every reachable data state
    if not changed:  # e.g. a call under `if constexpr` this kernel's traits skip
        return "equivalent", "the extracted programs do not change in any configuration"
    for cfg, data in survivors:
        if data != base.data(cfg):
            why = (kernel.safe_only or {}).get(mutant.key())
            if why is not None:
                return "redundant", f"no violation, new data states: {why}"
            return "survived", f"new data states with {kernel.describe(cfg)}"
    return "equivalent", "same reachable data states in every configuration"


STATUSES = ("killed", "equivalent", "redundant", "survived")


def score(results):
    """{op: {status: count}}."""
    table = {}
    for mutant, (status, _) in results:
        row = table.setdefault(mutant.op, dict.fromkeys(STATUSES, 0))
        row[status] += 1
    return table


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--all", action="store_true")
    ap.add_argument("--sample", type=int, default=0)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--kernel", choices=(*KERNELS, "all"), default="fwd")
    args = ap.parse_args(argv)
    names = list(KERNELS) if args.kernel == "all" else [args.kernel]
    seed = args.seed if args.seed is not None else int(time.time())
    if not args.all and not args.list:
        print(f"seed {seed}")
    survived = False
    for name in names:
        survived |= run_kernel(name, args, seed)
    return 1 if survived else 0


def run_kernel(name, args, seed):
    """Lists, samples or runs every mutant of one kernel; True when one survived."""
    sources = se.read_sources(se.ROOT, KERNELS[name].files)
    mutants = enumerate_mutants(sources, name)
    print(f"== {name}")
    if args.list:
        for mu in mutants:
            print(mu.describe())
        print(f"{len(mutants)} mutants")
        return False
    if not args.all:
        mutants = random.Random(seed).sample(mutants, min(args.sample or 10, len(mutants)))
    for mu in unexecuted(sources, mutants, KERNELS[name]):
        print(f"not executed by any configuration: {mu.describe()}")
    base = Baseline(sources, name)
    results = []
    t0 = time.time()
    for mu in mutants:
        t = time.time()
        status, why = evaluate(mu, base)
        results.append((mu, (status, why)))
        print(f"{status:10s} {mu.describe()} [{time.time() - t:.1f} s]: {why}", flush=True)
    print(f"\n{name}: {len(mutants)} mutants in {time.time() - t0:.0f} s")
    print("| mutation | mutants | " + " | ".join(STATUSES) + " |")
    print("|---|---|" + "---|" * len(STATUSES))
    for op, row in sorted(score(results).items()):
        print(f"| {op} | {sum(row.values())} | " + " | ".join(str(row[k]) for k in STATUSES)
              + " |")  # fmt: skip
    return any(s == "survived" for _, (s, _) in results)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

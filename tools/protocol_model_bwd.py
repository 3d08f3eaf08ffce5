#!/usr/bin/env python3
"""Protocol model of the SM100 backward kernel's mbarrier pipeline (docs/sm100.md).

The barrier list, copies (BarCopies kOnce / kPerQStage / kPerDoStage) and arrival counts, and
the Q and dO stage counts per head dim (kStageTable) are parsed from csrc/sm100/bwd/kernel.cuh
(enum Bar with its "from X to Y, protects Z:" comments, table kBarriers). Each role of one CTA
is a straight-line program mirroring csrc/sm100/bwd/roles.cuh (load_role, mma_role, compute_role
for warpgroups 0 and 1, reduce_role) for a CTA of I iterations (Q blocks); the explorer, steps
and checks are the forward's (tools/protocol_model.py): deadlock, overwrite, stale read, phase,
arrivals, with the MMA thread's tcgen05 operations executed in issue order
(`mma_in_order=False`: any order, a commit still waiting for everything issued before it).

Buffers (a value's tag names what it is; its read count is how many reads it expects before it
may be overwritten):
  sK, sV        K and V: every S(i) and dQ(i) read sK, every dP(i) reads sV
  sQ<s>         Q(i) with its rows' lse2 and D (one TMA transaction, kQFull): read by S(i), dK(i)
                and by each compute warpgroup twice (lse2 for P, D for dS)
  sDO<s>        dO(i): read by dP(i) and dV(i)
  S_0, S_1      TMEM S, one buffer per compute warpgroup's half of the query columns: S(i) from
                the MMA, read by warpgroup w, which writes P(i) over its half; dV(i) reads both
  DP_0, DP_1    TMEM dP, halves as S: dP(i) -> dS(i) (written by warpgroup w over its half, read
                by dK(i)) -> dQ(i) (the MMA, over both halves; read by the reduce warpgroup) ->
                dP(i + 1). At d = 64 dQ covers only DP_0's columns; the model writes both halves
                (the d > 64 layout, and a superset of the d = 64 hazards).
  sDS_0, sDS_1  dS(i) in shared memory, halves per warpgroup, read by dQ(i)
  dK, dV        the TMEM accumulators: dK(i) / dV(i) read by the next dK / dV MMA, the last ones
                by compute0 (dK) and compute1 (dV) after kDkvFull
The head-dim split (d > 128, Note [bwd head-dim split]) runs these programs in each of a tile's
two CTAs, which share no barrier or buffer (only the deterministic turn counter in global
memory, outside this model); its one-Q-stage row (d = 256) issues S(i+1) after dQ(i).
The reduce warpgroup's TMA reduce-adds read its own dQ staging buffers, ordered by its named
barrier and bulk-group waits (tma_store_wait), not by an mbarrier: not part of this model.

Usage: python tools/protocol_model_bwd.py [I] [d]   (Q blocks of the CTA, default 3; head dim
d = d_v, default every row of kStageTable).
"""

from __future__ import annotations

import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tools/ is not a package
from protocol_model import (  # noqa: E402
    WG,
    Arrive,
    Commit,
    Machine,
    Mma,
    Read,
    Result,
    Ring,
    Tma,
    Wait,
    Write,
    annotate,
    check_programs,
    mutate,
    parse_bar_table,
    search,
)

KERNEL = Path(__file__).resolve().parents[1] / "csrc" / "sm100/bwd/kernel.cuh"
ROLES = ("load", "mma", "compute0", "compute1", "reduce")
COPIES = ("kOnce", "kPerQStage", "kPerDoStage")
Q_READS = 6  # S(i), dK(i), and lse2 and D by each compute warpgroup
DO_READS = 2  # dP(i), dV(i)
# Buffers free before their first use: the producer's k-th wait needs k releases. The other
# "Empty" barriers are first waited on after a first use (compute's kDsEmpty from i = 1, the
# MMA's kDqEmpty before dP(1)): their k-th wait needs k + 1 completions.
FREE_AT_START = {"kQEmpty", "kDoEmpty"}


# ---- Parsing the kernel's table ------------------------------------------------------------
@dataclass(frozen=True)
class BarSpec:
    name: str
    src: str  # "from" role of the comment; "compute" stands for compute0 and compute1
    dst: str  # "to" role(s): "mma and compute" names two
    protects: str
    copies: str  # kOnce, kPerQStage or kPerDoStage
    arrivals: int


@dataclass(frozen=True)
class Table:
    bars: dict[str, BarSpec]
    stages: dict[tuple[int, int], tuple[int, int]]  # kStageTable: (d, d_v) -> (Q, dO stages)

    def stages_of(self, head_dim: int, head_dim_v: int | None = None) -> tuple[int, int]:
        key = (head_dim, head_dim if head_dim_v is None else head_dim_v)
        if key not in self.stages:
            raise ValueError(f"head dims {key} missing from kStageTable")
        return self.stages[key]

    def stages_do(self, head_dim: int) -> int:
        return self.stages_of(head_dim)[1]

    def copies(self, bar: str, stages_q: int, stages_do: int) -> int:
        c = self.bars[bar].copies
        return 1 if c == "kOnce" else (stages_q if c == "kPerQStage" else stages_do)


def parse_kernel(text: str | None = None) -> Table:
    """Reads enum Bar (with its comments), kBarriers, kStagesQ and kStagesDo; raises on
    anything missing or inconsistent."""
    if text is None:
        text = KERNEL.read_text()
    lines, kinds, rows = parse_bar_table(text)
    if kinds != list(COPIES):
        raise ValueError(f"enum class BarCopies is not {{{', '.join(COPIES)}}}")
    comments = {}
    for name, line in lines.items():
        m = re.match(r"from (\w+) to (\w+(?: and \w+)*), protects ([^:]+):", line)
        if m:
            comments[name] = (m.group(1), m.group(2), m.group(3).strip())
    if set(lines) != set(comments):
        raise ValueError(
            f"Bar enumerators without a 'from X to Y, protects Z' comment: "
            f"{sorted(set(lines) - set(comments))}"
        )
    stage_table = re.search(r"kStageTable\[\] = \{(.*?)\};", text, re.S)
    if not stage_table:
        raise ValueError("kStageTable not found")
    stage_rows = re.findall(r"\{\s*(\d+),\s*(\d+),\s*(\d+),\s*(\d+)\}", stage_table.group(1))
    if not stage_rows:
        raise ValueError("kStageTable has no rows")
    stages = {(int(d), int(dv)): (int(q), int(do)) for d, dv, q, do in stage_rows}
    if any(min(v) < 1 for v in stages.values()):
        raise ValueError(f"kStageTable with a stage count below 1: {stages}")
    bars = {}
    for name, copies, arrivals in rows:
        src, dst, protects = comments[name]
        bars[name] = BarSpec(name, src, dst, protects, copies, arrivals)
    return Table(bars, stages)


# ---- Role programs -------------------------------------------------------------------------
@dataclass
class Config:
    """What a mutation test may change; the defaults are the kernel."""

    iters: int = 3  # Q blocks of the CTA (t.iters)
    head_dim: int = 128  # with head_dim_v, selects the kStageTable row
    head_dim_v: int | None = None  # None: head_dim
    stages_q: int | None = None  # None: the table's
    stages_do: int | None = None  # None: the table's
    mma_in_order: bool = True
    s_early: bool | None = None  # mma_program's MMA order; None: the kernel's for the stages
    drop: set = field(default_factory=set)  # (role, step kind, bar, occurrence) to remove
    flip: set = field(default_factory=set)  # (role, bar, occurrence): wait parity ^ 1


def load_program(iters, SQ, SD):
    # K and V: one arrive_and_expect_tx, two copies, one transaction on kKVFull.
    p = [Tma("kKVFull", 0, "sK", ("K",), 2 * iters, more=(("sV", ("V",), iters),))]
    q_free, do_free = Ring(), Ring()
    for i in range(iters):
        qs = q_free.index(SQ)
        p.append(Wait("kQEmpty", qs, q_free.parity(SQ) ^ 1))
        q_free.count += 1
        p.append(Tma("kQFull", qs, f"sQ{qs}", ("Q", i), Q_READS))  # Q, lse2, D
        ds = do_free.index(SD)
        p.append(Wait("kDoEmpty", ds, do_free.parity(SD) ^ 1))
        do_free.count += 1
        p.append(Tma("kDoFull", ds, f"sDO{ds}", ("dO", i), DO_READS))
    return p


def _halves(region, tag):
    """An MMA result over both warpgroup halves of a TMEM region, each read once."""
    return dict(buf=f"{region}_0", tag=tag, reads_of_result=1, more=((f"{region}_1", tag, 1),))


def mma_program(iters, SQ, SD, s_early=None):
    """s_early: S(i+1) right after dV(i) (the kernel's order at kStagesQ > 1) or after dQ(i)
    (at kStagesQ == 1); None: the kernel's choice."""
    if s_early is None:
        s_early = SQ > 1
    p = []
    q_ready, do_ready, p_ready, ds_ready, dq_free = Ring(), Ring(), Ring(), Ring(), Ring()

    def issue_s(i, qs):
        p.append(Mma(((f"sQ{qs}", ("Q", i)), ("sK", ("K",))), **_halves("S", ("S", i))))
        p.append(Commit("kSFull", 0))

    def issue_dp(i, ds):
        p.append(Mma((("sV", ("V",)), (f"sDO{ds}", ("dO", i))), **_halves("DP", ("dP", i))))
        p.append(Commit("kDpFull", 0))

    def wait_q():
        qs = q_ready.index(SQ)
        p.append(Wait("kQFull", qs, q_ready.parity(SQ)))
        q_ready.count += 1
        return qs

    def wait_do():
        ds = do_ready.index(SD)
        p.append(Wait("kDoFull", ds, do_ready.parity(SD)))
        do_ready.count += 1
        return ds

    p.append(Wait("kKVFull", 0, 0))
    if iters == 0:
        return p
    qs = wait_q()
    issue_s(0, qs)
    ds = wait_do()
    issue_dp(0, ds)
    for i in range(iters):
        nxt = i + 1 < iters
        p.append(Wait("kPFull", 0, p_ready.parity(1)))
        p_ready.count += 1
        reads = (("S_0", ("P", i)), ("S_1", ("P", i)), (f"sDO{ds}", ("dO", i)))
        if i > 0:  # accumulate
            reads += (("dV", ("dV", i - 1)),)
        p.append(Mma(reads, "dV", ("dV", i), 1))
        p.append(Commit("kDoEmpty", ds))
        qs_i = qs
        if nxt and s_early:
            qs = wait_q()
            issue_s(i + 1, qs)  # over P(i), after dV(i) in issue order
        p.append(Wait("kDsFull", 0, ds_ready.parity(1)))
        ds_ready.count += 1
        reads = (("DP_0", ("dS", i)), ("DP_1", ("dS", i)), (f"sQ{qs_i}", ("Q", i)))
        if i > 0:
            reads += (("dK", ("dK", i - 1)),)
        p.append(Mma(reads, "dK", ("dK", i), 1))
        p.append(Commit("kQEmpty", qs_i))
        # dQ(i) = dS^T K over dS(i) in TMEM, after dK(i) in issue order.
        p.append(
            Mma(
                (("sDS_0", ("dS", i)), ("sDS_1", ("dS", i)), ("sK", ("K",))),
                **_halves("DP", ("dQ", i)),
            )
        )
        p.append(Commit("kDsEmpty", 0))
        p.append(Commit("kDqFull", 0))
        if nxt and not s_early:
            qs = wait_q()  # the one stage, refilled once dK(i) read it (kQEmpty)
            issue_s(i + 1, qs)
        if nxt:
            ds = wait_do()
            p.append(Wait("kDqEmpty", 0, dq_free.parity(1)))
            dq_free.count += 1
            issue_dp(i + 1, ds)  # over dQ(i), which the reduce warpgroup has loaded
    p.append(Commit("kDkvFull", 0))
    return p


def compute_program(iters, SQ, w):
    """Warpgroup w: its half of the query columns of S / P and dP / dS, and of sDS."""
    p = []
    q_ready, s_ready, dp_ready, ds_free = Ring(), Ring(), Ring(), Ring()
    for i in range(iters):
        qs = q_ready.index(SQ)
        p.append(Wait("kQFull", qs, q_ready.parity(SQ)))
        q_ready.count += 1
        p.append(Wait("kSFull", 0, s_ready.parity(1)))
        s_ready.count += 1
        p.append(Read(f"S_{w}", ("S", i)))
        p.append(Read(f"sQ{qs}", ("Q", i)))  # lse2
        p.append(Write(f"S_{w}", ("P", i), 1))  # P over S, read by dV(i)
        p.append(Arrive("kPFull", 0, WG))
        p.append(Wait("kDpFull", 0, dp_ready.parity(1)))
        dp_ready.count += 1
        if i > 0:
            p.append(Wait("kDsEmpty", 0, ds_free.parity(1)))
            ds_free.count += 1
        p.append(Read(f"DP_{w}", ("dP", i)))
        p.append(Read(f"sQ{qs}", ("Q", i)))  # D
        p.append(Write(f"DP_{w}", ("dS", i), 1))  # dS over dP, read by dK(i)
        p.append(Write(f"sDS_{w}", ("dS", i), 1))  # read by dQ(i)
        p.append(Arrive("kDsFull", 0, WG))
    if iters > 0:
        p.append(Wait("kDkvFull", 0, 0))
        acc = "dK" if w == 0 else "dV"
        p.append(Read(acc, (acc, iters - 1)))
    return p


def reduce_program(iters):
    p = []
    dq_ready = Ring()
    for i in range(iters):
        p.append(Wait("kDqFull", 0, dq_ready.parity(1)))
        dq_ready.count += 1
        p.append(Read("DP_0", ("dQ", i)))
        p.append(Read("DP_1", ("dQ", i)))
        p.append(Arrive("kDqEmpty", 0, WG))
    return p


def raw_programs(iters, SQ, SD, s_early=None) -> dict[str, list]:
    return {
        "load": load_program(iters, SQ, SD),
        "mma": mma_program(iters, SQ, SD, s_early),
        "compute0": compute_program(iters, SQ, 0),
        "compute1": compute_program(iters, SQ, 1),
        "reduce": reduce_program(iters),
    }


def programs(cfg: Config, SQ: int, SD: int) -> dict[str, list]:
    progs = raw_programs(cfg.iters, SQ, SD, cfg.s_early)
    return {
        r: mutate(r, annotate(prog, FREE_AT_START), cfg.drop, cfg.flip) for r, prog in progs.items()
    }


def _role_of(name: str) -> set[str]:
    roles = set()
    for part in name.split(" and "):
        roles |= {"compute0", "compute1"} if part == "compute" else {part}
    return roles


def check_consistency(table: Table, progs: dict[str, list], SQ: int, SD: int) -> list[str]:
    """The programs use exactly the parsed barriers, each from the roles its comment names
    (every one of them: "to mma and compute" means mma, compute0 and compute1 all wait)."""
    bars = {
        name: (table.copies(name, SQ, SD), spec.src, spec.dst) for name, spec in table.bars.items()
    }
    return check_programs(progs, bars, _role_of, every_named_role=True)


class Model(Machine):
    """The backward kernel's CTA for a Config."""

    def __init__(self, table: Table, cfg: Config):
        self.cfg = cfg
        sq, sd = table.stages_of(cfg.head_dim, cfg.head_dim_v)
        self.SQ = cfg.stages_q if cfg.stages_q is not None else sq
        self.SD = cfg.stages_do if cfg.stages_do is not None else sd
        # Table against the unmutated programs of a CTA long enough to use every barrier
        # (kDsEmpty and kDqEmpty are waited on from the second Q block) and every stage.
        ref = raw_programs(max(cfg.iters, self.SQ, self.SD, 2), self.SQ, self.SD)
        self.errors = check_consistency(table, ref, self.SQ, self.SD)
        if self.errors:
            raise ValueError("model and kBarriers disagree:\n  " + "\n  ".join(self.errors))
        progs = programs(cfg, self.SQ, self.SD)
        bars = {
            name: (table.copies(name, self.SQ, self.SD), spec.arrivals)
            for name, spec in table.bars.items()
        }
        super().__init__(bars, progs, cfg.mma_in_order)


def explore(table: Table, cfg: Config, stop_on: set | None = None) -> Result:
    return search(Model(table, cfg), stop_on)


def main(argv):
    iters = int(argv[0]) if argv else 3
    table = parse_kernel()
    dims = [(int(argv[1]), int(argv[1]))] if len(argv) > 1 else sorted(table.stages)
    failed = 0
    for d, dv in dims:
        t0 = time.perf_counter()
        res = explore(table, Config(iters=iters, head_dim=d, head_dim_v=dv))
        sq, sd = table.stages_of(d, dv)
        print(
            f"d ({d}, {dv}): kStagesQ {sq}, kStagesDo {sd}, I {iters}: "
            f"{res.states} states, {len(res.violations)} violations "
            f"({time.perf_counter() - t0:.1f} s)"
        )
        for kind, msg in res.violations[:20]:
            print(f"  {kind}: {msg}")
        failed |= bool(res.violations)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

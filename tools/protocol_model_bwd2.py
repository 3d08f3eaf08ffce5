#!/usr/bin/env python3
"""Protocol model of the 2-CTA SM100 backward (csrc/sm100/bwd/kernel_2cta.cuh, Note [bwd 2-CTA]).

The barrier list and arrival counts are parsed from the kernel (enum Bar with its "from X to Y,
protects Z:" comments, table kBarriers, every row BarCopies::kOnce; "(even)" or "(512, even)" in a
comment: only the even CTA's copy is used). Both CTAs of the cluster are modelled: every role of
each CTA is a process (load@0, load@1, relay@1, mma@0, compute0@c, compute1@c, reduce@c), each a
straight-line program mirroring csrc/sm100/bwd/roles_2cta.cuh for I Q blocks. Barriers and buffers
carry the CTA as a suffix (kQFull@1, sQ@1). What the cluster adds to the 1-CTA model
(protocol_model_bwd.py), and what the checks of tools/protocol_model.py (deadlock, overwrite, stale
read, phase, arrivals) then cover:
  - the even CTA's MMAs read and write both CTAs' shared memory and TMEM;
  - a multicast commit is two commits, one per CTA, issued together (each arrives once every
    MMA issued before it has completed);
  - the odd CTA's loads reach the MMA warp only through the relay's kPeer* arrivals;
  - compute warpgroup w of CTA c writes dS into CTA w's sDS (sDS@w.c, the DSMEM exchange), and
    arrives, like the reduce warpgroups, on the even CTA's barriers.

Usage: python tools/protocol_model_bwd2.py [I]   (Q blocks, default 2).
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

KERNEL = Path(__file__).resolve().parents[1] / "csrc" / "sm100/bwd/kernel_2cta.cuh"
CTAS = (0, 1)
Q_READS = 6  # S(i), dK(i), and lse2 and D by each compute warpgroup
DO_READS = 2  # dP(i), dV(i)


@dataclass(frozen=True)
class BarSpec:
    name: str
    src: tuple  # roles named after "from"
    dst: tuple  # roles named after "to"
    even_only: bool
    arrivals: int


def parse_kernel(text: str | None = None) -> dict[str, BarSpec]:
    if text is None:
        text = KERNEL.read_text()
    lines, kinds, rows = parse_bar_table(text)
    if kinds != ["kOnce"]:
        raise ValueError("enum class BarCopies is not {kOnce}: the model has one copy per CTA")
    specs = {}
    for name, _, arrivals in rows:
        comment = lines[name]
        m = re.match(r"from (\w+) to ([\w ,]+?), protects ([^:]+):(.*)", comment)
        if not m:
            raise ValueError(f"{name}: no 'from X to Y, protects Z:' comment")
        dst = tuple(r for r in re.split(r",\s*|\s+and\s+", m.group(2)) if r)
        even = re.search(r"\((?:\d+, )?even\)", m.group(4)) is not None
        specs[name] = BarSpec(name, (m.group(1),), dst, even, arrivals)
    return specs


def _bars(specs: dict[str, BarSpec], arrivals: dict | None = None):
    """{name@cta: arrivals} of every barrier copy the kernel uses."""
    out = {}
    for name, spec in specs.items():
        for c in (0,) if spec.even_only else CTAS:
            out[f"{name}@{c}"] = (arrivals or {}).get(name, spec.arrivals)
    return out


@dataclass
class Config:
    iters: int = 2
    mma_in_order: bool = True
    drop: set = field(default_factory=set)  # (role, step kind, bar, occurrence)
    flip: set = field(default_factory=set)  # (role, bar, occurrence)
    arrivals: dict = field(default_factory=dict)  # barrier name -> arrival count override
    commit_to: tuple = CTAS  # the CTAs a multicast commit reaches (a mutation: (0,))


# ---- Role programs ---------------------------------------------------------------------------
def load_program(iters, c):
    p = [
        Tma(f"kKVFull@{c}", 0, f"sK@{c}", ("K",), iters,
            more=((f"sV@{c}", ("V",), iters), (f"sKd@{c}", ("Kd",), iters)))
    ]  # fmt: skip
    q_free, do_free = Ring(), Ring()
    for i in range(iters):
        p.append(Wait(f"kQEmpty@{c}", 0, q_free.parity(1) ^ 1))
        q_free.count += 1
        p.append(Tma(f"kQFull@{c}", 0, f"sQ@{c}", ("Q", i), Q_READS))  # Q, Qd, lse2, D
        p.append(Wait(f"kDoEmpty@{c}", 0, do_free.parity(1) ^ 1))
        do_free.count += 1
        p.append(Tma(f"kDoFull@{c}", 0, f"sDO@{c}", ("dO", i), DO_READS))  # dO, dOd
    return p


def relay_program(iters):
    p = [Wait("kKVFull@1", 0, 0), Arrive("kPeerKVFull@0", 0, 1)]
    for i in range(iters):
        p += [Wait("kQFull@1", 0, i & 1), Arrive("kPeerQFull@0", 0, 1)]
        p += [Wait("kDoFull@1", 0, i & 1), Arrive("kPeerDoFull@0", 0, 1)]
    return p


def _both(buf, tag, reads=1):
    """A value written into `buf` of both CTAs by one pair MMA."""
    return dict(buf=f"{buf}@0", tag=tag, reads_of_result=reads, more=((f"{buf}@1", tag, reads),))


def mma_program(iters, commit_to):
    p = []
    p_ready, ds_ready, dq_free = Ring(), Ring(), Ring()

    def commit(bar):
        p.extend(Commit(f"{bar}@{c}", 0) for c in commit_to)

    def tmem_halves(region, tag):
        # S and dP: both warpgroup halves of both CTAs' TMEM region.
        writes = [(f"{region}_{w}@{c}", tag, 1) for c in CTAS for w in (0, 1)]
        (b, t, r), rest = writes[0], tuple(writes[1:])
        return dict(buf=b, tag=t, reads_of_result=r, more=rest)

    def issue_s(i):
        p.extend([Wait("kQFull@0", 0, i & 1), Wait("kPeerQFull@0", 0, i & 1)])
        reads = tuple((f"sQ@{c}", ("Q", i)) for c in CTAS) + tuple(
            (f"sK@{c}", ("K",)) for c in CTAS
        )
        p.append(Mma(reads, **tmem_halves("S", ("S", i))))
        commit("kSFull")

    def issue_dp(i):
        p.extend([Wait("kDoFull@0", 0, i & 1), Wait("kPeerDoFull@0", 0, i & 1)])
        reads = tuple((f"sDO@{c}", ("dO", i)) for c in CTAS) + tuple(
            (f"sV@{c}", ("V",)) for c in CTAS
        )
        p.append(Mma(reads, **tmem_halves("DP", ("dP", i))))
        commit("kDpFull")

    p.extend([Wait("kKVFull@0", 0, 0), Wait("kPeerKVFull@0", 0, 0)])
    if iters == 0:
        return p
    issue_s(0)
    issue_dp(0)
    for i in range(iters):
        p.append(Wait("kPFull@0", 0, p_ready.parity(1)))
        p_ready.count += 1
        reads = tuple((f"S_{w}@{c}", ("P", i)) for c in CTAS for w in (0, 1))
        reads += tuple((f"sDO@{c}", ("dO", i)) for c in CTAS)
        if i > 0:
            reads += tuple((f"dV@{c}", ("dV", i - 1)) for c in CTAS)
        p.append(Mma(reads, **_both("dV", ("dV", i))))
        commit("kDoEmpty")
        p.append(Wait("kDsFull@0", 0, ds_ready.parity(1)))
        ds_ready.count += 1
        reads = tuple((f"DP_{w}@{c}", ("dS", i)) for c in CTAS for w in (0, 1))
        reads += tuple((f"sQ@{c}", ("Q", i)) for c in CTAS)
        if i > 0:
            reads += tuple((f"dK@{c}", ("dK", i - 1)) for c in CTAS)
        p.append(Mma(reads, **_both("dK", ("dK", i))))
        commit("kQEmpty")
        # dQ(i): A = sDS of both CTAs (each written by both CTAs' warpgroup w), B = sKd; its
        # 2 x 2 TMEM layout takes the first 64 dP columns, warpgroup 0's half, in each CTA.
        reads = tuple((f"sDS@{w}.{c}", ("dS", i)) for w in (0, 1) for c in CTAS)
        reads += tuple((f"sKd@{c}", ("Kd",)) for c in CTAS)
        p.append(Mma(reads, **_both("DP_0", ("dQ", i))))
        commit("kDsEmpty")
        commit("kDqFull")
        if i + 1 < iters:
            issue_s(i + 1)
            p.append(Wait("kDqEmpty@0", 0, dq_free.parity(1)))
            dq_free.count += 1
            issue_dp(i + 1)
    commit("kDkvFull")
    return p


def compute_program(iters, c, w):
    p = []
    q_ready, s_ready, dp_ready, ds_free = Ring(), Ring(), Ring(), Ring()
    for i in range(iters):
        p.append(Wait(f"kQFull@{c}", 0, q_ready.parity(1)))
        q_ready.count += 1
        p.append(Wait(f"kSFull@{c}", 0, s_ready.parity(1)))
        s_ready.count += 1
        p.append(Read(f"S_{w}@{c}", ("S", i)))
        p.append(Read(f"sQ@{c}", ("Q", i)))  # lse2
        p.append(Write(f"S_{w}@{c}", ("P", i), 1))  # P over S, read by dV(i)
        p.append(Arrive("kPFull@0", 0, WG))
        p.append(Wait(f"kDpFull@{c}", 0, dp_ready.parity(1)))
        dp_ready.count += 1
        if i > 0:
            p.append(Wait(f"kDsEmpty@{c}", 0, ds_free.parity(1)))
            ds_free.count += 1
        p.append(Read(f"DP_{w}@{c}", ("dP", i)))
        p.append(Read(f"sQ@{c}", ("Q", i)))  # D
        p.append(Write(f"DP_{w}@{c}", ("dS", i), 1))  # dS over dP, read by dK(i)
        p.append(Write(f"sDS@{w}.{c}", ("dS", i), 1))  # into CTA w's sDS, read by dQ(i)
        p.append(Arrive("kDsFull@0", 0, WG))
    if iters > 0:
        p.append(Wait(f"kDkvFull@{c}", 0, 0))
        acc = "dK" if w == 0 else "dV"
        p.append(Read(f"{acc}@{c}", (acc, iters - 1)))
    return p


def reduce_program(iters, c):
    p = []
    dq_ready = Ring()
    for i in range(iters):
        p.append(Wait(f"kDqFull@{c}", 0, dq_ready.parity(1)))
        dq_ready.count += 1
        p.append(Read(f"DP_0@{c}", ("dQ", i)))
        p.append(Arrive("kDqEmpty@0", 0, WG))
    return p


def raw_programs(iters, commit_to=CTAS) -> dict[str, list]:
    progs = {f"load@{c}": load_program(iters, c) for c in CTAS}
    progs["relay@1"] = relay_program(iters)
    progs["mma@0"] = mma_program(iters, commit_to)
    for c in CTAS:
        for w in (0, 1):
            progs[f"compute{w}@{c}"] = compute_program(iters, c, w)
        progs[f"reduce@{c}"] = reduce_program(iters, c)
    return progs


FREE_AT_START = {f"{b}@{c}" for b in ("kQEmpty", "kDoEmpty") for c in CTAS}


def _role_of(name: str) -> set[str]:
    """Processes of a comment's role (either CTA; checked per use by check_programs)."""
    roles = {"compute0", "compute1"} if name == "compute" else {name}
    return {f"{r}@{c}" for r in roles for c in CTAS}


def check_consistency(specs: dict[str, BarSpec], progs: dict[str, list]) -> list[str]:
    """Every barrier copy of the table is used, each only by roles its comment names."""
    bars = {}
    for name, spec in specs.items():
        for c in (0,) if spec.even_only else CTAS:
            bars[f"{name}@{c}"] = (1, " and ".join(spec.src), " and ".join(spec.dst))

    def role_of(side):
        out = set()
        for part in side.split(" and "):
            out |= _role_of(part)
        return out

    return check_programs(progs, bars, role_of)


class Model(Machine):
    def __init__(self, specs: dict[str, BarSpec], cfg: Config):
        self.cfg = cfg
        self.errors = check_consistency(specs, raw_programs(max(cfg.iters, 2)))
        if self.errors:
            raise ValueError("model and kBarriers disagree:\n  " + "\n  ".join(self.errors))
        progs = {
            r: mutate(r, annotate(prog, FREE_AT_START), cfg.drop, cfg.flip)
            for r, prog in raw_programs(cfg.iters, cfg.commit_to).items()
        }
        bars = {name: (1, n) for name, n in _bars(specs, cfg.arrivals).items()}
        super().__init__(bars, progs, cfg.mma_in_order)


def explore(specs, cfg: Config, stop_on: set | None = None) -> Result:
    return search(Model(specs, cfg), stop_on)


def main(argv):
    iters = int(argv[0]) if argv else 2
    specs = parse_kernel()
    t0 = time.perf_counter()
    res = explore(specs, Config(iters=iters))
    print(
        f"2-CTA backward, I {iters}: {res.states} states, {len(res.violations)} violations "
        f"({time.perf_counter() - t0:.1f} s)"
    )
    for kind, msg in res.violations[:20]:
        print(f"  {kind}: {msg}")
    return 1 if res.violations else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

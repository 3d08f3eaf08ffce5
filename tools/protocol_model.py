#!/usr/bin/env python3
"""Protocol model of the SM100 forward kernel's mbarrier pipeline (docs/sm100.md), for both
its shapes: two Q tiles ping-ponged (hd <= 192) and one Q tile with a double-buffered S
(hd 256, Config(q_tiles=1), Note [one-tile order]).

The barrier list, copies and arrival counts, and kStages are parsed from csrc/sm100/fwd/kernel.cuh
(enum Bar, table kBarriers, FwdTraits::kStages; parse_bar_table reads the table form of
csrc/common/barrier_table.cuh, which all three SM100 kernels share). Each role of one CTA is a
straight-line program of steps written by hand to mirror the kernel's loops (load_role, mma_role,
softmax_role, correction_role) for a list of consecutive work tiles; the explorer runs every
interleaving of the roles and of the asynchronous TMA loads and tcgen05 MMAs and checks:
  deadlock     a reachable state where no step can run but some role has not finished
  overwrite    a buffer written while a value in it still has unread consumers
  stale read   a buffer read whose current value is not the one the reader expects (read
               before the producer's write, or after a newer write)
  phase        a wait that passes on a completion count other than the one the waiter means
               (a stale phase two generations old, or a phase the producer ran ahead of)
  arrivals     more arrivals than the barrier's pending count (undefined in PTX)
  exit         (Machine(exit_drained=True), the 2-CTA forward) every role finished while a
               TMA load or tcgen05 op is in flight: the CTAs may leave before it lands
The MMA thread's tcgen05 operations execute in issue order (a FIFO; tcgen05.commit arrives when
everything issued before it has completed); `mma_in_order=False` lets MMAs complete in any
order, to show that the kernel relies on that ordering.
The steps, the explorer (Machine, search) and the checks are shared with the backward kernel's
model, tools/protocol_model_bwd.py.

Usage: python tools/protocol_model.py [N ...]   (KV blocks per consecutive work tile; default
3). `3` takes ~2 s, `2 2` ~30 s and 0.9 M states.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

KERNEL = Path(__file__).resolve().parents[1] / "csrc" / "sm100/fwd/kernel.cuh"
TILE_RING = KERNEL.parents[2] / "common" / "tile_ring.cuh"  # kTileSlots (Note [dynamic tiles])
Q_TILES = 2  # FwdTraits::kQTiles for hd <= 192; hd 256 has 1 (Config.q_tiles)
S_BUFFERS = 2  # kSBuffers: Q tile t's S, or the one Q tile's double-buffered S
WG = 128  # a softmax/correction warpgroup is one process: its arrive counts 128 at once


# ---- Parsing the kernel's table ------------------------------------------------------------
def parse_bar_table(
    text: str, table_name: str = "kBarriers"
) -> tuple[dict[str, str], list[str], list[tuple[str, str, int]]]:
    """The barrier table of an SM100 kernel (csrc/common/barrier_table.cuh's form): enum class Bar
    ({enumerator: the first line of its comment}, in enum order), the kinds of enum class
    BarCopies, and the kBarriers rows {Bar::kX, BarCopies::kKind, arrivals} as (name, kind,
    arrivals). Raises unless the rows are the enumerators in order, each of a BarCopies kind.
    table_name: the array to read (the 2-CTA forward's kBarriersPair shares the forward's enum)."""
    enum = re.search(r"enum class Bar : int \{(.*?)\n\s*kCount", text, re.S)
    if not enum:
        raise ValueError("enum class Bar not found")
    comments = dict(re.findall(r"^\s*(k\w+),[ \t]*(?://[ \t]*(.*))?$", enum.group(1), re.M))
    kinds = re.search(r"enum class BarCopies : int \{([^}]*)\}", text)
    if not kinds:
        raise ValueError("enum class BarCopies not found")
    kinds = [k.strip() for k in kinds.group(1).split(",") if k.strip()]
    table = re.search(rf"\b{table_name}\[\] = \{{(.*?)\}};", text, re.S)
    if not table:
        raise ValueError(f"{table_name} table not found")
    rows = re.findall(r"\{Bar::(k\w+),\s*BarCopies::(\w+),\s*(\d+)\}", table.group(1))
    if [r[0] for r in rows] != list(comments):
        raise ValueError(f"kBarriers rows {[r[0] for r in rows]} != enum Bar {list(comments)}")
    bad = [r[0] for r in rows if r[1] not in kinds]
    if bad:
        raise ValueError(f"kBarriers rows with an unknown BarCopies: {bad}")
    return comments, kinds, [(name, kind, int(arrivals)) for name, kind, arrivals in rows]


# enum BarCopies; kNone: a row of the shared enum this kernel does not have (0 copies)
COPIES = ("kPerQTile", "kPerStage", "kPerSBuffer", "kOnce", "kPerTileSlot", "kNone")


@dataclass(frozen=True)
class BarSpec:
    name: str
    src: str  # "from" role of the comment; softmax_t stands for softmax0 and softmax1
    dst: str  # "to" role
    protects: str
    copies: str  # a kind of COPIES
    arrivals: int

    @property
    def per_stage(self) -> bool:
        return self.copies == "kPerStage"

    def count(self, q_tiles: int, stages: int) -> int:
        """Copies of this barrier (FwdBarCopies in the kernel)."""
        counts = {
            "kPerQTile": q_tiles,
            "kPerStage": stages,
            "kPerSBuffer": S_BUFFERS,
            "kOnce": 1,
            "kPerTileSlot": tile_slots(),
            "kNone": 0,
        }
        return counts[self.copies]


@dataclass(frozen=True)
class Table:
    bars: dict[str, BarSpec]
    stages: int

    def copies(self, bar: str, q_tiles: int = Q_TILES) -> int:
        return self.bars[bar].count(q_tiles, self.stages)


def parse_kernel(text: str | None = None) -> Table:
    """Reads enum Bar (with its comments), kBarriers and kStages; raises on anything missing."""
    if text is None:
        text = KERNEL.read_text()
    lines, kinds, rows = parse_bar_table(text)
    if kinds != list(COPIES):
        raise ValueError(f"enum class BarCopies is not {{{', '.join(COPIES)}}}")
    comments = {}
    for name, line in lines.items():
        m = re.match(r"from (\w+) to (\w+), protects ([^:]+):", line)
        if m:
            comments[name] = (m.group(1), m.group(2), m.group(3).strip())
    if set(lines) != set(comments):
        raise ValueError(
            f"Bar enumerators without a 'from X to Y, protects Z' comment: "
            f"{sorted(set(lines) - set(comments))}"
        )
    stages = re.search(r"static constexpr int kStages = (\d+);", text)
    if not stages:
        raise ValueError("kStages not found")
    bars = {}
    for name, copies, arrivals in rows:
        src, dst, protects = comments[name]
        bars[name] = BarSpec(name, src, dst, protects, copies, arrivals)
    return Table(bars, int(stages.group(1)))


def tile_slots() -> int:
    """kTileSlots of csrc/common/tile_ring.cuh: slots of the work-item ring."""
    m = re.search(r"constexpr int kTileSlots = (\d+);", TILE_RING.read_text())
    if not m:
        raise ValueError("kTileSlots not found in common/tile_ring.cuh")
    return int(m.group(1))


# ---- Steps ---------------------------------------------------------------------------------
# Tags name the value a buffer holds: (kind, tile, ...). A write declares how many reads the
# value expects before it may be overwritten.
@dataclass(frozen=True)
class Wait:
    bar: str
    idx: int
    parity: int
    need: int = -1  # completions the waiter means to see; set by _annotate


@dataclass(frozen=True)
class Arrive:
    bar: str
    idx: int
    count: int


@dataclass(frozen=True)
class Tma:  # arrive_and_expect_tx + TMA copy: the write and the arrival happen on completion
    bar: str
    idx: int
    buf: str
    tag: tuple
    reads: int
    more: tuple = ()  # further (buf, tag, reads) of the same transaction (one arrival)
    count: int = 1  # arrivals on landing (the decode warp's 32 cp.async.mbarrier.arrive)

    def writes(self):
        return ((self.buf, self.tag, self.reads),) + self.more


@dataclass(frozen=True)
class Mma:  # tcgen05.mma: reads and write happen when it executes (asynchronously)
    reads: tuple  # ((buf, tag), ...)
    buf: str
    tag: tuple
    reads_of_result: int
    more: tuple = ()  # further (buf, tag, reads) it writes (the halves of a TMEM region)

    def writes(self):
        return ((self.buf, self.tag, self.reads_of_result),) + self.more


@dataclass(frozen=True)
class Commit:  # tcgen05.commit: arrives once everything issued before it has completed
    bar: str
    idx: int


@dataclass(frozen=True)
class Read:
    buf: str
    tag: tuple


@dataclass(frozen=True)
class Take(Wait):
    """A ring reader's wait on `bar` (full), its read of the slot and its arrival on `empty`,
    as one step: once the wait passes, the producer cannot rewrite the slot before this
    arrival, so interleavings between the three change nothing the checks see (they only
    multiply the states)."""

    buf: str = ""
    tag: tuple = ()
    empty: str = ""
    count: int = 0


@dataclass(frozen=True)
class Publish(Wait):
    """The ring producer's wait on `bar` (empty), its write of the slot and its arrival on
    `full`, as one step (the slot is the producer's alone between the two barriers)."""

    buf: str = ""
    tag: tuple = ()
    reads: int = 0
    full: str = ""
    count: int = 1  # arrivals on `full` (a warpgroup publishes with 128)


def _barrier_uses(st):
    """(bar, copy, is_wait) for each barrier a step uses."""
    if isinstance(st, Take):
        return ((st.bar, st.idx, True), (st.empty, st.idx, False))
    if isinstance(st, Publish):
        return ((st.bar, st.idx, True), (st.full, st.idx, False))
    bar = getattr(st, "bar", None)
    return () if bar is None else ((bar, st.idx, isinstance(st, Wait)),)


@dataclass(frozen=True)
class Write:
    buf: str
    tag: tuple
    reads: int


@dataclass
class Config:
    """What a mutation test may change; the defaults are the kernel."""

    tiles: tuple = (3,)  # KV blocks of each consecutive work tile of the CTA
    stages: int | None = None  # None: the parsed kStages
    mma_in_order: bool = True
    drop: set = field(default_factory=set)  # (role, step kind, bar, occurrence) to remove
    flip: set = field(default_factory=set)  # (role, bar, occurrence): wait parity ^ 1
    rescale: bool = True  # correction touches O_t every block (the vote said "rescale")
    q_tiles: int = Q_TILES  # 1: the hd 256 kernel (one Q tile, double-buffered S)


class Ring:
    """The kernel's Ring: index and parity of the count-th use of `copies` copies."""

    def __init__(self):
        self.count = 0

    def index(self, copies):
        return self.count % copies

    def parity(self, copies):
        return (self.count // copies) & 1


# Note [dynamic tiles] (csrc/common/tile_ring.cuh): the load thread publishes each work item, and
# the end marker after the last, into the ring of kTileSlots slots; every other role's threads read
# it at the top of their tile loop: both warpgroups of softmax (softmax1 passes them on at hd
# 256), the correction warpgroup, the MMA and the epilogue threads.
TILE_READERS = 5


def publish_tile(p, ring, n):
    """publish_item: a slot's first use writes at once; use u > 0 first waits for the readers'
    u-th release (so kTileEmpty is not "free at start" for annotate: its k-th wait needs k + 1
    completions)."""
    slots = tile_slots()
    slot = ring.index(slots)
    if ring.count < slots:
        p.append(Write(f"tile{slot}", ("T", n), TILE_READERS))
        p.append(Arrive("kTileFull", slot, 1))
    else:
        p.append(
            Publish("kTileEmpty", slot, ring.parity(slots) ^ 1, buf=f"tile{slot}", tag=("T", n),
                    reads=TILE_READERS, full="kTileFull")
        )  # fmt: skip
    ring.count += 1


def take_tile(p, ring, n, arrivals):
    slots = tile_slots()
    slot = ring.index(slots)
    p.append(
        Take("kTileFull", slot, ring.parity(slots), buf=f"tile{slot}", tag=("T", n),
             empty="kTileEmpty", count=arrivals)
    )  # fmt: skip
    ring.count += 1


def pass_program(tiles):
    """pass_tiles: a reader with no work of its own (softmax1 at hd 256)."""
    p, ring = [], Ring()
    for n in range(len(tiles) + 1):
        take_tile(p, ring, n, WG)
    return p


def load_program(tiles, S, q_tiles=Q_TILES):
    p = []
    q_free, k_free, v_free, items = Ring(), Ring(), Ring(), Ring()
    for w, nblk in enumerate(tiles):
        publish_tile(p, items, w)
        for q in range(q_tiles):
            p.append(Wait("kQEmpty", q, q_free.parity(1) ^ 1))
            p.append(Tma("kQFull", q, f"sQ{q}", ("Q", w, q), nblk))  # one S_q per block
        q_free.count += 1
        for i in range(nblk):  # block i of the tile in the kernel's order (n_end - 1 down)
            ks = k_free.index(S)
            p.append(Wait("kKEmpty", ks, k_free.parity(S) ^ 1))
            p.append(Tma("kKFull", ks, f"sK{ks}", ("K", w, i), q_tiles))  # S_t of each tile
            k_free.count += 1
            vs = v_free.index(S)
            p.append(Wait("kVEmpty", vs, v_free.parity(S) ^ 1))
            p.append(Tma("kVFull", vs, f"sV{vs}", ("V", w, i), q_tiles))  # PV_t of each tile
            v_free.count += 1
    publish_tile(p, items, len(tiles))  # the end marker
    return p


def mma_program(tiles, S):
    p = []
    q_ready, k_ready, v_ready, o_free = Ring(), Ring(), Ring(), Ring()
    p_ready, o_ok = [Ring(), Ring()], [Ring(), Ring()]
    items = Ring()

    def issue_s(w, q, ks, blk):
        p.append(
            Mma(((f"sQ{q}", ("Q", w, q)), (f"sK{ks}", ("K", w, blk))), f"S{q}", ("S", w, q, blk), 1)
        )
        p.append(Commit("kSFull", q))

    for w, nblk in enumerate(tiles):
        take_tile(p, items, w, 1)
        for q in range(Q_TILES):
            p.append(Wait("kQFull", q, q_ready.parity(1)))
        q_ready.count += 1
        ks = k_ready.index(S)
        p.append(Wait("kKFull", ks, k_ready.parity(S)))
        for q in range(Q_TILES):
            issue_s(w, q, ks, 0)
            if nblk == 1:
                p.append(Commit("kQEmpty", q))
        p.append(Commit("kKEmpty", ks))
        k_ready.count += 1
        for i in range(nblk):
            nxt = i + 1 < nblk
            if nxt:
                ks = k_ready.index(S)
                p.append(Wait("kKFull", ks, k_ready.parity(S)))
            vs = v_ready.index(S)
            p.append(Wait("kVFull", vs, v_ready.parity(S)))
            for q in range(Q_TILES):
                p.append(Wait("kPFull", q, p_ready[q].parity(1)))
                p_ready[q].count += 1
                p.append(Wait("kORescaled", q, o_ok[q].parity(1)))
                o_ok[q].count += 1
                if i == 0:
                    p.append(Wait("kOEmpty", q, o_free.parity(1) ^ 1))
                reads = ((f"S{q}", ("P", w, q, i)), (f"sV{vs}", ("V", w, i)))
                if i > 0:  # accumulate: O_t as the correction left it
                    reads += ((f"O{q}", ("R", w, q, i - 1)),)
                p.append(Mma(reads, f"O{q}", ("O", w, q, i), 1))
                p.append(Commit("kOFull", q))
                if nxt:
                    issue_s(w, q, ks, i + 1)
                    if i + 2 == nblk:
                        p.append(Commit("kQEmpty", q))
            p.append(Commit("kVEmpty", vs))
            v_ready.count += 1
            if nxt:
                p.append(Commit("kKEmpty", ks))
                k_ready.count += 1
        o_free.count += 1
    take_tile(p, items, len(tiles), 1)
    return p


def softmax_program(tiles, q):
    p = []
    s_ready, st_free = Ring(), Ring()

    def publish(tag):
        p.append(Wait("kStatsEmpty", q, st_free.parity(1) ^ 1))
        st_free.count += 1
        p.append(Write(f"stats{q}", tag, 1))
        p.append(Arrive("kStatsFull", q, WG))

    items = Ring()
    for w, nblk in enumerate(tiles):
        take_tile(p, items, w, WG)
        for i in range(nblk):
            p.append(Wait("kSFull", q, s_ready.parity(1)))
            s_ready.count += 1
            p.append(Read(f"S{q}", ("S", w, q, i)))
            publish(("f", w, q, i))  # the O factor, before the exponentials
            p.append(Write(f"S{q}", ("P", w, q, i), 1))  # P over S, read by PV_q(i)
            p.append(Arrive("kPFull", q, WG))
        publish(("L", w, q))  # 1/l and the LSE
    take_tile(p, items, len(tiles), WG)
    return p


def correction_program(tiles, rescale=True, q_tiles=Q_TILES):
    p = []
    st_ready, o_done = [Ring(), Ring()], [Ring(), Ring()]
    staged = Ring()

    def take_stats(q, tag):
        p.append(Wait("kStatsFull", q, st_ready[q].parity(1)))
        st_ready[q].count += 1
        p.append(Read(f"stats{q}", tag))
        p.append(Arrive("kStatsEmpty", q, WG))

    def wait_o(q):
        p.append(Wait("kOFull", q, o_done[q].parity(1)))
        o_done[q].count += 1

    items = Ring()
    for w, nblk in enumerate(tiles):
        take_tile(p, items, w, WG)
        for i in range(nblk):
            for q in range(q_tiles):
                take_stats(q, ("f", w, q, i))
                if i > 0:
                    wait_o(q)
                    if rescale:
                        p.append(Read(f"O{q}", ("O", w, q, i - 1)))
                        p.append(Write(f"O{q}", ("R", w, q, i - 1), 1))
                p.append(Arrive("kORescaled", q, WG))
        for q in range(q_tiles):
            # Note [sm100 TMA-store epilogue]: O_t · 1/l (zeros for a tile without keys) through
            # the staging buffer, for the epilogue warp's TMA store (the dense path; varlen
            # stores O from registers and uses neither staging barrier).
            if nblk > 0:
                take_stats(q, ("L", w, q))
                wait_o(q)
            p.append(Wait("kOStageEmpty", 0, staged.parity(1) ^ 1))
            staged.count += 1
            if nblk > 0:
                p.append(Read(f"O{q}", ("O", w, q, nblk - 1)))
            p.append(Write("sO", ("out", w, q), 1))
            p.append(Arrive("kOStageFull", 0, WG))
            if nblk > 0:
                p.append(Arrive("kOEmpty", q, WG))
    take_tile(p, items, len(tiles), WG)
    return p


def epilogue_program(tiles, q_tiles=Q_TILES):
    """epilogue_role (sm100/fwd/epilogue.cuh): one TMA store per work tile and Q tile."""
    p = []
    staged, items = Ring(), Ring()
    for w, _ in enumerate(tiles):
        take_tile(p, items, w, 1)
        for q in range(q_tiles):
            p.append(Wait("kOStageFull", 0, staged.parity(1)))
            staged.count += 1
            p.append(Read("sO", ("out", w, q)))
            p.append(Arrive("kOStageEmpty", 0, 1))
    take_tile(p, items, len(tiles), 1)
    return p


def mma_program_one_tile(tiles, S):
    """mma_role_one_tile (sm100/fwd/one_tile.cuh): S(i) into buffer c % 2 of a running block
    count c, S(i + 2) into P(i)'s buffer right after PV(i), which reads it (Note [one-tile
    order])."""
    p = []
    q_ready, k_ready, v_ready, o_free, o_ok = Ring(), Ring(), Ring(), Ring(), Ring()
    s_issued, p_ready, items = Ring(), Ring(), Ring()

    def issue_s(w, blk):
        b = s_issued.index(S_BUFFERS)
        s_issued.count += 1
        ks = k_ready.index(S)
        p.append(Wait("kKFull", ks, k_ready.parity(S)))
        p.append(Mma((("sQ0", ("Q", w, 0)), (f"sK{ks}", ("K", w, blk))), f"S{b}",
                     ("S", w, 0, blk), 1))  # fmt: skip
        p.append(Commit("kSFull", b))
        p.append(Commit("kKEmpty", ks))
        k_ready.count += 1

    for w, nblk in enumerate(tiles):
        take_tile(p, items, w, 1)
        p.append(Wait("kQFull", 0, q_ready.parity(1)))
        q_ready.count += 1
        for blk in range(min(2, nblk)):
            issue_s(w, blk)
            if blk + 1 == nblk:
                p.append(Commit("kQEmpty", 0))
        for i in range(nblk):
            vs = v_ready.index(S)
            p.append(Wait("kVFull", vs, v_ready.parity(S)))
            b = p_ready.index(S_BUFFERS)
            p.append(Wait("kPFull", b, p_ready.parity(S_BUFFERS)))
            p_ready.count += 1
            p.append(Wait("kORescaled", 0, o_ok.parity(1)))
            o_ok.count += 1
            if i == 0:
                p.append(Wait("kOEmpty", 0, o_free.parity(1) ^ 1))
            reads = ((f"S{b}", ("P", w, 0, i)), (f"sV{vs}", ("V", w, i)))
            if i > 0:
                reads += (("O0", ("R", w, 0, i - 1)),)
            p.append(Mma(reads, "O0", ("O", w, 0, i), 1))
            p.append(Commit("kOFull", 0))
            p.append(Commit("kVEmpty", vs))
            v_ready.count += 1
            if i + 2 < nblk:
                issue_s(w, i + 2)
                if i + 3 == nblk:
                    p.append(Commit("kQEmpty", 0))
        o_free.count += 1
    take_tile(p, items, len(tiles), 1)
    return p


def softmax_program_one_tile(tiles):
    """softmax_role with one Q tile: every block, from the S buffer of its running count."""
    p = []
    s_ready, st_free = Ring(), Ring()

    def publish(tag):
        p.append(Wait("kStatsEmpty", 0, st_free.parity(1) ^ 1))
        st_free.count += 1
        p.append(Write("stats0", tag, 1))
        p.append(Arrive("kStatsFull", 0, WG))

    items = Ring()
    for w, nblk in enumerate(tiles):
        take_tile(p, items, w, WG)
        for i in range(nblk):
            b = s_ready.index(S_BUFFERS)
            p.append(Wait("kSFull", b, s_ready.parity(S_BUFFERS)))
            s_ready.count += 1
            p.append(Read(f"S{b}", ("S", w, 0, i)))
            publish(("f", w, 0, i))
            p.append(Write(f"S{b}", ("P", w, 0, i), 1))
            p.append(Arrive("kPFull", b, WG))
        publish(("L", w, 0))
    take_tile(p, items, len(tiles), WG)
    return p


def programs(cfg: Config, S: int) -> dict[str, list]:
    tiles = cfg.tiles
    if cfg.q_tiles == 1:
        progs = {
            "load": load_program(tiles, S, q_tiles=1),
            "mma": mma_program_one_tile(tiles, S),
            "softmax0": softmax_program_one_tile(tiles),
            "softmax1": pass_program(tiles),
            "correction": correction_program(tiles, cfg.rescale, q_tiles=1),
            "epilogue": epilogue_program(tiles, q_tiles=1),
        }
        return {r: _mutate(r, _annotate(prog), cfg) for r, prog in progs.items()}
    progs = {
        "load": load_program(tiles, S),
        "mma": mma_program(tiles, S),
        "softmax0": softmax_program(tiles, 0),
        "softmax1": softmax_program(tiles, 1),
        "correction": correction_program(tiles, cfg.rescale),
        "epilogue": epilogue_program(tiles),
    }
    return {r: _mutate(r, _annotate(prog), cfg) for r, prog in progs.items()}


# ---- Shared by the forward and backward models ---------------------------------------------
def annotate(prog, free_at_start=None):
    """The completion each wait means, counted independently of the parity the program
    computes: the k-th wait (from 0) of a role on a copy needs k + 1 completions, or k for a
    barrier in free_at_start (a buffer free before its first use: k earlier releases; None:
    every "...Empty" barrier). Done before mutations, so that a dropped wait does not shift
    the meaning of the later ones."""
    out, count = [], {}
    for st in prog:
        if isinstance(st, Wait):
            k = count.get((st.bar, st.idx), 0)
            count[(st.bar, st.idx)] = k + 1
            free = st.bar.endswith("Empty") if free_at_start is None else st.bar in free_at_start
            st = replace(st, need=k + (0 if free else 1))
        out.append(st)
    return out


def mutate(role, prog, drop, flip):
    """Removes the steps named in drop, (role, step kind, bar, occurrence), and flips the
    parity of the waits named in flip, (role, bar, occurrence); occurrences count from 0 per
    (step kind, bar) in the role's program."""
    out, seen = [], {}
    for st in prog:
        bar = getattr(st, "bar", None)
        key = (type(st).__name__, bar)
        k = seen.get(key, 0)
        seen[key] = k + 1
        if (role, type(st).__name__, bar, k) in drop:
            continue
        if isinstance(st, Wait) and (role, bar, k) in flip:
            st = replace(st, parity=st.parity ^ 1)
        out.append(st)
    return out


def _annotate(prog):
    empties = {st.bar for st in prog if isinstance(st, Wait) and st.bar.endswith("Empty")}
    return annotate(prog, free_at_start=empties - {"kTileEmpty"})


def _mutate(role, prog, cfg):
    return mutate(role, prog, cfg.drop, cfg.flip)


def check_programs(
    progs: dict[str, list], bars: dict[str, tuple], role_of, every_named_role: bool = False
) -> list[str]:
    """The programs use exactly the barriers of `bars`, {name: (copies, from, to)}, from the
    roles their comments name (role_of maps a comment's role to the program roles). With
    every_named_role, each role a comment names must also use the barrier on its side."""
    errors = []
    used, sides = set(), set()
    for role, prog in progs.items():
        for bar, idx, waits in (use for st in prog for use in _barrier_uses(st)):
            used.add(bar)
            if bar not in bars:
                errors.append(f"{role} uses {bar}, which is not in kBarriers")
                continue
            copies, src, dst = bars[bar]
            if not 0 <= idx < copies:
                errors.append(f"{role}: {bar}[{idx}] out of {copies} copies")
            side = dst if waits else src
            sides.add((bar, waits, role))
            if role not in role_of(side):
                what = "waits on" if waits else "arrives on"
                errors.append(f"{role} {what} {bar}, whose comment says {side}")
    for bar in sorted(set(bars) - used):
        errors.append(f"{bar} is in kBarriers but no role program uses it")
    if every_named_role:
        for bar in sorted(set(bars) & used):
            _, src, dst = bars[bar]
            for waits, side in ((False, src), (True, dst)):
                for role in sorted(role_of(side)):
                    if (bar, waits, role) not in sides:
                        what = "wait on" if waits else "arrive on"
                        errors.append(f"{role} does not {what} {bar}, whose comment names it")
    return errors


def _role_of(name: str) -> set[str]:
    if name == "every_role":  # the readers of the tile ring: every role but load
        return {"mma", "softmax0", "softmax1", "correction", "epilogue"}
    return {"softmax0", "softmax1"} if name == "softmax_t" else {name}


def check_consistency(
    table: Table, progs: dict[str, list], S: int, q_tiles: int = Q_TILES
) -> list[str]:
    """The programs use exactly the parsed barriers, from the roles the comments name."""
    bars = {
        name: (spec.count(q_tiles, S), spec.src, spec.dst)
        for name, spec in table.bars.items()
        if spec.copies != "kNone"
    }
    return check_programs(progs, bars, _role_of)


# ---- Explorer ------------------------------------------------------------------------------
class Machine:
    """The state machine of one CTA: role programs, barrier copies {name: (copies, arrivals)}
    and the buffers the programs name."""

    def __init__(
        self,
        bars: dict[str, tuple],
        progs: dict[str, list],
        mma_in_order: bool,
        exit_drained: bool = False,
    ):
        self.progs = progs
        self.mma_in_order = mma_in_order
        # exit_drained (a cluster that ends with cluster_sync, the 2-CTA forward): once every
        # role has finished, the CTAs may exit; a TMA load or tcgen05 op (a multicast commit)
        # still in flight then writes or arrives on a CTA that left ("exit").
        self.exit_drained = exit_drained
        self.lens = tuple(len(progs[r]) for r in progs)
        self.roles = list(self.progs)
        # Copy slots and their init counts.
        self.slot = {}
        self.expected = []
        for name, (copies, arrivals) in bars.items():
            for i in range(copies):
                self.slot[(name, i)] = len(self.expected)
                self.expected.append(arrivals)
        bufs = set()
        for prog in progs.values():
            for st in prog:
                if isinstance(st, (Tma, Mma)):
                    bufs.update(b for b, _, _ in st.writes())
                if isinstance(st, Mma):
                    bufs.update(b for b, _ in st.reads)
                if isinstance(st, (Read, Take, Publish, Write)):
                    bufs.add(st.buf)
        self.buf = {b: i for i, b in enumerate(sorted(bufs))}

    def initial(self):
        n = len(self.expected)
        return (
            (0,) * len(self.roles),  # program counters
            (0,) * n,  # completions per barrier copy
            tuple(self.expected),  # pending arrivals of the current phase
            ((None, 0),) * len(self.buf),  # (tag, unread count) per buffer
            frozenset(),  # TMA loads in flight: (slot, ((buf, tag, reads), ...))
            (),  # MMA thread's tcgen05 queue, issue order
        )

    # A successor is (role index or -1 for an asynchronous event, state); violations are
    # returned separately.
    def successors(self, state):
        pcs, done, pend, bufs, tmas, queue = state
        out, bad = [], []
        if self.exit_drained and pcs == self.lens and (tmas or queue):
            what = [f"TMA {w[0][1]}" for _, w, _ in tmas] + [str(op) for op in queue]
            bad.append(("exit", f"every role finished with {', '.join(what)} in flight"))
        for r, role in enumerate(self.roles):
            prog = self.progs[role]
            if pcs[r] == len(prog):
                continue
            st = prog[pcs[r]]
            npcs = pcs[:r] + (pcs[r] + 1,) + pcs[r + 1 :]
            if isinstance(st, Wait):
                s = self.slot[(st.bar, st.idx)]
                if (done[s] & 1) != st.parity:  # try_wait.parity: phase `parity` completed
                    need = st.need
                    if done[s] != need:
                        bad.append(
                            (
                                "phase",
                                f"{role}[{pcs[r]}] {st} passed after {done[s]} completions, "
                                f"means {need}",
                            )
                        )
                        continue
                    if isinstance(st, Take):
                        nb, err = self._read(bufs, st.buf, st.tag)
                        if err:
                            bad.append(("stale read", f"{role}[{pcs[r]}] {st}: {err}"))
                            continue
                        nd, np_, err = self._arrive(
                            done, pend, self.slot[(st.empty, st.idx)], st.count
                        )
                        if err:
                            bad.append(("arrivals", f"{role}[{pcs[r]}] {st}: {err}"))
                            continue
                        out.append((r, (npcs, nd, np_, nb, tmas, queue)))
                        continue
                    if isinstance(st, Publish):
                        nb, err = self._write(bufs, st.buf, st.tag, st.reads)
                        if err:
                            bad.append(("overwrite", f"{role}[{pcs[r]}] {st}: {err}"))
                            continue
                        full = self.slot[(st.full, st.idx)]
                        nd, np_, err = self._arrive(done, pend, full, st.count)
                        if err:
                            bad.append(("arrivals", f"{role}[{pcs[r]}] {st}: {err}"))
                            continue
                        out.append((r, (npcs, nd, np_, nb, tmas, queue)))
                        continue
                    out.append((r, (npcs, done, pend, bufs, tmas, queue)))
            elif isinstance(st, Arrive):
                nd, np_, err = self._arrive(done, pend, self.slot[(st.bar, st.idx)], st.count)
                if err:
                    bad.append(("arrivals", f"{role}[{pcs[r]}] {st}: {err}"))
                    continue
                out.append((r, (npcs, nd, np_, bufs, tmas, queue)))
            elif isinstance(st, Tma):
                # In flight, the load counts as an unread value: no one may write or read the
                # buffer until it lands.
                nb, err = bufs, None
                for buf, tag, _ in st.writes():
                    nb, err = self._write(nb, buf, ("tma", tag), 1)
                    if err:
                        break
                if err:
                    bad.append(("overwrite", f"{role}[{pcs[r]}] {st}: {err}"))
                    continue
                op = (self.slot[(st.bar, st.idx)], st.writes(), st.count)
                out.append((r, (npcs, done, pend, nb, tmas | {op}, queue)))
            elif isinstance(st, (Mma, Commit)):
                out.append((r, (npcs, done, pend, bufs, tmas, queue + (st,))))
            elif isinstance(st, Read):
                nb, err = self._read(bufs, st.buf, st.tag)
                if err:
                    bad.append(("stale read", f"{role}[{pcs[r]}] {st}: {err}"))
                    continue
                out.append((r, (npcs, done, pend, nb, tmas, queue)))
            elif isinstance(st, Write):
                nb, err = self._write(bufs, st.buf, st.tag, st.reads)
                if err:
                    bad.append(("overwrite", f"{role}[{pcs[r]}] {st}: {err}"))
                    continue
                out.append((r, (npcs, done, pend, nb, tmas, queue)))
        for op in tmas:  # a TMA load lands: data, then the tx count completes the arrival
            s, writes, count = op
            nb = bufs
            for buf, tag, reads in writes:
                nb = self._set(nb, buf, tag, reads)
            nd, np_, err = self._arrive(done, pend, s, count)
            if err:
                bad.append(("arrivals", f"TMA {writes[0][1]}: {err}"))
                continue
            out.append((-1, (pcs, nd, np_, nb, tmas - {op}, queue)))
        for j, op in enumerate(queue):
            # In order: only the head executes. Out of order (a mutation): any MMA; a commit
            # still waits for every operation issued before it.
            if j > 0 and self.mma_in_order:
                break
            if j > 0 and isinstance(op, Commit):
                continue
            rest = queue[:j] + queue[j + 1 :]
            if isinstance(op, Commit):
                nd, np_, err = self._arrive(done, pend, self.slot[(op.bar, op.idx)], 1)
                if err:
                    bad.append(("arrivals", f"commit {op.bar}[{op.idx}]: {err}"))
                    break
                out.append((-1, (pcs, nd, np_, bufs, tmas, rest)))
                continue
            nb, err = bufs, None
            for buf, tag in op.reads:
                nb, err = self._read(nb, buf, tag)
                if err:
                    bad.append(("stale read", f"MMA -> {op.tag}: {err}"))
                    break
            if err:
                continue
            for buf, tag, reads in op.writes():
                nb, err = self._write(nb, buf, tag, reads)
                if err:
                    bad.append(("overwrite", f"MMA -> {op.tag}: {err}"))
                    break
            if err:
                continue
            out.append((-1, (pcs, done, pend, nb, tmas, rest)))
        return out, bad

    def _arrive(self, done, pend, s, count):
        left = pend[s] - count
        if left < 0:
            return done, pend, f"{count} arrivals, {pend[s]} pending"
        if left == 0:  # phase completes; the count re-arms
            done = done[:s] + (done[s] + 1,) + done[s + 1 :]
            left = self.expected[s]
        return done, pend[:s] + (left,) + pend[s + 1 :], None

    def _set(self, bufs, buf, tag, reads):
        b = self.buf[buf]
        return bufs[:b] + ((tag, reads),) + bufs[b + 1 :]

    def _write(self, bufs, buf, tag, reads):
        old, unread = bufs[self.buf[buf]]
        if unread:
            return bufs, f"{buf} overwritten with {tag} while {old} has {unread} unread"
        return self._set(bufs, buf, tag, reads), None

    def _read(self, bufs, buf, tag):
        cur, unread = bufs[self.buf[buf]]
        if cur != tag or unread == 0:
            return bufs, f"{buf} read for {tag} but holds {cur} ({unread} reads left)"
        return self._set(bufs, buf, cur, unread - 1), None


class Model(Machine):
    """The forward kernel's CTA for a Config."""

    def __init__(self, table: Table, cfg: Config):
        self.cfg = cfg
        self.S = cfg.stages if cfg.stages is not None else table.stages
        progs = programs(cfg, self.S)
        self.errors = check_consistency(table, progs, self.S, cfg.q_tiles)
        if self.errors:
            raise ValueError("model and kBarriers disagree:\n  " + "\n  ".join(self.errors))
        bars = {
            name: (spec.count(cfg.q_tiles, self.S), spec.arrivals)
            for name, spec in table.bars.items()
        }
        super().__init__(bars, progs, cfg.mma_in_order)


@dataclass
class Result:
    states: int
    violations: list  # (kind, message)

    def kinds(self):
        return {k for k, _ in self.violations}


def search(m: Machine, stop_on: set | None = None) -> Result:
    """Depth-first over all interleavings, memoized on the full state. A violating transition
    is reported and not taken; the search stops at the first violation of a kind in stop_on
    (None: explore everything)."""
    start = m.initial()
    seen = {start}
    stack = [start]
    violations = []
    lens = tuple(len(m.progs[r]) for r in m.roles)
    while stack:
        state = stack.pop()
        succ, bad = m.successors(state)
        violations.extend(bad)
        if not succ and not bad:
            pcs = state[0]
            if pcs != lens or state[4] or state[5]:
                where = ", ".join(
                    f"{r} at {m.progs[r][pc] if pc < len(m.progs[r]) else 'end'}"
                    for r, pc in zip(m.roles, pcs, strict=True)
                )
                violations.append(("deadlock", where))
        if stop_on and any(k in stop_on for k, _ in violations):
            break
        # Reversed: the load role's step is taken first, so producers run ahead of their
        # consumers early in the search, where missing waits show first.
        for _, nxt in reversed(succ):
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return Result(len(seen), violations)


def explore(table: Table, cfg: Config, stop_on: set | None = None) -> Result:
    return search(Model(table, cfg), stop_on)


def main(argv):
    tiles = tuple(int(a) for a in argv) or (3,)
    table = parse_kernel()
    res = explore(table, Config(tiles=tiles))
    print(
        f"kStages {table.stages}, tiles {tiles}: {res.states} states, "
        f"{len(res.violations)} violations"
    )
    for kind, msg in res.violations[:20]:
        print(f"  {kind}: {msg}")
    return 1 if res.violations else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""A model of the decode kernel's stage ring (csrc/decode/kernel.cuh): mbarriers with phases, a
producer that waits on empty[stage] with parity (it / S - 1) & 1 once it >= S and fills stage
it % S, consumers that wait on full[stage] with parity (it / S) & 1, read, and arrive on
empty[stage]. Every interleaving the barriers allow is explored for small rings (exhaustively)
and larger ones (random schedules); the invariants are the protocol's purpose:
- a consumer reads a stage only when it holds the block the consumer expects (no stale or
  unfilled read);
- the producer refills a stage only after every consumer has released the block in it (no
  overwrite of an unread block; this is what compute-sanitizer racecheck checks on the GPU);
- the run finishes (no deadlock), with every block read by every consumer exactly once.

The first model (run) counts one batched producer arrival per block. The second (LaneRing) is
variant 3's producer (Note [tma blocks], decode/plan.h tma_block) at lane granularity: full[]
counts one arrival per producer lane, and each lane runs the producer loop on its own program
counter. Per block a path is given (all TMA, all gathered, alternating, a gathered last block
as a partial one makes, random): a TMA block's lanes all wait on empty[stage], then lane 0
arrives with expect_tx and issues the copies, which land later as several complete_tx events,
and every other lane arrives plainly; a gathered block's lanes pass a __syncwarp, wait on
empty[stage], issue their cp.async with cp.async.mbarrier.arrive.noinc (an event per lane that
lands the lane's copies and then arrives, arbitrarily late, while the lane runs on), and pass
another __syncwarp. full[] and empty[] are TxBarriers (arrivals, tx-count, phase). Consumers
are a few actors standing for the 128 threads, empty[] counting the actors. The same
invariants are checked against ghost state (which block each stage receives, whose copies have
landed), at every state reachable by any interleaving of tiny rings (explore) and on seeded
random schedules at the kernel's sizes (simulate: 32 lanes, 4 TMA parts). Planted bugs
(MUTATIONS) show the checks fail when they should; one of them, expect_tx after the issue, is
shown harmless.
Plain CPU test.
"""

import heapq
import itertools
import random

import pytest


class MBarrier:
    """PTX mbarrier: a phase completes when `count` arrivals have happened in it; try_wait.parity
    P succeeds once the phase of parity P has completed, i.e. the current phase's parity != P."""

    def __init__(self, count):
        self.count, self.pending, self.phase = count, count, 0

    def arrive(self):
        self.pending -= 1
        assert self.pending >= 0
        if self.pending == 0:
            self.phase += 1
            self.pending = self.count

    def done(self, parity):
        return (self.phase & 1) != parity


def run(stages, blocks, consumers, choose):
    full = [MBarrier(1) for _ in range(stages)]  # the producer's one (batched) arrival
    empty = [MBarrier(consumers) for _ in range(stages)]
    slot = [None] * stages  # the block a stage holds
    released = [set() for _ in range(stages)]  # consumers done with that block
    prod = 0
    cons = [0] * consumers
    reads = [[] for _ in range(consumers)]
    while prod < blocks or any(c < blocks for c in cons):
        moves = []
        if prod < blocks:
            st = prod % stages
            if prod < stages or empty[st].done((prod // stages - 1) & 1):
                moves.append(("p", None))
        for c in range(consumers):
            if cons[c] < blocks and full[cons[c] % stages].done((cons[c] // stages) & 1):
                moves.append(("c", c))
        assert moves, f"deadlock: producer at {prod}, consumers at {cons}"
        kind, c = choose(moves)
        if kind == "p":
            st = prod % stages
            if slot[st] is not None:
                assert released[st] == set(range(consumers)), (
                    f"block {prod} overwrites block {slot[st]} before every consumer released it"
                )
            slot[st], released[st] = prod, set()
            full[st].arrive()
            prod += 1
        else:
            it = cons[c]
            st = it % stages
            assert slot[st] == it, f"consumer {c} expects block {it}, stage holds {slot[st]}"
            reads[c].append(it)
            released[st].add(c)
            empty[st].arrive()
            cons[c] += 1
    assert all(r == list(range(blocks)) for r in reads)


def _all_schedules(stages, blocks, consumers):
    """Every choice sequence, depth first: each run follows a recorded prefix of choices, then
    takes the first move, and queues every alternative at the points it passed (small cases)."""
    stack, count = [[]], 0
    while stack:
        prefix = stack.pop()
        taken, forks = [], []

        def choose(moves, prefix=prefix, taken=taken, forks=forks):
            k = len(taken)
            i = prefix[k] if k < len(prefix) else 0
            if k >= len(prefix) and len(moves) > 1:
                forks.append((k, len(moves)))
            taken.append(i)
            return moves[i]

        run(stages, blocks, consumers, choose)
        count += 1
        for k, n in forks:
            stack.extend(taken[:k] + [alt] for alt in range(1, n))
    return count


@pytest.mark.parametrize("stages,blocks,consumers", [(2, 5, 2), (3, 4, 2), (2, 3, 3)])
def test_every_interleaving(stages, blocks, consumers):
    assert _all_schedules(stages, blocks, consumers) > 1


@pytest.mark.parametrize(
    "stages,blocks,consumers", list(itertools.product((2, 3, 4), (1, 7, 64), (4, 128)))
)
def test_random_schedules(stages, blocks, consumers):
    rng = random.Random(stages * 1000 + blocks * 10 + consumers)
    for _ in range(20):
        run(stages, blocks, consumers, lambda moves: rng.choice(moves))


def _producer_ahead(parity, stages=2, blocks=4):
    """The producer alone, as far as its waits on empty[] let it go before any consumer reads:
    it must stop at the first refill."""
    empty = [MBarrier(1) for _ in range(stages)]
    filled = []
    for prod in range(blocks):
        if prod >= stages and not empty[prod % stages].done(parity(prod, stages)):
            break
        filled.append(prod)
    return filled


def test_the_model_catches_a_wrong_parity():
    """With the consumers' parity (it / S) & 1, the producer's first refill would pass a fresh
    empty barrier at once and overwrite an unread block; the kernel's (it / S - 1) & 1 waits."""
    assert _producer_ahead(lambda it, s: (it // s - 1) & 1) == [0, 1]
    assert _producer_ahead(lambda it, s: (it // s) & 1) == [0, 1, 2, 3]


# ---------------------------------------------------------------------------------------------
# Variant 3 (Note [tma blocks]) at lane granularity.


class Violation(AssertionError):
    """An invariant broke; kind: "stale read", "overwrite", "phase" or "deadlock"."""

    def __init__(self, kind, msg):
        super().__init__(f"{kind}: {msg}")
        self.kind = kind


class TxBarrier:
    """PTX mbarrier with a transaction count: a phase completes when its pending arrivals reach 0
    and its tx-count is 0. expect_tx raises the tx-count, complete_tx (part of a TMA copy landing)
    lowers it, below 0 for a while if it lands first. An arrival on a phase with no pending
    arrival left (one its tx-count holds open) is a violation here: the kernel never means one,
    and the pending count would go below 0. try_wait.parity as MBarrier's."""

    __slots__ = ("count", "pending", "tx", "phase")

    def __init__(self, count):
        self.count, self.pending, self.tx, self.phase = count, count, 0, 0

    def clone(self):
        b = TxBarrier.__new__(TxBarrier)
        b.count, b.pending, b.tx, b.phase = self.count, self.pending, self.tx, self.phase
        return b

    def key(self):
        return self.pending, self.tx, self.phase

    def arrive(self, expect_tx=0):
        if self.pending == 0:
            raise Violation("phase", f"an arrival beyond the count (tx-count {self.tx} left)")
        self.tx += expect_tx
        self.pending -= 1
        self._complete()

    def expect_tx(self, n):
        self.tx += n
        self._complete()

    def complete_tx(self, n):
        self.tx -= n
        self._complete()

    def _complete(self):
        if self.pending == 0 and self.tx == 0:
            self.phase += 1
            self.pending = self.count

    def done(self, parity):
        return (self.phase & 1) != parity


# Planted bugs in the producer (None: the kernel as written).
MUTATIONS = {
    "a_arrive_without_expect_tx": "lane 0 of a TMA block arrives plainly: no expect_tx",
    "b_full_count_short": "full[] initialised with one arrival fewer than the producer lanes",
    "c_tma_skips_empty_wait": "the TMA path does not wait on empty[stage]",
    "d_expect_tx_after_issue": "lane 0 issues the TMA copies, then arrive.expect_tx",
    "d_expect_tx_apart": "lane 0 arrives, issues the TMA copies, then expect_tx (no arrival)",
    "tma_lanes_silent": "lanes 1.. of a TMA block wait on empty[] but do not arrive on full[]",
}


def _program(path, lane, mutation, syncwarp):
    """The ops of one producer lane for one key block (kernel.cuh, the producer loop)."""
    if path == "g":
        # row_off writes; __syncwarp; wait empty; cp.async and cp.async.mbarrier.arrive.noinc
        # (its arrival lands later, as an event); __syncwarp.
        return ("sync", "wait", "cp", "sync") if syncwarp else ("wait", "cp")
    wait = () if mutation == "c_tma_skips_empty_wait" else ("wait",)
    if lane != 0:
        return wait if mutation == "tma_lanes_silent" else (*wait, "arrive")
    return wait + {
        "a_arrive_without_expect_tx": ("arrive", "tma"),
        "d_expect_tx_after_issue": ("tma", "arrive_expect"),
        "d_expect_tx_apart": ("arrive", "tma", "expect"),
    }.get(mutation, ("arrive_expect", "tma"))


class LaneRing:
    """The ring of variant 3: `lanes` producer lanes (32 in the kernel), each with its own
    program counter (_program); pending asynchronous events; `consumers` consumer actors.

    paths[it] is "t" for a TMA block and "g" for a gathered one. A TMA block's copies land as
    `parts` complete_tx(1) events (4 at hd128: two boxes each of K and V), against lane 0's
    expect_tx(parts). A gathered block gives one event per lane: its copies land, then its noinc
    arrival on full[]. A lane's pending events may land in any order (the hardware orders a
    lane's noinc arrivals after all of its earlier copies: a subset of these orders, so what
    holds here holds there).

    A consumer move is wait(full[stage]) + read + arrive(empty[stage]) at once; reading at the
    earliest moment is the strictest test of the data having landed, and the producer's
    overwrite check counts a consumer as reading until its arrival. empty[] counts the consumer
    actors: the kernel's 128 threads each arrive once per block alike, so C actors stand for
    them (C = 1 or 2 exhaustively, 4 in random runs).

    Ghost state for the invariants: owner[stage] (the block whose copies the stage receives),
    landed[stage] (bit l: lane l's copies of a gathered block; bit lanes + p: TMA part p)."""

    def __init__(self, stages, paths, lanes=32, consumers=4, parts=4, mutation=None, syncwarp=True):
        assert mutation is None or mutation in MUTATIONS
        self.S, self.B, self.L, self.C, self.P = stages, len(paths), lanes, consumers, parts
        self.progs = [[_program(p, n, mutation, syncwarp) for n in range(lanes)] for p in paths]
        self.need = [((1 << parts) - 1) << lanes if p == "t" else (1 << lanes) - 1 for p in paths]
        count = lanes - 1 if mutation == "b_full_count_short" else lanes
        self.full = [TxBarrier(count) for _ in range(stages)]
        self.empty = [TxBarrier(consumers) for _ in range(stages)]
        self.pc = [(0, 0)] * lanes  # (block, op index)
        self.events = frozenset()  # ("cp", lane, block) or ("tx", block, part)
        self.owner = [None] * stages
        self.landed = [0] * stages
        self.cons = [0] * consumers  # the next block of each consumer
        self.min_tx = 0  # the lowest tx-count reached (a complete_tx ahead of its expect_tx)

    def clone(self):
        """A copy for another branch; barriers are copied when a move changes them."""
        r = LaneRing.__new__(LaneRing)
        r.__dict__.update(self.__dict__)
        r.full, r.empty, r.pc, r.cons = (
            list(self.full),
            list(self.empty),
            list(self.pc),
            list(self.cons),
        )
        r.owner, r.landed = list(self.owner), list(self.landed)
        return r

    def key(self):
        return (
            tuple(self.pc),
            tuple(map(TxBarrier.key, self.full)),
            tuple(map(TxBarrier.key, self.empty)),
            self.events,
            tuple(self.owner),
            tuple(self.landed),
            tuple(self.cons),
        )

    def _bar(self, bars, s):
        b = bars[s] = bars[s].clone()
        return b

    def lane_enabled(self, lane):
        it, i = self.pc[lane]
        if it == self.B:
            return False
        op = self.progs[it][lane][i]
        if op == "wait":
            return it < self.S or self.empty[it % self.S].done((it // self.S - 1) & 1)
        if op == "sync":  # __syncwarp: every lane has reached this one
            return all(q >= (it, i) for q in self.pc)
        return True

    def consumer_enabled(self, c):
        it = self.cons[c]
        return it < self.B and self.full[it % self.S].done((it // self.S) & 1)

    def moves(self):
        """Actors that can move: lane l is l, consumer c is lanes + c, an event is its tuple."""
        m = [n for n in range(self.L) if self.lane_enabled(n)]
        m += [self.L + c for c in range(self.C) if self.consumer_enabled(c)]
        return m + sorted(self.events)

    def step(self, actor):
        """One move; returns the events it creates."""
        if isinstance(actor, tuple):
            self._land(actor)
        elif actor >= self.L:
            self._read(actor - self.L)
        else:
            return self._lane(actor)
        return ()

    def _lane(self, lane):
        it, i = self.pc[lane]
        prog = self.progs[it][lane]
        op, new = prog[i], ()
        full = self._bar(self.full, it % self.S) if op.startswith(("arrive", "exp")) else None
        if op == "arrive":
            full.arrive()
        elif op == "arrive_expect":
            full.arrive(self.P)
        elif op == "expect":
            full.expect_tx(self.P)
        elif op == "tma":
            self._write(it, f"lane {lane}'s TMA")
            new = tuple(("tx", it, p) for p in range(self.P))
        elif op == "cp":
            self._write(it, f"lane {lane}'s cp.async")
            new = (("cp", lane, it),)
        if new:
            self.events = self.events.union(new)
        if full is not None:
            self.min_tx = min(self.min_tx, full.tx)
        self.pc[lane] = (it + 1, 0) if i + 1 == len(prog) else (it, i + 1)
        return new

    def _write(self, it, who):
        """Copies into stage it % S are issued: the block there before must be released."""
        s = it % self.S
        if it >= self.S and min(self.cons) <= it - self.S:
            raise Violation(
                "overwrite",
                f"{who} writes block {it} into stage {s} before every consumer released block "
                f"{it - self.S} (consumers at {self.cons})",
            )
        if self.owner[s] != it:
            if self.owner[s] != (it - self.S if it >= self.S else None):
                raise Violation("overwrite", f"block {it} into stage {s} of {self.owner[s]}")
            self.owner[s], self.landed[s] = it, 0

    def _land(self, ev):
        self.events = self.events - {ev}
        it = ev[2] if ev[0] == "cp" else ev[1]
        s = it % self.S
        if self.owner[s] != it:
            raise Violation("overwrite", f"{ev} lands in stage {s} of block {self.owner[s]}")
        full = self._bar(self.full, s)
        if ev[0] == "cp":
            self.landed[s] |= 1 << ev[1]
            full.arrive()  # cp.async.mbarrier.arrive.noinc, once the copies landed
        else:
            self.landed[s] |= 1 << (self.L + ev[2])
            full.complete_tx(1)
        self.min_tx = min(self.min_tx, full.tx)

    def _read(self, c):
        it = self.cons[c]
        s = it % self.S
        if self.owner[s] != it or self.landed[s] & self.need[it] != self.need[it]:
            raise Violation(
                "stale read",
                f"consumer {c} reads block {it} from stage {s}: it receives block "
                f"{self.owner[s]}, landed {self.landed[s]:#x} of {self.need[it]:#x}",
            )
        self._bar(self.empty, s).arrive()
        self.cons[c] += 1

    def finish(self):
        """No move left: every lane, consumer and copy must be done (each consumer read blocks
        0 .. B-1 in order, once each, every read checked) and every barrier between phases."""
        if any(it < self.B for it, _ in self.pc) or min(self.cons) < self.B or self.events:
            raise Violation("deadlock", f"lanes at {self.pc}, consumers at {self.cons}")
        for b in self.full + self.empty:
            if (b.pending, b.tx) != (b.count, 0):
                raise Violation("phase", f"a barrier ends mid-phase: {b.key()}, count {b.count}")


def explore(ring):
    """Every state the interleavings reach, each expanded once by every move enabled in it
    (depth first). A state whose move or end breaks an invariant is recorded and not expanded.
    Returns (states, the violations' kinds, the lowest tx-count reached)."""
    seen, stack, kinds, low = {ring.key()}, [ring], set(), 0
    while stack:
        r = stack.pop()
        moves = r.moves()
        try:
            if not moves:
                r.finish()
        except Violation as v:
            kinds.add(v.kind)
        for a in moves:
            n = r.clone()
            try:
                n.step(a)
            except Violation as v:
                kinds.add(v.kind)
                continue
            low = min(low, n.min_tx)
            k = n.key()
            if k not in seen:
                seen.add(k)
                stack.append(n)
    return len(seen), kinds, low


SPEEDS = (1.0, 1.0, 4.0, 30.0)


def simulate(ring, rng):
    """One random schedule, as a race of exponential clocks: every actor (a lane, a consumer, a
    lane's pending copies, the TMA copies) draws a rate for the run, so that in some runs some
    lanes' copies or some consumers lag far behind, and among the enabled moves the next is drawn
    in proportion to their rates. A blocked actor waits on what blocks it (empty[s], full[s], or
    its __syncwarp, released once every lane has reached it) and races again when that changes.
    Raises Violation."""
    L, S = ring.L, ring.S
    rate = {a: rng.choice(SPEEDS) for a in [*range(L + ring.C), "tx"]}
    for n in range(L):
        rate["cp", n] = rng.choice(SPEEDS)
    heap, now, order = [], 0.0, itertools.count()
    on_empty, on_full = [set() for _ in range(S)], [set() for _ in range(S)]
    at_sync = {}  # (block, op index) -> the lanes that have reached that __syncwarp

    def race(a, r):
        heapq.heappush(heap, (now + rng.expovariate(r), next(order), a))

    def place(a):  # a lane or a consumer, after its move or a change of what blocked it
        if a >= L:
            it = ring.cons[a - L]
            if ring.consumer_enabled(a - L):
                race(a, rate[a])
            elif it < ring.B:
                on_full[it % S].add(a)
            return
        it, i = ring.pc[a]
        if it == ring.B:
            return
        if ring.progs[it][a][i] == "sync":
            lanes = at_sync.setdefault((it, i), [])
            lanes.append(a)
            if len(lanes) == L:
                for n in at_sync.pop((it, i)):
                    race(n, rate[n])
        elif ring.lane_enabled(a):
            race(a, rate[a])
        else:
            on_empty[it % S].add(a)

    def enabled(a):  # a lane released from a __syncwarp stays so
        if a >= L:
            return ring.consumer_enabled(a - L)
        it, i = ring.pc[a]
        return ring.progs[it][a][i] != "wait" or ring.lane_enabled(a)

    def wake(waiters):
        for a in list(waiters):
            waiters.discard(a)
            place(a)

    for a in range(L + ring.C):
        place(a)
    while heap:
        now, _, a = heapq.heappop(heap)
        if isinstance(a, int) and not enabled(a):
            place(a)  # disabled since it began to race (only a mutation can do that)
            continue
        # The one barrier a move can change: full[] of the lane's or the copies' block, or
        # empty[] of the consumer's.
        if isinstance(a, tuple):
            bars, waiters, s = ring.full, on_full, (a[2] if a[0] == "cp" else a[1]) % S
        elif a >= L:
            bars, waiters, s = ring.empty, on_empty, ring.cons[a - L] % S
        else:
            bars, waiters, s = ring.full, on_full, ring.pc[a][0] % S
        phase = bars[s].phase
        for e in ring.step(a):
            race(e, rate["cp", e[1]] if e[0] == "cp" else rate["tx"])
        if isinstance(a, int):
            place(a)
        if bars[s].phase != phase:
            wake(waiters[s])
    ring.finish()


def test_tx_barrier():
    """A phase needs its arrivals and a tx-count of 0: a complete_tx ahead of its expect_tx
    leaves the count below 0, and holds the phase, until expect_tx brings it back."""
    b = TxBarrier(2)
    b.complete_tx(3)
    b.arrive()
    assert (b.pending, b.tx, b.done(0)) == (1, -3, False)
    b.arrive(3)
    assert (b.pending, b.tx, b.done(0)) == (2, 0, True)
    b.arrive(1)
    b.arrive()
    with pytest.raises(Violation, match="phase: an arrival beyond the count"):
        b.arrive()  # the tx-count holds the phase; its arrivals are all in


ALL_PATHS_3 = ["".join(p) for p in itertools.product("tg", repeat=3)]


@pytest.mark.parametrize("syncwarp", [True, False], ids=["syncwarp", "no-syncwarp"])
@pytest.mark.parametrize("paths", ALL_PATHS_3)
def test_lanes_every_interleaving(paths, syncwarp):
    """2 stages, 3 lanes, 2 consumers, TMA copies landing in 2 parts; every path pattern of 3
    blocks (all TMA, all gathered, alternating, a gathered last block, ...). Without the gather
    path's __syncwarps (a superset of the kernel's interleavings) the lanes drift further
    apart."""
    ring = LaneRing(2, paths, lanes=3, consumers=2, parts=2, syncwarp=syncwarp)
    states, kinds, _ = explore(ring)
    assert kinds == set()
    assert states > 1000


@pytest.mark.parametrize("stages,blocks,consumers", [(2, 4, 2), (2, 5, 1), (3, 4, 1)])
def test_lanes_every_interleaving_longer(stages, blocks, consumers):
    """Two lanes, TMA in 2 parts, every path pattern: refills of each stage after either path."""
    for paths in itertools.product("tg", repeat=blocks):
        ring = LaneRing(stages, "".join(paths), lanes=2, consumers=consumers, parts=2)
        assert explore(ring)[1] == set()


PATTERNS = {
    "tma": lambda blocks, rng: "t" * blocks,
    "gather": lambda blocks, rng: "g" * blocks,
    "alternating": lambda blocks, rng: ("tg" * blocks)[:blocks],
    "alternating_g": lambda blocks, rng: ("gt" * blocks)[:blocks],
    "last_gathered": lambda blocks, rng: "t" * (blocks - 1) + "g",  # a partial last block
    "random": lambda blocks, rng: "".join(rng.choice("tg") for _ in range(blocks)),
}


RANDOM_RUNS = 150  # per pattern: ~0.4 s each (the file's older random runs take ~10 s)


@pytest.mark.parametrize("pattern", PATTERNS)
def test_lanes_random_schedules(pattern):
    """The kernel's sizes: 32 lanes, TMA landing in 4 parts (K and V, two boxes each at hd128);
    3 stages, 8 blocks, 4 consumer actors."""
    rng = random.Random(pattern)
    for _ in range(RANDOM_RUNS):
        simulate(LaneRing(3, PATTERNS[pattern](8, rng)), rng)


# (mutation, paths, the kinds of violation that every interleaving of it shows, exhaustively)
CAUGHT = [
    # The phase completes on 3 arrivals, before the TMA lands (stale read); the complete_tx
    # events then drive the next phase's tx-count below 0, where it stays (deadlock).
    ("a_arrive_without_expect_tx", "ttt", {"stale read", "deadlock"}),
    ("a_arrive_without_expect_tx", "gtg", {"stale read", "deadlock", "phase"}),
    # Gathered: the phase completes before the last lane's copies land; TMA: lanes 1.. complete
    # it before lane 0's expect_tx.
    ("b_full_count_short", "ggg", {"stale read", "deadlock"}),
    ("b_full_count_short", "ttt", {"stale read", "deadlock", "phase"}),
    # TMA into a stage the consumers still read (overwrite); lanes 1.. arrive early, in the
    # phase of the stage's previous block: past its count (phase) or completing it before its
    # data landed (stale read).
    ("c_tma_skips_empty_wait", "tgt", {"overwrite", "phase"}),
    ("c_tma_skips_empty_wait", "ttt", {"overwrite", "stale read", "phase"}),
    # No TMA block refills a stage (2 stages): the missing wait is never needed.
    ("c_tma_skips_empty_wait", "ttg", set()),
    # The plain arrival completes the phase before expect_tx raises the tx-count.
    ("d_expect_tx_apart", "tgt", {"stale read"}),
    ("tma_lanes_silent", "gtg", {"deadlock"}),
]


@pytest.mark.parametrize("mutation,paths,kinds", CAUGHT)
def test_lanes_mutations_are_caught(mutation, paths, kinds):
    ring = LaneRing(2, paths, lanes=3, consumers=2, parts=2, mutation=mutation)
    assert explore(ring)[1] == kinds


@pytest.mark.parametrize("paths", ["ttt", "tgt", "gtg", "ggt"])
def test_expect_tx_after_the_issue_is_harmless(paths):
    """Mutation (d): lane 0 issues the TMA copies, then arrive.expect_tx. Parts may land first
    (the tx-count reaches -2, every part ahead of expect_tx), but lane 0's own arrival, which
    comes with the expect_tx in one atomic operation, holds the phase open until then: with the
    arrival pending the tx-count cannot complete it, and once both are in it is the bytes still
    to land. Every interleaving is clean: the order of expect_tx and the issue does not matter,
    as long as lane 0 arrives no earlier than its expect_tx (d_expect_tx_apart shows the rest)."""
    ring = LaneRing(2, paths, lanes=3, consumers=2, parts=2, mutation="d_expect_tx_after_issue")
    _, kinds, low = explore(ring)
    assert kinds == set()
    assert low == -2


@pytest.mark.parametrize("mutation", [m for m in MUTATIONS if m != "d_expect_tx_after_issue"])
def test_lanes_random_schedules_catch_mutations(mutation):
    """At the kernel's sizes too (32 lanes, 4 parts, 3 stages, random paths of 8 blocks) some of
    40 seeded random runs catch each mutation."""
    rng = random.Random(mutation)
    caught = 0
    for _ in range(40):
        try:
            simulate(LaneRing(3, PATTERNS["random"](8, rng), mutation=mutation), rng)
        except Violation:
            caught += 1
    assert caught > 0


def test_lanes_random_schedules_expect_tx_after_the_issue():
    """Mutation (d) at the kernel's sizes: clean, as exhaustively in the small rings."""
    rng = random.Random(7)
    for _ in range(40):
        simulate(LaneRing(3, PATTERNS["random"](8, rng), mutation="d_expect_tx_after_issue"), rng)

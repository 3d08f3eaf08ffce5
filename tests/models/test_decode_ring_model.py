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
Plain CPU test.
"""

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

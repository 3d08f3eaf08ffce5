#!/usr/bin/env python3
"""Role programs of the SM90 forward kernel and of the decode kernel, extracted from their
source by tools/sync_extract.py's abstract interpreter (docs/testing.md, "SM90 and decode
extraction"), and explored by tools/protocol_model.py's Machine.

Roles. SM90 forward (csrc/sm90/fwd/kernel.cuh): the producer thread (threadIdx.x 0) and each
consumer warpgroup (one process of 128 threads: an arrival it makes counts 128, as the
kernel's every thread arrives). Decode (csrc/decode/kernel.cuh): the producer warp 4 (32
threads) and each of the four consumer warps (32 threads each: they meet at bar.sync 1, so
they are four processes).

Decisions (primitives modelled by their documented semantics, each failing loudly outside
its case):
  - CUTLASS PipelineTmaAsync (the source is a library, not parsed): a pipeline `pipe` is two
    barrier arrays, pipe.full (arrival count 1, a TMA transaction) and pipe.empty (arrival
    count num_consumers / 128: CUTLASS counts consumer warpgroups, and consumer_release
    arrives once per warpgroup), kStages copies each. A PipelineState is (index, phase,
    count); ++ advances the index and flips the phase on wrapping; make_producer_start_state
    starts at phase 1, a default PipelineState at phase 0. producer_acquire(s) = wait on
    empty[s.index] with parity s.phase, then the leader's arrive_and_expect_tx on full[s.index]
    (the transaction's copy must follow); producer_get_barrier(s) = full[s.index];
    consumer_wait(s) = wait on full[s.index], parity s.phase; consumer_release(s) = arrive on
    empty[s.index]; producer_tail(s) = kStages acquires' waits, each followed by ++s.
  - ClusterBarrier (and ClusterTransactionBarrier) objects and uint64_t barrier words:
    init(bar, n) / bar.init(n) give the arrival count (the explorer's table is what the run
    inits: mutating an init mutates the model), wait(parity), arrive, arrive_and_expect_tx.
  - Named barriers (NamedBarrier::sync / arrive (threads, id), asm "bar.sync id, n"): a
    barrier of `threads` arrivals per phase; sync = arrive with the role's threads, then wait
    for the phase of the role's k-th use of that barrier (every participant contributes once
    per phase). A named barrier whose count is the role's own thread count orders threads of
    one modelled process only: it is not recorded (INTERNAL_BARRIERS lists the sites).
  - wgmma reads its shared-memory operands when issued (warpgroup_wait is the warpgroup's
    program order: a release after it comes after the read). The TMA store of O and its
    staging buffer (per warpgroup, ordered by the warpgroup's own barrier and bulk-group
    wait) are not modelled.
  - Decode: cp.async copies are asynchronous writes of the stage; cp_async_arrive is their
    transaction (a TMA-like step arriving with the warp's 32 lanes when they land); copies
    with no arrival before the next sync op land on a barrier that never completes. The
    epilogue's shared-memory stores alias the whole ring (a write of every stage) and its
    row statistics (epi_lse) are per-warp buffers read by every warp's merge. The FP8 cache
    (kKvFp8) is read from the stage as the 16-bit one is (Note [fp8 fragments]).
  - Decode producers (the Config's variant: 2, the gather, kTma false; 3, kTma true, as the
    A/B named them): 2 (copy_block, its destination a lambda of the row and chunk) is a
    cp.async gather of the stage and cp_async_arrive. Variant 3 (Note
    [tma blocks]): whether block `it` of the split goes by TMA (tma_block(...).ok, data
    dependent) is the Config's `paths[it]` ('t' TMA, 'g' gathered: a partial last block, a
    block across a page boundary). The gathered blocks are copy_block's cp.async into the
    swizzled tiles (v_tile: the stage's V). A TMA block: the producer warp stays one process;
    its branch on `lane == 0` (Env90.lane_split) runs both sides, lane 0's first with its
    arrivals counting 1, then lanes 1-31's counting 31 (ClusterBarrier::arrive: one Arrive of
    31). Lane 0's ClusterTransactionBarrier::arrive_and_expect_tx(&full[stage], bytes) and the
    TMA copies naming that barrier before the next sync op (tma_load_block's
    copy(tma.with(bar), ...) of args.tma_k and args.tma_v: the stage's K and V) are one
    transaction, a pm.Tma whose one arrival comes when every copy has landed. So full[stage]
    (32 arrivals) completes only after the 31 plain arrivals and the landing of both tiles.
    This is exact for the phase: the real expect_tx arrival comes before the copies are
    issued, and the phase needs the transaction's bytes too, so it completes at the later of
    the other arrivals and the landing either way. Abstractions: the byte counts are not
    checked (kTmaBytes against the two tiles' bytes: a transaction is complete when its copies
    landed); neither side of a lane branch may wait (refused: its lanes would not wait for the
    other side's), and an expect_tx by more than one thread is refused; the lanes' own program
    counters are not modelled (the warp is one process; tests/models/test_decode_ring_model.py
    explores variant 3 at lane granularity with tx counts); proxies are not modelled
    (fence_view_async_shared before a TMA fill of a stage whose last fill was a generic-proxy
    gather is not checked).
Values the kernels read at run time come from the Config (KV blocks per tile, trait
constants, run-time votes); everything else is opaque, as in sync_extract.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import protocol_model as pm  # noqa: E402
import sync_extract as se  # noqa: E402
from sync_extract import OPAQUE, BarRef, Coord, ExtractError, Op, txt  # noqa: E402

ROOT = se.ROOT
FWD90_FILES = (
    "csrc/sm90/fwd/kernel.cuh",
    "csrc/sm90/fwd/epilogue.cuh",
    "csrc/sm90/fwd/traits.cuh",
    "csrc/sm90/common.cuh",
    "csrc/common/tile_ring.cuh",
)
DECODE_FILES = ("csrc/decode/kernel.cuh", "csrc/decode/copy.cuh")

# Calls the interpreter records (the sync primitives and the data accesses of these kernels).
WAITS = {"wait", "wait_barrier", "consumer_wait", "producer_acquire", "producer_tail", "sync"}
ARRIVES = {"arrive", "arrive_and_expect_tx", "consumer_release", "cp_async_arrive"}
SYNC_NAMES = WAITS | ARRIVES
DATA_NAMES = {"copy", "gemm", "gemm_zero_acc", "cp_async_16", "cp_async_16_free", "ldmatrix_x4",
              "ldmatrix_x4_trans", "init", "producer_commit"}  # fmt: skip
PRIM_RE = re.compile(
    r"\b(" + "|".join(sorted(SYNC_NAMES | DATA_NAMES)) + r")\s*\(|bar\.sync|cp\.reduce\.async|"
    r"red\.release\.gpu"
)
INTERNAL_BARRIERS: set = set()  # (file, line) of named barriers internal to one role


# ---- Values ----------------------------------------------------------------------------------
@dataclass
class PState:
    """cutlass::PipelineState: stage index, phase, and the count of advances."""

    stages: int
    idx: int = 0
    ph: int = 0
    count: int = 0

    def index(self):
        return self.idx

    def phase(self):
        return self.ph

    def advance(self):
        self.idx, self.count = self.idx + 1, self.count + 1
        if self.idx == self.stages:
            self.idx, self.ph = 0, self.ph ^ 1

    def copy(self):
        return PState(self.stages, self.idx, self.ph, self.count)


@dataclass
class Pipe:
    name: str  # pipe_k: barriers pipe_k.full / pipe_k.empty
    stages: int


@dataclass
class Params:  # typename Pipe::Params: the fields the kernel assigns
    f: dict = field(default_factory=dict)


@dataclass(frozen=True)
class TmaDesc:
    name: str  # kp.tma_k


@dataclass(frozen=True)
class BufAddr:  # a shared-memory address inside a modelled buffer (offsets are irrelevant)
    buf: str
    kind: str


class Struct:
    """An aggregate the roles build (ClaimedTile): fields by declaration order."""

    def __init__(self, names, vals):
        self.__dict__.update(zip(names, vals, strict=True))


@dataclass
class BlockRange:
    n_begin: int
    n_end: int
    left_end: int = 0

    def empty(self):
        return self.n_end <= self.n_begin

    def needs_mask(self, n):
        return OPAQUE


@dataclass
class Work:  # TileWork: the tile and its mask, as far as the roles read them
    tile: Coord
    blocks: int
    mask: object


@dataclass
class FileClosure(se.Closure):  # a lambda and the file that defines it
    file: str | None = None


class TileRingObj:  # ss.tiles: its methods run with the members in scope
    pass


# ---- The interpreter ---------------------------------------------------------------------------
class Interp90(se.Interp):
    """sync_extract.Interp with the SM90 / decode primitives (module docstring)."""

    def __init__(self, funcs, env, role_name, threads):
        super().__init__(funcs, env, role_name, threads)
        self.named_uses: dict = {}  # named barrier -> this role's uses so far
        self.cp_pending: list = []  # decode: the stage writes of cp.async since the last arrive

    # -- what may record an op
    def effects(self, node, scope) -> bool:
        text = txt(node)
        if PRIM_RE.search(text) or re.search(r"\bepi(_lse)?\b", text):
            return True
        for name in re.findall(r"\b(\w+)\s*(?:<[^<>()]*>)?\s*\(", text):
            s = scope.find(name)
            if (
                name in self.env.prims
                or (name in self.funcs and name not in self.env.pure)
                or (s is not None and isinstance(s.vars[name], se.Closure))
            ):
                return True
        return False

    def sync(self, step, site=None):
        self.flush_cp()
        super().sync(step, site)

    def flush_cp(self):
        """cp.async writes with no arrival before the next sync op: they land, unsignalled."""
        if self.cp_pending:
            writes, self.cp_pending = self.cp_pending, []
            self.ops.append(Op(_tma("cp.async-unsignalled", 0, writes, 0)))

    def record_init(self, name, idx, count, where):
        if self.threads == 0:
            return  # a probe run (_extract90)
        if not isinstance(count, int) or not isinstance(idx, int):
            raise ExtractError(f"{self.role}: barrier init of {name} unknown at {where}")
        old = self.env.inits.get((name, idx))
        if old is not None and old != count:
            raise ExtractError(f"{self.role}: {name}[{idx}] used with {old} and {count} threads")
        self.env.inits[(name, idx)] = count

    # -- declarations: pipeline objects, states, structs; the Config's run-time values
    def declaration(self, n, scope):
        typ = " ".join(txt(n.child_by_field_name("type")).split())
        for d in n.children_by_field_name("declarator"):
            init = d.child_by_field_name("value") if d.type == "init_declarator" else None
            name, _ = self._declarator(d.child_by_field_name("declarator") if init else d)
            if name is None:
                continue
            rule = self.env.decls.get(name)
            if rule is not None and (rule[1] is None or init is not None
                                     and re.search(rule[1], txt(init))):  # fmt: skip
                scope.vars[name] = rule[0](self.lookup_or(scope))
                continue
            if typ.endswith("Params") and init is None:
                scope.vars[name] = Params()
                continue
            if typ in ("Pipe",) or typ.endswith("PipelineKV"):
                args = init.named_children if init is not None else []
                scope.vars[name] = self.make_pipe(args, scope)
                continue
            if init is None:
                scope.vars[name] = OPAQUE
                continue
            if init.type == "initializer_list" and typ in self.env.structs:
                vals = [self.expr(c, scope) for c in init.named_children]
                scope.vars[name] = Struct(self.env.structs[typ], vals)
                continue
            val = self.expr(init, scope)
            if isinstance(val, (PState, Params)):
                val = val.copy() if isinstance(val, PState) else Params(dict(val.f))
            scope.vars[name] = val

    def lookup_or(self, scope):
        def get(name):
            s = scope.find(name)
            return s.vars[name] if s is not None else self.lookup(name)

        return get

    def make_pipe(self, args, scope):
        """Pipe pipe_k(ss.pipe_k, params, cluster shape): the barriers' init counts."""
        if len(args) < 2:
            raise ExtractError(f"{self.role}: pipeline constructed without its params")
        name = txt(args[0]).split(".")[-1]
        params = self.expr(args[1], scope)
        stages = self.env.consts["T::kStages"]
        consumers = params.f.get("num_consumers", OPAQUE) if isinstance(params, Params) else OPAQUE
        if not isinstance(consumers, int):
            raise ExtractError(f"{self.role}: {name}: num_consumers unknown")
        for i in range(stages):
            self.record_init(f"{name}.full", i, 1, name)
            self.record_init(f"{name}.empty", i, consumers // 128, name)
        return Pipe(name, stages)

    def _lvalue(self, n, scope):
        if n.type == "field_expression":
            obj = self.expr(n.child_by_field_name("argument"), scope)
            name = txt(n.child_by_field_name("field"))
            if isinstance(obj, Params):
                return (lambda: obj.f.get(name, OPAQUE)), (lambda v: obj.f.__setitem__(name, v))
            if isinstance(obj, Struct):
                return (lambda: getattr(obj, name)), (lambda v: setattr(obj, name, v))
        return super()._lvalue(n, scope)

    def update(self, n, scope):
        arg = n.child_by_field_name("argument")
        val = self.expr(arg, scope) if arg.type == "identifier" else None
        if isinstance(val, PState):  # ++state: in place (states are passed by reference)
            val.advance()
            return val
        return super().update(n, scope)

    def assign(self, n, scope):
        left = n.child_by_field_name("left")
        if re.search(r"\bepi(_lse)?\b", txt(left)):
            v = self.expr(n.child_by_field_name("right"), scope)
            self.epi_store(left, scope)
            return v
        return super().assign(n, scope)

    # -- expressions
    def expr(self, n, scope):
        t = n.type
        if t == "lambda_expression":  # a closure runs in its file (the sites of its ops)
            return FileClosure(n, scope, self.file)
        if t == "compound_literal_expression" and txt(n.child_by_field_name("type")).endswith(
            "PipelineState"
        ):
            return PState(self.env.consts["T::kStages"])
        if t == "pointer_expression" and txt(n).startswith("*"):
            arg = n.child_by_field_name("argument")
            if re.search(r"\bepi\b", txt(arg)) and "const" in txt(arg):
                return OPAQUE  # the merge's reads of the partial O rows (beside epi_lse)
        if t == "subscript_expression" and re.match(r"epi_lse\s*\[", txt(n)):
            i = self.expr(n.child_by_field_name("indices").named_children[0], scope)
            if not isinstance(i, int):
                raise ExtractError(f"{self.role}: epi_lse index unknown: {txt(n)[:60]}")
            w = i // 16
            self.data(pm.Read(f"epi{w}", ("epi", w)))
            return OPAQUE
        return super().expr(n, scope)

    def binary(self, n, scope):
        """Address arithmetic keeps the buffer (BufAddr + offset); the rest as Interp's."""
        op = txt(n.child_by_field_name("operator"))
        if op not in ("+", "-"):
            return super().binary(n, scope)
        a = self.expr(n.child_by_field_name("left"), scope)
        b = self.expr(n.child_by_field_name("right"), scope)
        if isinstance(a, BufAddr) or isinstance(b, BufAddr):
            return a if isinstance(a, BufAddr) else b
        if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (a, b)):
            return OPAQUE
        return a + b if op == "+" else a - b

    def field(self, n, scope):
        key = "".join(txt(n).split())
        if key in self.env.fields:
            return self.env.fields[key]
        obj = self.expr(n.child_by_field_name("argument"), scope)
        if isinstance(obj, Struct):
            return getattr(obj, txt(n.child_by_field_name("field")), OPAQUE)
        return super().field(n, scope)

    # -- calls
    def call(self, n, scope):  # noqa: C901 (one dispatch over the primitives)
        fn = n.child_by_field_name("function")
        name = callee_name(fn)
        args = self.args(n)
        site = (self.file, n.start_byte)
        self.env.executed.add(site)
        ftext = txt(fn)
        obj = None
        if fn.type == "field_expression":
            obj = self.expr(fn.child_by_field_name("argument"), scope)
            if isinstance(obj, TmaDesc) and name == "with":
                return ("tma", obj.name, self.expr(args[0], scope))
            if isinstance(obj, Pipe):
                return self.pipe_call(obj, name, args, scope, site, n)
            if isinstance(obj, BarRef):
                return self.bar_call(obj, name, args, scope, site, n)
            if isinstance(obj, TileRingObj):
                return self.call_member(name, [self.expr(a, scope) for a in args])
            if isinstance(obj, PState) and name in ("index", "phase"):
                return getattr(obj, name)()
        if name == "sync" or name == "arrive" and "NamedBarrier" in ftext:
            return self.named(name, args, scope, site, n)
        if name in ("wait", "wait_barrier") and obj is None:  # ClusterBarrier::wait(bar, parity)
            bar, par = self.expr(args[0], scope), self.expr(args[1], scope)
            se._need_known(self.role, bar, par, n)
            self.sync(pm.Wait(bar.name, bar.idx, par & 1), site)
            return None
        if name == "arrive" and obj is None:
            bar = self.expr(args[0], scope)
            se._need_known(self.role, bar, 0, n)
            self.sync(pm.Arrive(bar.name, bar.idx, self.threads), site)
            return None
        if name == "init" and obj is None:
            bar = self.expr(args[0], scope)
            se._need_known(self.role, bar, 0, n)
            self.record_init(bar.name, bar.idx, self.expr(args[1], scope), txt(n)[:60])
            return None
        if name == "cp_async_arrive":
            bar = self.expr(args[0], scope)
            se._need_known(self.role, bar, 0, n)
            writes, self.cp_pending = self.cp_pending, []
            self.sync(_tma(bar.name, bar.idx, writes, self.threads), site)
            return None
        if name in ("cp_async_16", "cp_async_16_free"):
            dst = self.expr(args[0], scope)
            if not isinstance(dst, BufAddr):
                raise ExtractError(f"{self.role}: cp.async into no buffer: {txt(n)[:60]}")
            w = (dst.buf, self.tag(dst.kind, "write"), 0)
            if w not in self.cp_pending:
                self.cp_pending.append(w)
            return None
        if name in ("ldmatrix_x4", "ldmatrix_x4_trans"):
            src = self.expr(args[0], scope)
            if isinstance(src, BufAddr):
                self.data(pm.Read(src.buf, self.tag(src.kind, "read")))
            return None
        if name in ("gemm", "gemm_zero_acc"):
            for a in args:
                if a.type == "call_expression":
                    view = txt(a.child_by_field_name("function"))
                    if view in self.env.views:
                        kind = self.env.views[view]
                        idx = self.expr(self.args(a)[-1], scope)
                        if not isinstance(idx, int):
                            raise ExtractError(f"{self.role}: wgmma operand stage unknown")
                        self.data(pm.Read(f"{kind}{idx}", self.tag(kind, "read")))
            return None
        if name == "arrive_and_expect_tx" and obj is None:
            # ClusterTransactionBarrier::arrive_and_expect_tx(bar, bytes): as the member call;
            # its arrival is the Tma step's (one thread's: _load counts 1)
            if self.threads > 1:
                raise ExtractError(f"{self.role}: arrive_and_expect_tx by {self.threads} "
                                   f"threads: {txt(n)[:60]}")  # fmt: skip
            bar = self.expr(args[0], scope)
            se._need_known(self.role, bar, 0, n)
            return self.bar_call(bar, name, args[1:], scope, site, n)
        if name == "copy":
            return self.copy(n, args, scope, site)
        if name in self.env.overrides:
            return self.env.overrides[name](self, *[self.expr(a, scope) for a in args])
        if name in ("reinterpret_cast", "static_cast", "uint32_t", "int", "int64_t"):
            return self.expr(args[0], scope) if args else OPAQUE
        if name in self.env.pure:  # a parsed function that records nothing: its arguments only
            for a in args:
                self.expr(a, scope)
            return OPAQUE
        if fn.type == "qualified_identifier" and name in self.funcs:  # detail::copy_block
            return self.call_function(name, [self.expr(a, scope) for a in args])
        if fn.type == "template_function" and name in self.funcs:
            return self.call_function(name, [self.expr(a, scope) for a in args])
        s = scope.find(name) if fn.type == "identifier" else None
        if s is not None and isinstance(s.vars[name], se.Closure):
            return self.call_closure(s.vars[name], [self.expr(a, scope) for a in args])
        if name in self.funcs and fn.type == "identifier":
            return self.call_function(name, [self.expr(a, scope) for a in args])
        if obj is not None and obj is not OPAQUE and callable(getattr(obj, name, None)):
            return getattr(obj, name)(*[self.expr(a, scope) for a in args])
        if PRIM_RE.search(txt(n.child_by_field_name("arguments"))):
            raise ExtractError(f"{self.role}: op inside an unknown call {name}(...)")
        return OPAQUE

    def call_closure(self, clo, args):
        saved, self.file = self.file, getattr(clo, "file", self.file)
        try:
            return super().call_closure(clo, args)
        finally:
            self.file = saved

    def call_member(self, name, args):
        """A TileRing method: its members full / empty / item in scope."""
        node, fname = self.funcs[name]
        self.called.add(name)
        members = se.Scope()
        members.vars.update(self.env.ring_members)
        decl = node.child_by_field_name("declarator")
        while decl.type != "function_declarator":
            decl = decl.child_by_field_name("declarator")
        scope = se.Scope(members)
        self._bind(decl.child_by_field_name("parameters"), args, scope)
        saved, self.file = self.file, fname
        try:
            return self._run_body(node.child_by_field_name("body"), scope)
        finally:
            self.file = saved

    def pipe_call(self, pipe, name, args, scope, site, n):
        st = self.expr(args[0], scope) if args else None
        if not isinstance(st, PState):
            raise ExtractError(f"{self.role}: {pipe.name}.{name} without a known state")
        full, empty = f"{pipe.name}.full", f"{pipe.name}.empty"
        if name == "consumer_wait":
            self.sync(pm.Wait(full, st.idx, st.ph), site)
        elif name == "consumer_release":
            if self.threads % 128:  # (0: a probe run)
                raise ExtractError(f"{self.role}: consumer_release by {self.threads} threads")
            self.sync(pm.Arrive(empty, st.idx, self.threads // 128), site)
        elif name == "producer_acquire":
            self.sync(pm.Wait(empty, st.idx, st.ph), site)
            self.expect = BarRef(full, st.idx)
        elif name == "producer_get_barrier":
            return BarRef(full, st.idx)
        elif name == "producer_tail":
            for _ in range(pipe.stages):
                self.sync(pm.Wait(empty, st.idx, st.ph), site)
                st.advance()
        else:
            raise ExtractError(f"{self.role}: pipeline call {name} not modelled")
        return None

    def bar_call(self, bar, name, args, scope, site, n):
        if name == "wait":
            par = self.expr(args[0], scope)
            se._need_known(self.role, bar, par, n)
            self.sync(pm.Wait(bar.name, bar.idx, par & 1), site)
        elif name == "arrive":
            self.sync(pm.Arrive(bar.name, bar.idx, self.threads), site)
        elif name == "arrive_and_expect_tx":
            self.sync(pm.Arrive("expect", 0, 0), site)  # closes an open expect; replaced
            self.ops.pop()
            self.expect = bar
        elif name == "init":
            self.record_init(bar.name, bar.idx, self.expr(args[0], scope), txt(n)[:60])
        else:
            raise ExtractError(f"{self.role}: barrier call {name} not modelled")
        return None

    def named(self, name, args, scope, site, n):
        threads, bid = self.expr(args[0], scope), self.expr(args[1], scope)
        if not isinstance(threads, int) or not isinstance(bid, int):
            raise ExtractError(f"{self.role}: named barrier not known at {txt(n)[:60]}")
        return self.named_op(name, bid, threads, site, n)

    def named_op(self, name, bid, threads, site, n):
        if self.threads == 0:
            return None  # a probe run: whether the barrier is internal is not known yet
        if threads == self.threads:  # the role's own threads: an internal barrier
            INTERNAL_BARRIERS.add((self.file, n.start_point[0] + 1))
            return None
        bar = f"named{bid}"
        self.record_init(bar, 0, threads, txt(n)[:60])
        k = self.named_uses.get(bar, 0)
        self.named_uses[bar] = k + 1
        self.sync(pm.Arrive(bar, 0, self.threads), site)
        if name != "arrive":
            self.sync(pm.Wait(bar, 0, k & 1), site)
        return None

    def _cond(self, node, scope):
        v = super()._cond(node, scope)
        return v(self) if callable(v) else v

    def if_stmt(self, n, scope):
        """A warp process's branch on its lane (env.lane_split: `lane == 0`): the branch with
        the lanes it holds for, then the other with the rest, each arriving with its lanes
        (module docstring, Decode). Neither may wait: its lanes would not wait for the other
        branch's."""
        cond = n.child_by_field_name("condition")
        c = cond.child_by_field_name("value") or cond.named_children[-1]
        lanes = self.env.lane_split.get(" ".join(txt(c).split()))
        if lanes is None:
            return super().if_stmt(n, scope)
        if self.threads not in (0, 32):
            raise ExtractError(f"{self.role}: a branch on the lane in a process of "
                               f"{self.threads} threads: {txt(c)}")  # fmt: skip
        then, alt = n.child_by_field_name("consequence"), n.child_by_field_name("alternative")
        if alt is not None and alt.type == "else_clause":
            alt = alt.named_children[0]
        saved, start = self.threads, len(self.ops)
        try:
            for part, k in ((then, lanes), (alt, 32 - lanes)):
                self.threads = k if saved else 0
                if part is not None:
                    self.stmt(part, scope)
        finally:
            self.threads = saved
        if any(isinstance(op.step, pm.Wait) for op in self.ops[start:]):
            raise ExtractError(f"{self.role}: a wait under a branch on the lane ({txt(c)}) "
                               "is not modelled")  # fmt: skip
        return None

    def _loop(self, n, inner):
        """A loop of barrier inits runs every iteration (it records no op)."""
        body = n.child_by_field_name("body")
        if not re.search(r"Barrier::init\s*\(|\]\s*\.init\s*\(", txt(body)):
            return super()._loop(n, inner)
        init = n.child_by_field_name("initializer")
        if init is not None:
            self.declaration(init, inner) if init.type == "declaration" else self.expr(init, inner)
        cond, update = n.child_by_field_name("condition"), n.child_by_field_name("update")
        while True:
            v = self._cond(cond, inner)
            if v is OPAQUE:
                raise ExtractError(f"{self.role}: init loop with an unknown bound")
            if not v:
                return
            self.stmt(body, inner)
            self.expr(update, inner)

    def while_stmt(self, n, scope):
        cond, body = n.child_by_field_name("condition"), n.child_by_field_name("body")
        for _ in range(10_000):
            v = self._cond(cond, scope)
            if v is OPAQUE:
                if self.effects(n, scope):
                    raise ExtractError(f"{self.role}: while loop with ops and an unknown bound")
                return
            if not v:
                return
            try:
                self.stmt(body, scope)
            except se._Break:
                return
            except se._Continue:
                pass
        raise ExtractError(f"{self.role}: while loop did not end")

    def stmt(self, n, scope):
        if n.type == "while_statement":
            return self.while_stmt(n, scope)
        if "bar.sync" in txt(n) and txt(n).lstrip().startswith("asm"):  # asm("bar.sync a, b")
            self.env.executed.add((self.file, n.start_byte))
            bid, threads = self.asm_bar(n, scope)
            return self.named_op("sync", bid, threads, (self.file, n.start_byte), n)
        return super().stmt(n, scope)

    def asm_bar(self, n, scope):
        """(id, threads) of asm("bar.sync a, b;" :: operands): each of a, b a literal or %i."""
        m = re.search(r'bar\.sync\s+(%?\d+)\s*,\s*(%?\d+)\s*;.*?"\s*::(.*?)(?::\s*"memory")?\)\s*;',
                      txt(n), re.S)  # fmt: skip
        if not m:
            raise ExtractError(f"{self.role}: bar.sync not understood: {txt(n)[:60]}")
        operands = [o.strip() for o in re.findall(r'"\w+"\((.*?)\)(?=\s*(?:,|$))', m.group(3))]
        vals = []
        for a in m.group(1, 2):
            if a.startswith("%"):
                expr = se.parse(f"x = {operands[int(a[1:])]};").root_node
                v = self.expr(expr.named_children[0].named_children[0]
                              .child_by_field_name("right"), scope)  # fmt: skip
            else:
                v = int(a)
            if not isinstance(v, int):
                raise ExtractError(f"{self.role}: bar.sync operand unknown: {txt(n)[:60]}")
            vals.append(v)
        return vals

    def copy(self, n, args, scope, site):
        src = self.expr(args[0], scope)
        if isinstance(src, tuple) and src[0] == "tma":  # copy(tma.with(bar, 0), g, s)
            _, which, bar = src
            kind = self.env.tma_loads.get(which) or se.TMA_LOADS.get(which)
            if kind is None:
                raise ExtractError(f"{self.role}: TMA load {which} with no buffer")
            if args[2].type == "call_expression":  # dst(_, stage)
                idx = self.expr(self.args(args[2])[-1], scope)
            else:  # a partition of the stage named by the env (tQsQ: q_slot)
                idx = self.lookup(self.env.dst_index[which])
            if not isinstance(idx, int):
                raise ExtractError(f"{self.role}: TMA destination stage unknown: {txt(n)[:60]}")
            self._load(bar, f"{kind}{idx}", kind, site)
            return None
        if txt(args[0]) == "kp.tma_o":
            return None  # the TMA store of O: not modelled (module docstring)
        if PRIM_RE.search(txt(n.child_by_field_name("arguments"))):
            raise ExtractError(f"{self.role}: copy(...) of an unknown kind: {txt(n)[:60]}")
        return None

    def epi_store(self, left, scope):
        """Decode's epilogue stores: the ring is rewritten (every stage); epi_lse[slot] is the
        row statistics of warp slot / 16."""
        for s in range(self.env.consts["T::kStages"]):
            for kind in ("K", "V"):
                self.data(pm.Write(f"{kind}{s}", ("epi",), 0))
        m = re.match(r"epi_lse\s*\[(.*)\]$", txt(left), re.S)
        if m:
            idx = self.expr(left.child_by_field_name("indices").named_children[0], scope)
            if not isinstance(idx, int):
                raise ExtractError(f"{self.role}: epi_lse slot unknown")
            self.data(pm.Write(f"epi{idx // 16}", ("epi", idx // 16), 0))


def callee_name(fn) -> str:
    """sync_extract.callee_name, with template arguments dropped before the last '::'
    (cutlass::make_producer_start_state<T::PipelineKV>)."""
    if fn.type == "qualified_identifier":
        return re.sub(r"<[^<>]*>", "", re.sub(r"<[^<>]*>", "", txt(fn))).split("::")[-1].strip()
    return se.callee_name(fn)


def _tma(bar, idx, writes, count):
    if not writes:
        return pm.Arrive(bar, idx, count)  # an arrival with no copy before it
    (buf, tag, r), *more = writes
    return pm.Tma(bar, idx, buf, tag, r, tuple(more), count)


# ---- Configurations ----------------------------------------------------------------------------
@dataclass
class Env90(se.Env):
    # a declared variable's value from the Config: name -> (fn(lookup), None or a regex its
    # initializer must match)
    decls: dict = field(default_factory=dict)
    structs: dict = field(default_factory=dict)  # aggregate type -> field names
    fields: dict = field(default_factory=dict)  # 'ss.q_full' -> value
    views: dict = field(default_factory=dict)  # wgmma operand view -> buffer kind
    dst_index: dict = field(default_factory=dict)  # TMA descriptor -> variable naming the stage
    overrides: dict = field(default_factory=dict)  # callee -> fn(interp, *args)
    ring_members: dict = field(default_factory=dict)
    pure: set = field(default_factory=set)  # parsed functions with no recorded op
    prims: set = field(default_factory=set)  # functions a subclass records (never pure)
    inits: dict = field(default_factory=dict)  # (barrier, copy) -> arrivals
    tma_loads: dict = field(default_factory=dict)  # TMA descriptor -> buffer kind (beside
    # sync_extract.TMA_LOADS)
    # a warp process's branch on its lane: condition text -> the lanes (of 32) it holds for
    # (Interp90.if_stmt: both branches run, each arriving with its lanes)
    lane_split: dict = field(default_factory=dict)
    executed: set = field(default_factory=set)  # (file, byte offset) of the calls and asm
    # statements the runs executed (Programs.executed: which sync sites a Config reaches)


@dataclass
class Fwd90Config:
    tiles: tuple = (3,)  # KV blocks of each work tile of the CTA
    wgs: int = 2  # consumer warpgroups (3: Note [three consumers at hd64])
    q_stages: int = 2  # Note [two Q buffers]
    stages: int = 2  # K / V stages
    sliced: tuple = ()  # (tile, warpgroup, blocks masked off): Note [slice block end]
    idle: tuple = ()  # (tile, warpgroup) idle: Note [idle warpgroup] (3 warpgroups)


def _struct_fields(sources, name):
    for text in sources.values():
        m = re.search(rf"struct {name} \{{(.*?)\}};", text, re.S)
        if m:
            return re.findall(r"^\s*[\w:<>]+\s+(\w+);", m.group(1), re.M)
    raise ExtractError(f"struct {name} not found")


@dataclass
class MaskObj:  # a tile's Mask, as far as block_range reads it: its KV block count
    blocks: int


def fwd90_env(cfg: Fwd90Config, sources) -> Env90:
    tiles = cfg.tiles

    def slice_end(it, br, mask, first, last_row):  # Note [slice block end]
        key = (it.lookup("n_items"), it.lookup("wg"))
        return br.n_end - sum(c for t, w, c in cfg.sliced if (t, w) == key)

    def idle(it):  # Note [idle warpgroup]: this warpgroup's rows all past the sequence
        return (it.lookup("n_items"), it.lookup("wg")) in cfg.idle

    consts = {
        "T::kQStages": cfg.q_stages, "T::kStages": cfg.stages, "T::kConsumerWGs": cfg.wgs,
        "T::kPingPong": cfg.wgs > 1, "T::kConsumerThreads": 128 * cfg.wgs, "T::kTmaStoreO": True,
        "T::kQBytes": 1, "T::kKBytes": 1, "T::kVBytes": 1, "blockIdx": se.ThreadIdx(0),
        "WarpGroupRole::kProducer": 0, "kTileSlots": _tile_slots(sources),
    }  # fmt: skip
    sched = type("Sched", (), {"total": lambda self: len(tiles),
                               "at": lambda self, w: Coord(w, 0)})()  # fmt: skip
    kp = {"kp.sched": sched, "kp.p.tile_counter": None, "kp.p.cu_seqlens_q": None}
    for d in ("q", "k", "v"):
        kp[f"kp.tma_{d}"] = TmaDesc(f"kp.tma_{d}")
    idle_key = ("T::kConsumerWGs == 3 && !br.empty() && __shfl_sync(0xffffffffu, t.tile.m_block "
                "* T::kBlockM + wg * 64 - t.seq.seqlen_q, 0) >= 0")  # fmt: skip
    return Env90(
        tiles, consts, {idle_key: idle}, kp, {}, _fwd90_tags(),
        structs={"ClaimedTile": _struct_fields(sources, "ClaimedTile")},
        fields={"ss.q_full": BarRef("q_full", 0), "ss.q_empty": BarRef("q_empty", 0),
                "ss.tiles": TileRingObj()},
        views={"tSrQ": "sQ", "tSrK": "sK", "tOrVt": "sV"},
        dst_index={"kp.tma_q": "q_slot"},
        overrides={
            "tile_work": lambda it, kp_, c: Work(c, tiles[c.n], MaskObj(tiles[c.n])),
            "block_range": lambda it, mask, m: BlockRange(0, mask.blocks),
            "next_item": lambda it, counter, w: w + 1,
            "slice_block_end": slice_end,
            "__shfl_sync": lambda it, mask, v, lane: v,  # lane 0's value: the modelled thread
        },
        ring_members={"full": BarRef("tile_full", 0), "empty": BarRef("tile_empty", 0),
                      "item": OPAQUE},
    )  # fmt: skip


def _tile_slots(sources):
    m = re.search(r"constexpr int kTileSlots = (\d+);", sources["csrc/common/tile_ring.cuh"])
    if not m:
        raise ExtractError("kTileSlots not found")
    return int(m.group(1))


def _fwd90_tags():
    return {
        ("sQ", "tma"): lambda v: ("Q", v("tiles_loaded")),
        ("sQ", "read"): lambda v: ("Q", v("tiles_loaded") - 1),
        ("sK", "tma"): lambda v: ("K", v("state").count),
        ("sK", "read"): lambda v: ("K", v("k_state").count),
        ("sV", "tma"): lambda v: ("V", v("state").count),
        ("sV", "read"): lambda v: ("V", v("v_state").count),
        ("tile", "write"): lambda v: ("T", v("n")),
        ("tile", "read"): lambda v: ("T", v("n")),
    }


# ---- Decode ------------------------------------------------------------------------------------
@dataclass
class DecodeConfig:
    blocks: int = 3  # KV blocks of the CTA's split
    stages: int = 2  # T::kStages (num_stages: 2..kMaxStages)
    # the producer (kTma = variant 3): 2 copy_block's gather, 3 TMA blocks (Note [tma blocks]) with
    # copy_block's gather for the others
    variant: int = 2
    warps_n: int = 1  # kWarpsN (decode/plan.h)
    fp8: bool = False  # kKvFp8: the ring holds e4m3 rows (Note [fp8 fragments])
    # Variant 3: each block's path, tma_block(n, ...) of block n of the split: "t" by TMA as one
    # tile, "b" by TMA as boxes of kBoxRows rows (Note [tma boxes]), "g" gathered (a partial
    # last block, a block across pages the boxes cannot take); "" for 2
    paths: str = ""


@dataclass(frozen=True)
class TmaBlockVote:  # decode/plan.h TmaBlock, as the producer reads it: ok, boxes from the Config
    ok: bool
    boxes: bool = False
    row: object = OPAQUE
    page_slot: object = OPAQUE


# the decode kernel's descriptors (TmaArgs): whole tiles and Note [tma boxes]'s boxes of K and V
TMA_DESCS = ("args.tma_k", "args.tma_v", "args.tma_k_box", "args.tma_v_box")


def decode_env(cfg: DecodeConfig) -> Env90:
    if cfg.variant not in (2, 3):
        raise ValueError(f"decode variant {cfg.variant}")
    if cfg.variant == 3 and (len(cfg.paths) != cfg.blocks or set(cfg.paths) - set("tbg")):
        raise ValueError(f"variant 3 needs a path of 't' / 'b' / 'g' per block, not {cfg.paths!r}")
    if cfg.variant != 3 and cfg.paths:
        raise ValueError(f"paths {cfg.paths!r}: variant 3 only")
    d = dv = 32  # the head dims set only the trip counts of data loops (collapsed to accesses)
    consts = {
        "D": d, "DV": dv, "kWarpsN": cfg.warps_n, "kTma": cfg.variant == 3, "kBlockN": 64,
        "kKvFp8": cfg.fp8, "kWarpsM": 4 // cfg.warps_n, "T::kWarpsM": 4 // cfg.warps_n,
        "kBoxRows": 16, "T::kAtomColsK": d, "T::kAtomColsV": dv,
        "T::kStages": cfg.stages, "T::kConsumers": 128, "T::kThreads": 160,
        "T::kBlockM": 16 * (4 // cfg.warps_n), "T::kWarpN": 64 // cfg.warps_n,
        "blockIdx": se.ThreadIdx(0),
    }  # fmt: skip
    kv = lambda v: ("KV", v("it"))  # noqa: E731 (block it of the CTA's split)
    tags = {(k, a): kv for k in ("K", "V") for a in ("write", "read", "tma")}
    stage = lambda kind: lambda v: BufAddr(f"{kind}{v('stage')}", kind)  # noqa: E731
    decls = {
        "n_blocks": (lambda v: cfg.blocks, None), "n_begin": (lambda v: 0, None),
        "full": (lambda v: BarRef("full", 0), None), "empty": (lambda v: BarRef("empty", 0), None),
        # stage addresses: only where computed from the ring (k_base is also p.k's base)
        "k_smem": (stage("K"), "smem_addr"), "v_smem": (stage("V"), "k_smem"),
        "k_base": (stage("K"), "smem_addr"), "v_base": (stage("V"), "k_base"),
        "v_tile": (stage("V"), "k_smem"),  # variant 3's swizzled V tile of the stage
    }  # fmt: skip

    def tma_block(interp, n, offset_k, len_k, page_size):  # Note [tma blocks]: the path of
        k = interp.lookup("it")  # the split's block it (n = n_begin + it: n_begin is opaque)
        if not isinstance(k, int) or not 0 <= k < len(cfg.paths):
            raise ExtractError(f"tma_block of block {k} of the split: no path in the Config")
        return TmaBlockVote(cfg.paths[k] in "tb", cfg.paths[k] == "b")

    return Env90(
        (cfg.blocks,), consts, {}, {}, {}, tags, decls=decls,
        # variant 3: the descriptors' tiles fill the stage's K and V (dst_index: the stage)
        fields={n: TmaDesc(n) for n in TMA_DESCS},
        tma_loads={n: n[len("args.tma_")].upper() for n in TMA_DESCS},
        dst_index={n: "stage" for n in TMA_DESCS},
        overrides={"tma_block": tma_block},
        lane_split={"lane == 0": 1},
    )  # fmt: skip


def extract_decode(cfg: DecodeConfig, sources, called=None) -> dict[str, list[Op]]:
    env = decode_env(cfg)
    roles = [(f"consumer{w}", 32 * w) for w in range(4)] + [("producer", 128)]
    return _extract90(sources, "decode_kernel", env, roles, called)


# ---- SM90 forward ------------------------------------------------------------------------------
def extract_fwd90(cfg: Fwd90Config, sources, called=None) -> dict[str, list[Op]]:
    env = fwd90_env(cfg, sources)
    env.consts["@overrides"] = {}
    env.overrides["make_producer_start_state"] = lambda it: PState(cfg.stages, 0, 1)
    env.oracles["warp == 0 && cute::elect_one_sync()"] = True
    roles = [("producer", 0)] + [(f"consumer{g}", 128 * (g + 1)) for g in range(cfg.wgs)]
    return _extract90(sources, "fwd_kernel", env, roles, called)


def _extract90(sources, entry, env, roles, called, cls=None):
    funcs = {}
    for fname, text in sources.items():
        funcs.update(se.functions(se.parse(text), fname))
    env.pure = _pure(funcs) - env.prims
    env.inits, env.executed = {}, set()
    progs = Programs()
    for name, tid in roles:
        ops = _run(funcs, env, name, tid, 0, entry, called, cls)
        if not ops:
            continue
        # a role's arrivals count its threads: its warp (warpgroup) when lane 1 (thread 1 of
        # the warpgroup) records a program too (threads 0: a probe run)
        wide = _run(funcs, env, name, tid + 1, 0, entry, None, cls)
        threads = (32 if tid % 128 or entry == "decode_kernel" else 128) if wide else 1
        progs[name] = _run(funcs, env, name, tid, threads, entry, None, cls)
    progs.bars = bars_of(env.inits, progs)
    progs.executed = env.executed
    return progs


def _run(funcs, env, name, tid, threads, entry, called=None, cls=None):
    it = (cls or Interp90)(funcs, env, name, threads)
    env.consts["threadIdx"] = se.ThreadIdx(tid)
    it.call_function(entry, [OPAQUE])
    it.flush_cp()
    if called is not None:
        called |= it.called
    it.close_expect()
    if it.expect is not None:
        raise ExtractError(f"{name}: arrive_and_expect_tx on {it.expect} without its copy")
    return it.ops


def _pure(funcs):
    """Parsed functions that record nothing: no primitive in their body or their callees'."""
    body = {n: txt(node) for n, (node, _) in funcs.items()}
    impure = {n for n, t in body.items() if PRIM_RE.search(t) or re.search(r"\bepi", t)}
    changed = True
    while changed:
        changed = False
        for n, t in body.items():
            if n not in impure and any(re.search(rf"\b{m}\s*[<(]", t) for m in impure):
                impure.add(n)
                changed = True
    return set(funcs) - impure


# ---- From extracted ops to the explorer --------------------------------------------------------
def bars_of(env_inits, progs) -> dict:
    """{barrier: (copies, arrivals)} from the inits the run executed."""
    out = {}
    for (name, idx), count in sorted(env_inits.items()):
        copies, arrivals = out.get(name, (0, count))
        if arrivals != count:
            raise ExtractError(f"{name}: copies initialised with {arrivals} and {count}")
        out[name] = (max(copies, idx + 1), count)
    for ops in progs.values():
        for op in ops:
            if getattr(op.step, "bar", None) == "cp.async-unsignalled":
                out["cp.async-unsignalled"] = (1, 1 << 30)
            bar = getattr(op.step, "bar", None)
            if bar is not None and bar not in out:
                raise ExtractError(f"{bar} is used but never initialised")
    return out


class Programs(dict):
    """{role: ops} with the barrier table the same run initialised (bars); two are equal when
    both are (a mutated init count changes only the table)."""

    bars: dict = {}
    executed: set = frozenset()  # the sites the extraction ran (Env90.executed)

    def __eq__(self, other):
        return dict.__eq__(self, other) and self.bars == getattr(other, "bars", None)

    __hash__ = None


def free_at_start(progs):
    """A CUTLASS pipeline's empty barriers: the producer's first acquire of a stage passes on
    the fresh barrier (phase 1)."""
    return {getattr(op.step, "bar", "") for ops in progs.values() for op in ops
            if getattr(op.step, "bar", "").endswith(".empty")}  # fmt: skip


def explore(extract, cfg, sources, needs=None, stop_on=None):
    """Extracts, explores; returns (Result, needs of the extracted programs)."""
    progs, own = finish(extract(cfg, sources), needs)
    return pm.search(machine(progs), stop_on), own


def finish(raw: Programs, needs=None):
    """sync_extract.finish with the pipelines' empty barriers free at start, fusing only a
    wait, its slot's access and the arrival on the paired barrier of the same ring (PAIRS)."""
    saved = se.fuse
    se.fuse = fuse
    try:
        progs, own = se.finish(raw, needs, free_at_start=free_at_start(raw))
    finally:
        se.fuse = saved
    out = Programs(progs)
    out.bars = raw.bars
    return out, own


_SE_FUSE = se.fuse


def _pair(bar):
    """The other barrier of bar's ring: pipe_k.full <-> pipe_k.empty, q_full <-> q_empty."""
    for a, b in (("full", "empty"), ("empty", "full")):
        if bar.endswith(a):
            return bar[: -len(a)] + b
    return None


def fuse(prog):
    """sync_extract.fuse where the arrival is on the waited barrier's pair (named barriers and
    other rings' arrivals stay separate steps)."""
    out, i = [], 0
    while i < len(prog):
        a, b, c = (prog[i : i + 3] + [None, None])[:3]
        if (type(a) is pm.Wait and isinstance(c, pm.Arrive) and c.idx == a.idx
                and c.bar == _pair(a.bar)):  # fmt: skip
            out += _SE_FUSE([a, b, c])
            i += 3
            continue
        out.append(a)
        i += 1
    return out


def machine(progs: Programs) -> pm.Machine:
    return pm.Machine(progs.bars, progs, mma_in_order=True)


def main(argv):
    fwd = se.read_sources(ROOT, FWD90_FILES)
    dec = se.read_sources(ROOT, DECODE_FILES)
    tiles = tuple(int(a) for a in argv) or (3,)
    for wgs in (2, 3):
        cfg = Fwd90Config(tiles=tiles, wgs=wgs)
        res, _ = explore(extract_fwd90, cfg, fwd)
        print(f"SM90 fwd, {wgs} consumer WGs, tiles {tiles}: {res.states} states, "
              f"{len(res.violations)} violations")  # fmt: skip
        for kind, msg in res.violations[:10]:
            print(f"  {kind}: {msg}")
    blocks = sum(tiles)
    paths = ("t" * (blocks - 1) + "g", ("tg" * blocks)[:blocks])  # a gathered last; alternating
    runs = [(2, False, ""), (2, True, "")]
    runs += [(3, fp8, p) for fp8 in (False, True) for p in paths]
    for variant, fp8, path in runs:
        cfg = DecodeConfig(blocks=blocks, variant=variant, fp8=fp8, paths=path)
        res, _ = explore(extract_decode, cfg, dec)
        print(f"decode, variant {variant}{' ' + path if path else ''}{', fp8' if fp8 else ''}, "
              f"{cfg.blocks} blocks: {res.states} states, "
              f"{len(res.violations)} violations")  # fmt: skip
        for kind, msg in res.violations[:10]:
            print(f"  {kind}: {msg}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

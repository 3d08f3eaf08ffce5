#!/usr/bin/env python3
"""Role programs of the SM100 forward kernel, the SM100 1-CTA backward (with its head-dim
split) and the 2-CTA backward (both CTAs of the pair), extracted from their source
(docs/sm100.md, "Extracted role programs").

The kernel's C++ is parsed with tree-sitter-cpp and each role is *run* by a small abstract
interpreter for the subset of C++ the roles are written in: integer locals and arithmetic,
for / if / switch / break / continue / return, lambdas called by name, calls of the functions
defined in the parsed files (template arguments ignored), Ring counters (index, parity, count),
bar_ptr<T, Bar::kX>(ss, i). The values the kernel reads at run time come from the model's
Config: the work tiles of the CTA (blocks per tile, through tile_work and the scheduler), the
trait constants (kQTiles, kStages, ...), and a short list of run-time conditions (ORACLES).
Everything else is opaque.

What the interpreter records, in program order, per role:
  sync ops   bar_wait / ClusterBarrier::wait (Wait), bar_arrive / ClusterBarrier::arrive
             (Arrive, counting the role's threads), umma_commit (Commit),
             arrive_and_expect_tx + the TMA copy that names the same barrier (Tma)
  data ops   TMA loads and stores, umma_ss / umma_ts (Mma, buffers from the descriptors and the
             TMEM columns), tcgen05.ld / st (Read / Write by TMEM column), the shared-memory
             arrays of the statistics, the work-item ring and the O staging buffer
A value's tag is the logical index both sides of a buffer compute from their own Ring
counters (TAGS): the k-th K block the load thread issues is the k-th the MMA thread reads.
That is the data-flow specification the explorer checks the extracted sync against.

Decisions (each one fails loudly rather than guess):
  - a loop whose first iteration records no sync op is modeled by that iteration (MMA K
    slices, TMEM column chunks: they touch the same buffers); a loop with sync ops iterates
    concretely and raises if its condition is not a known value
  - an if whose condition is opaque must either contain no recorded op or have an ORACLES
    entry; otherwise ExtractError
  - a statement tree-sitter could not parse, or of a kind the interpreter does not know (while,
    do, goto, ...), must not mention a primitive, a parsed function or a lambda in scope; an
    unknown function's arguments must not mention a primitive (ExtractError)
  - a TMA copy must follow an arrive_and_expect_tx on its barrier, and that expect must be
    consumed before the next sync op (ExtractError otherwise: the real kernel would hang or
    complete the phase without data); every copy naming the barrier until that sync op is
    one more write of the same transaction (the backward's K and V; Q with lse2 and D)
  - a data-only loop with a known bound (the backward's MMA K slices and dQ chunks, which
    cross the warpgroup halves of a TMEM region) runs every iteration; its ops are collapsed
    into one iteration's (repeated accesses dropped, the K slices of an MMA merged)
  - the elected MMA / commit variants are one operation of the role; an MMA's destination
    is every TMEM buffer in its instruction descriptor's N columns
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import tree_sitter_cpp
from tree_sitter import Language, Parser

sys.path.insert(0, str(Path(__file__).resolve().parent))
import protocol_model as pm  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FWD_FILES = (
    "csrc/sm100/fwd/kernel.cuh",
    "csrc/sm100/fwd/epilogue.cuh",
    "csrc/sm100/fwd/one_tile.cuh",
    "csrc/common/tile_ring.cuh",
    "csrc/sm100/fwd/softmax.cuh",
)
FWD_ENTRY = "fwd_kernel"

_PARSER = Parser(Language(tree_sitter_cpp.language()))
# CUDA keywords tree-sitter-cpp does not know, blanked with spaces (offsets are kept).
_BLANK = re.compile(
    r"__launch_bounds__\([^)]*\)|__cluster_dims__\([^)]*\)|__device__|__forceinline__|__host__|__global__|"
    r"__grid_constant__|__shared__|FA4_UNROLL|CUTLASS_PRAGMA_UNROLL|typename(?=\s+T::)"
)

# The 2-CTA kernels' cluster primitives (sm100/common.cuh): bar_wait_cluster waits on this
# CTA's copy, bar_arrive_cta(bar, cta) arrives on CTA cta's, umma_commit_pair and
# elected_umma_commit_pair commit to both CTAs' copies (two commits, issued together).
# The SM100 forward's wait_any<T> and arrive_mma<T> (sm100/fwd/kernel.cuh) are bar_wait and
# bar_arrive in the 1-CTA kernel; with T::kPair a cluster-scope wait and an arrival on the even
# CTA's copy.
WAITS = {"bar_wait", "wait", "bar_wait_cluster", "wait_any"}
ARRIVES = {"bar_arrive", "arrive", "bar_arrive_cta", "arrive_mma"}
# The elected variants (sm100/common.cuh: one lane of a converged warp issues) are one
# operation of the role, as the plain ones.
COMMITS = {"umma_commit", "elected_umma_commit", "umma_commit_pair", "elected_umma_commit_pair"}
EXPECTS = {"arrive_and_expect_tx"}
SYNC_NAMES = WAITS | ARRIVES | COMMITS | EXPECTS
MMAS = {"umma_ss", "umma_ts", "elected_umma_ss", "elected_umma_ts"}
DATA_NAMES = MMAS | {"tmem_load_32", "tmem_store_16", "tmem_store_32", "copy", "st_cluster_16"}
OP_RE = re.compile(r"\b(" + "|".join(sorted(SYNC_NAMES | DATA_NAMES)) + r")\s*\(")


# TMA descriptors of the loads -> the shared-memory buffer kind they fill (the 2-CTA
# backward's Kd, Qd, dOd: column halves, its dQ, dK, dV operands).
TMA_LOADS = {
    "kp.tma_q": "sQ", "kp.tma_k": "sK", "kp.tma_v": "sV", "kp.tma_do": "sDO",
    "kp.tma_kd": "sKd", "kp.tma_qd": "sQd", "kp.tma_dod": "sDOd",
}  # fmt: skip


class ExtractError(Exception):
    pass


class _Opaque:
    def __repr__(self):
        return "?"


OPAQUE = _Opaque()


class Ring:
    """The kernel's Ring (sm100/common.cuh): index and parity of the count-th use."""

    def __init__(self):
        self.count = 0

    def index(self, copies):
        return self.count % copies

    def parity(self, copies):
        return (self.count // copies) & 1


@dataclass
class BarRef:
    name: str
    idx: int


@dataclass
class Coord:  # TileCoord: work item n of the CTA; batch < 0 is the end marker
    n: int
    batch: int


@dataclass
class TileWork:
    tile: Coord
    n_begin: int
    n_end: int

    def blocks(self):
        return self.n_end - self.n_begin


@dataclass
class Closure:
    node: object
    scope: Scope


class Scope:
    def __init__(self, parent=None):
        self.vars, self.parent = {}, parent

    def find(self, name):
        s = self
        while s is not None:
            if name in s.vars:
                return s
            s = s.parent
        return None


class _Break(Exception):
    pass


class _Continue(Exception):
    pass


class _Return(Exception):
    def __init__(self, value):
        self.value = value


@dataclass
class Op:
    """One recorded operation: a protocol_model step plus where in the source it came from
    (file, byte offset of the call) for waits, so that a mutant's waits keep their meaning."""

    step: object
    site: tuple | None = None


# ---- Parsing -------------------------------------------------------------------------------
def parse(text: str):
    return _PARSER.parse(_BLANK.sub(lambda m: " " * len(m.group()), text).encode())


def txt(node) -> str:
    return node.text.decode()


def functions(tree, fname) -> dict:
    """{name: (function_definition node, file)} of every function of a parsed file."""
    out = {}

    def walk(n):
        if n.type == "function_definition":
            d = n.child_by_field_name("declarator")
            while d is not None and d.type != "function_declarator":
                d = d.child_by_field_name("declarator")
            if d is not None:
                name = txt(d.child_by_field_name("declarator")).split("::")[-1]
                out[name] = (n, fname)
            return
        for c in n.children:
            walk(c)

    walk(tree.root_node)
    return out


def callee_name(fn) -> str:
    """Last name component of a call's function node: bar_ptr<T, ...> -> bar_ptr."""
    if fn.type == "template_function":
        return callee_name(fn.child_by_field_name("name"))
    if fn.type == "qualified_identifier":
        return txt(fn).split("::")[-1].split("<")[0].strip()
    if fn.type == "field_expression":
        return txt(fn.child_by_field_name("field"))
    return txt(fn).split("<")[0].strip()


# ---- The kernel's configuration --------------------------------------------------------------
@dataclass
class Env:
    """What the roles read at run time, for one model configuration."""

    tiles: tuple  # KV blocks of each work tile of the CTA
    consts: dict  # T::k..., Plan::k..., kSBuffers, kTileSlots, ...
    oracles: dict  # condition text -> value
    kp: dict  # kp.<field> values
    tmem: dict  # buffer name -> (first column, columns)
    tags: dict  # (buffer kind, access) -> fn(lookup) -> tag
    role_threads: dict = field(default_factory=dict)
    # The backward's additions (empty for the forward):
    arrays: dict = field(default_factory=dict)  # 'ss.lse2' -> buffer kind: x[s] reads kind<s>
    tensors: dict = field(default_factory=dict)  # 'sDS' -> fn(args) -> buffer: a store to it
    descs: dict = field(default_factory=dict)  # descriptor call -> fn(index) -> buffers
    mma_products: dict = field(default_factory=dict)  # (A kind, B kind) -> product name


class Interp:
    """Runs one role of a kernel abstractly and records its operations."""

    def __init__(self, funcs: dict, env: Env, role_name: str, threads: int):
        self.funcs, self.env, self.role, self.threads = funcs, env, role_name, threads
        self.ops: list[Op] = []
        self.stack: list[Scope] = []  # innermost scope of each active call, for tag lookup
        self.expect: BarRef | None = None
        self.expect_op: Op | None = None  # the Tma step of the open expect_tx, once copied
        self.file = None
        self.called: set[str] = set()  # functions of the parsed files this role ran

    # -- recording
    def sync(self, step, site=None):
        self.close_expect()
        if self.expect is not None:
            raise ExtractError(f"{self.role}: arrive_and_expect_tx on {self.expect} not "
                               f"followed by its TMA copy before {step}")  # fmt: skip
        self.ops.append(Op(step, site))

    def close_expect(self):
        """An expect_tx with its copies is complete at the next sync op (or the role's end):
        every copy naming its barrier until then is one more write of the transaction."""
        if self.expect is not None and self.expect_op is not None:
            self.expect = self.expect_op = None

    def data(self, step):
        self.ops.append(Op(step))

    def lookup(self, name):
        """A variable of any active call, innermost first (tags name the caller's Rings)."""
        for scope in reversed(self.stack):
            s = scope.find(name)
            if s is not None:
                return s.vars[name]
        raise ExtractError(f"{self.role}: tag needs '{name}', not in scope")

    def acc_tag(self, kind):
        """The accumulated value's tag; None where the spec has no rule (a later K slice's
        accumulate, dropped by _collapse; finish refuses a None that remains)."""
        fn = self.env.tags.get((kind, "mma-acc"))
        return fn(self.lookup) if fn is not None else None

    def tag(self, kind, access):
        fn = self.env.tags.get((kind, access, self.role)) or self.env.tags.get((kind, access))
        if fn is None:
            raise ExtractError(f"{self.role}: no tag rule for {access} of {kind}")
        return fn(self.lookup)

    # -- calls
    def call_function(self, name, args):
        self.called.add(name)
        node, fname = self.funcs[name]
        decl = node.child_by_field_name("declarator")
        while decl.type != "function_declarator":
            decl = decl.child_by_field_name("declarator")
        scope = Scope()
        self._bind(decl.child_by_field_name("parameters"), args, scope)
        saved = self.file
        self.file = fname
        try:
            return self._run_body(node.child_by_field_name("body"), scope)
        finally:
            self.file = saved

    def call_closure(self, clo, args):
        decl = clo.node.child_by_field_name("declarator")
        scope = Scope(clo.scope)
        if decl is not None:
            self._bind(decl.child_by_field_name("parameters"), args, scope)
        return self._run_body(clo.node.child_by_field_name("body"), scope)

    def _bind(self, params, args, scope):
        names, defaults = [], []
        for p in params.named_children if params is not None else []:
            if p.type in ("parameter_declaration", "optional_parameter_declaration"):
                d = p.child_by_field_name("declarator")
                names.append(re.sub(r"[&*\s]", "", txt(d)) if d is not None else None)
                defaults.append(p.child_by_field_name("default_value"))
        # omitted trailing arguments take their default values (store_dk_dv's h)
        while len(args) < len(names) and defaults[len(args)] is not None:
            args = [*args, self.expr(defaults[len(args)], scope)]
        if len(names) != len(args):
            raise ExtractError(f"{self.role}: call with {len(args)} args, {len(names)} params")
        for n, a in zip(names, args, strict=True):
            if n:
                scope.vars[n] = a

    def _run_body(self, body, scope):
        self.stack.append(scope)
        try:
            self.block(body, scope)
        except _Return as r:
            return r.value
        finally:
            self.stack.pop()
        return None

    # -- statements
    def block(self, node, scope):
        inner = Scope(scope)
        prev, self.stack[-1] = self.stack[-1], inner  # the innermost scope, for tags
        try:
            for c in node.named_children:
                self.stmt(c, inner)
        finally:
            self.stack[-1] = prev

    def stmt(self, n, scope):
        t = n.type
        if t == "comment":
            return
        if n.has_error:
            if self.effects(n, scope):
                raise ExtractError(f"{self.role}: unparsed statement with a sync/data op: "
                                   f"{txt(n)[:80]}")  # fmt: skip
            return
        if t == "compound_statement":
            self.block(n, scope)
        elif t == "declaration":
            self.declaration(n, scope)
        elif t == "expression_statement":
            if n.named_children:
                self.expr(n.named_children[0], scope)
        elif t == "for_statement":
            self.for_stmt(n, scope)
        elif t == "if_statement":
            self.if_stmt(n, scope)
        elif t == "switch_statement":
            self.switch_stmt(n, scope)
        elif t == "break_statement":
            raise _Break
        elif t == "continue_statement":
            raise _Continue
        elif t == "return_statement":
            kids = n.named_children
            raise _Return(self.expr(kids[0], scope) if kids else None)
        elif t in ("preproc_if", "preproc_ifdef"):  # the arch guard: its body is the kernel
            for c in n.named_children[1:]:
                if c.type not in ("preproc_else", "preproc_elif"):
                    self.stmt(c, scope)
        elif t in ("alias_declaration", "using_declaration", "static_assert_declaration",
                   "type_definition", "preproc_call"):  # fmt: skip
            return
        elif self.effects(n, scope):
            raise ExtractError(f"{self.role}: unsupported statement {t} with an op")

    def declaration(self, n, scope):
        typ = txt(n.child_by_field_name("type"))
        for d in n.children_by_field_name("declarator"):
            init = None
            if d.type == "init_declarator":
                init = d.child_by_field_name("value")
                d = d.child_by_field_name("declarator")
            name, size = self._declarator(d)
            if name is None:
                if init is not None and OP_RE.search(txt(init)):
                    raise ExtractError(f"{self.role}: unsupported declarator {txt(d)}")
                continue
            if init is not None:
                val = self.expr(init, scope)
            elif typ == "Ring":
                val = [Ring() for _ in range(size)] if size else Ring()
            else:
                val = OPAQUE
            scope.vars[name] = val

    def _declarator(self, d):
        """(name, array size or 0); (None, 0) for declarators the interpreter ignores."""
        if d.type == "identifier":
            return txt(d), 0
        if d.type in ("reference_declarator", "pointer_declarator"):
            inner = d.child_by_field_name("declarator") or d.named_children[-1]
            return self._declarator(inner)
        if d.type == "array_declarator":
            name, _ = self._declarator(d.child_by_field_name("declarator"))
            size = d.child_by_field_name("size")
            try:
                return name, int(txt(size)) if size is not None else 0
            except ValueError:
                return name, 0
        return None, 0

    def _cond(self, node, scope):
        """A condition's value; OPAQUE when the interpreter cannot know it."""
        c = node
        if c.type == "condition_clause":
            c = c.child_by_field_name("value") or c.named_children[-1]
        v = self.expr(c, scope)
        if v is OPAQUE:
            key = " ".join(txt(c).split())
            if key in self.env.oracles:
                return self.env.oracles[key]
        return v

    def if_stmt(self, n, scope):
        v = self._cond(n.child_by_field_name("condition"), scope)
        then, alt = n.child_by_field_name("consequence"), n.child_by_field_name("alternative")
        if alt is not None and alt.type == "else_clause":
            alt = alt.named_children[0]
        if v is OPAQUE:
            for part in (then, alt):
                if part is not None and self.effects(part, scope):
                    cond = txt(n.child_by_field_name("condition"))
                    raise ExtractError(f"{self.role}: opaque condition {cond} guards ops "
                                       "(add an ORACLES entry or model it)")  # fmt: skip
            return
        if v:
            self.stmt(then, scope)
        elif alt is not None:
            self.stmt(alt, scope)

    def effects(self, node, scope) -> bool:
        """Whether a subtree may record an op: a primitive, a function of the parsed files, a
        lambda in scope, or an access of an annotated buffer."""
        text = txt(node)
        if OP_RE.search(text) or re.search(r"\b(stat_a|items)\[|\bsO\(", text):
            return True
        if any(a in text for a in self.env.arrays) or any(
            re.search(rf"\b{t}\(", text) for t in self.env.tensors
        ):
            return True
        for name in re.findall(r"\b(\w+)\s*(?:<[^<>()]*>)?\s*\(", text):
            s = scope.find(name)
            if name in self.funcs or (s is not None and isinstance(s.vars[name], Closure)):
                return True
        return False

    def for_stmt(self, n, scope):
        inner = Scope(scope)
        prev, self.stack[-1] = self.stack[-1], inner
        try:
            self._loop(n, inner)
        finally:
            self.stack[-1] = prev

    def _loop(self, n, inner):
        init = n.child_by_field_name("initializer")
        if init is not None:
            if init.type == "declaration":
                self.declaration(init, inner)
            else:
                self.expr(init, inner)
        cond = n.child_by_field_name("condition")
        update = n.child_by_field_name("update")
        body = n.child_by_field_name("body")
        first, start, data_only = True, len(self.ops), False
        try:
            while True:
                v = True if cond is None else self._cond(cond, inner)
                if v is False or (v is not OPAQUE and not v):
                    return
                before = sum(1 for op in self.ops if _is_sync(op.step))
                recorded = len(self.ops)
                try:
                    self.stmt(body, inner)
                except _Break:
                    return
                except _Continue:
                    pass
                synced = sum(1 for op in self.ops if _is_sync(op.step))
                if first and synced == before:
                    # A data-only loop. Nothing recorded, or an unknown bound: its first
                    # iteration stands for all. Data ops and a known bound (the backward's
                    # K slices and dQ chunks cross the warpgroup halves of a TMEM region):
                    # every iteration runs and the loop's ops are collapsed (_collapse).
                    if len(self.ops) == recorded or v is OPAQUE:
                        return
                    data_only = True
                elif data_only and synced != before:
                    raise ExtractError(f"{self.role}: loop with sync ops after its first "
                                       f"iteration: {txt(cond)}")  # fmt: skip
                if v is OPAQUE:
                    raise ExtractError(f"{self.role}: loop with sync ops and an unknown bound: "
                                       f"{txt(cond)}")  # fmt: skip
                first = False
                if update is not None:
                    self.expr(update, inner)
        finally:
            if data_only:
                self.ops[start:] = _collapse(self.ops[start:])

    def switch_stmt(self, n, scope):
        v = self._cond(n.child_by_field_name("condition"), scope)
        if v is OPAQUE:
            raise ExtractError(f"{self.role}: switch on an unknown value")
        body = n.child_by_field_name("body")
        matched = False
        try:
            for case in body.named_children:
                if case.type != "case_statement":
                    # a statement the parser puts beside its case label (a static_assert first
                    # in a case body): it belongs to the case before it
                    if matched:
                        self.stmt(case, scope)
                    continue
                value = case.child_by_field_name("value")
                if not matched:
                    matched = value is None or self.expr(value, scope) == v
                if matched:
                    for s in case.named_children:
                        if s is not value:
                            self.stmt(s, scope)
        except _Break:
            pass

    # -- expressions
    def expr(self, n, scope):  # noqa: C901 (one dispatch over node types)
        t = n.type
        if t == "number_literal":
            s = txt(n).rstrip("uUlLf")
            try:
                return int(s, 0)
            except ValueError:
                return float(s) if re.match(r"^[\d.eE+-]+$", s) else OPAQUE
        if t in ("true", "false"):
            return t == "true"
        if t == "null" or t == "nullptr":
            return None
        if t == "parenthesized_expression":
            return self.expr(n.named_children[0], scope)
        if t == "identifier":
            s = scope.find(txt(n))
            return s.vars[txt(n)] if s is not None else self.env.consts.get(txt(n), OPAQUE)
        if t == "qualified_identifier":
            return self.qualified(txt(n))
        if t == "field_expression":
            return self.field(n, scope)
        if t == "call_expression":
            return self.call(n, scope)
        if t == "binary_expression":
            return self.binary(n, scope)
        if t == "unary_expression":
            v = self.expr(n.child_by_field_name("argument"), scope)
            op = txt(n.child_by_field_name("operator"))
            if v is OPAQUE:
                return OPAQUE
            return {"!": lambda: not v, "-": lambda: -v, "~": lambda: ~v, "+": lambda: v}[op]()
        if t == "pointer_expression":  # *p and &x: the same barrier / value
            return self.expr(n.child_by_field_name("argument"), scope)
        if t == "conditional_expression":
            c = self._cond(n.child_by_field_name("condition"), scope)
            if c is OPAQUE:
                if self.effects(n, scope):
                    raise ExtractError(f"{self.role}: opaque ?: with ops: {txt(n)[:60]}")
                return OPAQUE
            return self.expr(n.child_by_field_name("consequence" if c else "alternative"), scope)
        if t == "update_expression":
            return self.update(n, scope)
        if t == "assignment_expression":
            return self.assign(n, scope)
        if t == "subscript_expression":
            return self.subscript(n, scope)
        if t == "lambda_expression":
            return Closure(n, scope)
        if t == "compound_literal_expression":  # TileCoord{-1, 0, 0}: the end marker
            if txt(n.child_by_field_name("type")) == "TileCoord":
                vals = [self.expr(c, scope) for c in n.child_by_field_name("value").named_children]
                return Coord(-1, vals[0])
            return OPAQUE
        if t == "initializer_list":
            return [self.expr(c, scope) for c in n.named_children]
        if t == "cast_expression":
            return self.expr(n.child_by_field_name("value"), scope)
        if OP_RE.search(txt(n)):
            raise ExtractError(f"{self.role}: unsupported expression {t} with an op")
        return OPAQUE

    def qualified(self, text):
        text = "".join(text.split())
        if text in self.env.consts:
            return self.env.consts[text]
        m = re.fullmatch(r"(?:Bar|Role)::(k\w+)", text)
        return m.group(1) if m else OPAQUE

    def field(self, n, scope):
        obj = self.expr(n.child_by_field_name("argument"), scope)
        name = txt(n.child_by_field_name("field"))
        if obj is OPAQUE:
            if txt(n).startswith("kp."):
                return self.env.kp.get(txt(n), OPAQUE)
            if txt(n) in self.env.arrays:  # ss.lse2 + c0: the (one-stage) array, read
                kind = self.env.arrays[txt(n)]
                self.data(pm.Read(kind, self.tag(kind, "read")))
                return OPAQUE
            return self.env.consts.get(txt(n), OPAQUE)  # ss.tmem_base
        return getattr(obj, name, OPAQUE)

    def binary(self, n, scope):
        op = txt(n.child_by_field_name("operator"))
        a = self.expr(n.child_by_field_name("left"), scope)
        if op == "&&" and a is False:
            return False
        if op == "||" and a is True:
            return True
        b = self.expr(n.child_by_field_name("right"), scope)
        if op in ("&&", "||"):
            if OPAQUE in (a, b):
                return OPAQUE
            return (a and b) if op == "&&" else (a or b)
        if a is OPAQUE or b is OPAQUE:
            return OPAQUE
        if op in ("==", "!="):
            return (a == b) == (op == "==")
        if isinstance(a, (BarRef, Ring, list)) or isinstance(b, (BarRef, Ring, list)):
            return OPAQUE
        if op == "/":
            return int(a / b) if isinstance(a, int) and isinstance(b, int) else a / b
        if op == "%":
            return a - int(a / b) * b if isinstance(a, int) and isinstance(b, int) else OPAQUE
        ops = {
            "+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b, "<<": lambda: a << b,
            ">>": lambda: a >> b, "&": lambda: a & b, "|": lambda: a | b, "^": lambda: a ^ b,
            "<": lambda: a < b, "<=": lambda: a <= b, ">": lambda: a > b, ">=": lambda: a >= b,
        }  # fmt: skip
        try:
            return ops[op]()
        except (KeyError, TypeError):
            return OPAQUE

    def _lvalue(self, n, scope):
        """(getter, setter) of an lvalue the interpreter tracks, or None."""
        if n.type == "identifier":
            s = scope.find(txt(n))
            if s is None:
                return None
            name = txt(n)
            return (lambda: s.vars[name]), (lambda v: s.vars.__setitem__(name, v))
        if n.type == "field_expression":
            obj = self.expr(n.child_by_field_name("argument"), scope)
            name = txt(n.child_by_field_name("field"))
            if isinstance(obj, Ring) and name == "count":
                return (lambda: obj.count), (lambda v: setattr(obj, "count", v))
        if n.type == "parenthesized_expression":
            return self._lvalue(n.named_children[0], scope)
        return None

    def update(self, n, scope):
        arg = n.child_by_field_name("argument")
        lv = self._lvalue(arg, scope)
        if lv is None:
            return OPAQUE
        get, put = lv
        old = get()
        if old is OPAQUE:
            return OPAQUE
        delta = 1 if "++" in txt(n) else -1
        put(old + delta)
        return old if txt(n).startswith(txt(arg)) else old + delta

    def assign(self, n, scope):
        left, right = n.child_by_field_name("left"), n.child_by_field_name("right")
        op = txt(n.child_by_field_name("operator"))
        lt = txt(left)
        ann = self.annotated_store(left, scope)
        v = self.expr(right, scope)
        if ann:
            return v
        lv = self._lvalue(left, scope)
        if lv is None:
            return OPAQUE
        get, put = lv
        if op != "=":
            old = get()
            if old is OPAQUE or v is OPAQUE:
                put(OPAQUE)
                return OPAQUE
            v = {"+=": old + v, "-=": old - v}.get(op, OPAQUE)
        if lt:
            put(v)
        return v

    # -- annotated buffers (shared memory the roles read and write directly)
    def annotated_store(self, left, scope) -> bool:
        base, idx = _array_base(left)
        if base == "ss.stat_a":
            q = self.expr(idx, scope)
            self.data(pm.Write(f"stats{q}", self.tag("stats", "write"), 0))
            return True
        if base == "ss.stat_b":  # written and read beside stat_a, under the same barriers
            return True
        if base == "items":
            slot = self.expr(idx, scope)
            self.data(pm.Write(f"tile{slot}", self.tag("tile", "write"), 0))
            return True
        for call in _calls(left):
            name = txt(call.child_by_field_name("function"))
            if name in self.env.tensors:
                buf = self.env.tensors[name]([self.expr(a, scope) for a in self.args(call)])
                self.data(pm.Write(buf, self.tag(_kind(buf), "write"), 0))
                return True
        if re.search(r"\bsO\(", txt(left)):
            self.data(pm.Write("sO", self.tag("sO", "write"), 0))
            return True
        return False

    def subscript(self, n, scope):
        base, idx = _array_base(n)
        if base == "ss.stat_a":
            self.data(pm.Read(f"stats{self.expr(idx, scope)}", self.tag("stats", "read")))
            return OPAQUE
        if base == "ss.stat_b":
            return OPAQUE
        if base in self.env.arrays:  # x[s] + offset: the stage's row statistics, read
            kind = self.env.arrays[base]
            self.data(pm.Read(f"{kind}{self.expr(idx, scope)}", self.tag(kind, "read")))
            return OPAQUE
        if base == "items":
            slot = self.expr(idx, scope)
            self.data(pm.Read(f"tile{slot}", self.tag("tile", "read")))
            k = self.lookup("n")
            return Coord(k, 0 if k < len(self.env.tiles) else -1)
        arr = self.expr(n.child_by_field_name("argument"), scope)
        i = self.expr(n.child_by_field_name("indices").named_children[0], scope)
        if isinstance(arr, list) and isinstance(i, int):
            return arr[i]
        if isinstance(arr, BarRef) and isinstance(i, int):  # &full[slot]: copy slot of a row
            return BarRef(arr.name, arr.idx + i)
        return OPAQUE

    # -- calls
    def args(self, n):
        return n.child_by_field_name("arguments").named_children

    def call(self, n, scope):  # noqa: C901 (one dispatch over the primitives)
        fn = n.child_by_field_name("function")
        name = callee_name(fn)
        args = self.args(n)
        if name == "bar_ptr":  # bar_ptr<T, Bar::kX>(ss, i)
            targs = fn.child_by_field_name("arguments").named_children
            idx = self.expr(args[1], scope) if len(args) > 1 else 0  # bar_ptr(ss): copy 0
            return BarRef(self.qualified(txt(targs[-1])), idx)
        if fn.type == "field_expression":
            obj = self.expr(fn.child_by_field_name("argument"), scope)
            if obj is not OPAQUE and callable(getattr(obj, name, None)):  # Ring, TileWork, ...
                return getattr(obj, name)(*[self.expr(a, scope) for a in args])
            if name == "with":  # kp.tma_x.with(bar, 0): the barrier the copy completes
                return ("tma", txt(fn.child_by_field_name("argument")), self.expr(args[0], scope))
        site = (self.file, n.start_byte)
        if name in WAITS:
            bar = self.expr(args[0], scope)
            par = self.expr(args[1], scope)
            _need_known(self.role, bar, par, n)
            self.sync(pm.Wait(bar.name, bar.idx, par & 1), site)
            return None
        if name in ARRIVES:
            bar = self.expr(args[0], scope)
            _need_known(self.role, bar, 0, n)
            bname = bar.name
            if name == "bar_arrive_cta":  # CTA cta's copy
                cta = self.expr(args[1], scope)
                if not isinstance(cta, int):
                    raise ExtractError(f"{self.role}: arrival on an unknown CTA: {txt(n)[:60]}")
                bname = f"{bar.name}@{cta}"
            if name == "arrive_mma" and self.env.consts.get("T::kPair"):  # the even CTA's
                bname = f"{bar.name}@0"
            self.sync(pm.Arrive(bname, bar.idx, self.threads), site)
            return None
        if name in COMMITS:
            bar = self.expr(args[0], scope)
            _need_known(self.role, bar, 0, n)
            if name in (
                "umma_commit_pair",
                "elected_umma_commit_pair",
            ):  # multicast to both CTAs' copies
                self.sync(pm.Commit(f"{bar.name}@0", bar.idx), site)
                self.sync(pm.Commit(f"{bar.name}@1", bar.idx), site)
                return None
            self.sync(pm.Commit(bar.name, bar.idx), site)
            return None
        if name == "st_cluster_16":  # st_cluster_16(&sDS(...), cta, v): CTA cta's copy
            cta = self.expr(args[1], scope)
            calls = [c for c in _calls(args[0])
                     if txt(c.child_by_field_name("function")) in self.env.tensors]  # fmt: skip
            if not isinstance(cta, int) or len(calls) != 1:
                raise ExtractError(f"{self.role}: DSMEM store not modelled: {txt(n)[:60]}")
            fname = txt(calls[0].child_by_field_name("function"))
            buf = self.env.tensors[fname]([self.expr(a, scope) for a in self.args(calls[0])])
            self.data(pm.Write(f"{buf}@{cta}", self.tag(_kind(buf), "write"), 0))
            return None
        if name in EXPECTS:
            bar = self.expr(args[0], scope)
            _need_known(self.role, bar, 0, n)
            self.sync(pm.Arrive("expect", 0, 0), site)  # placeholder, replaced by its copy
            self.ops.pop()
            self.expect = bar
            return None
        if name == "copy":
            return self.tma(n, args, scope, site)
        if name in ("umma_ss", "umma_ts"):
            return self.mma(name, args, scope, site)
        if name in ("elected_umma_ss", "elected_umma_ts"):
            return self.mma_elected(n, name, args, scope, site)
        if name == "make_instr_desc" and fn.type == "template_function":
            # the instruction descriptor stands for its N (template argument 4: M, N after
            # the three element types), the destination's TMEM columns
            targs = fn.child_by_field_name("arguments").named_children
            if len(targs) < 5:
                raise ExtractError(f"{self.role}: make_instr_desc without M, N: {txt(n)[:60]}")
            return InstrDesc(self.qualified(txt(targs[3])), self.qualified(txt(targs[4])))
        if name in ("tmem_load_32", "tmem_store_16", "tmem_store_32"):
            col = self.expr(args[0], scope)
            buf = self.tmem_buffer(col, n)
            kind = _kind(buf)
            if name == "tmem_load_32":
                self.data(pm.Read(buf, self.tag(kind, "ld")))
            else:
                self.data(pm.Write(buf, self.tag(kind, "st"), 0))
            return None
        if name in self.env.consts.get("@overrides", {}):
            return self.env.consts["@overrides"][name](*[self.expr(a, scope) for a in args])
        s = scope.find(name) if fn.type == "identifier" else None
        if s is not None and isinstance(s.vars[name], Closure):
            return self.call_closure(s.vars[name], [self.expr(a, scope) for a in args])
        if (
            name in self.funcs
            and fn.type in ("identifier", "template_function")
            or (
                fn.type == "qualified_identifier"
                and txt(fn).startswith("bwd::")
                and name in self.funcs
            )
        ):  # bwd::compute_p<T>(...): the 1-CTA backward's functions, called by the 2-CTA one
            return self.call_function(name, [self.expr(a, scope) for a in args])
        if name in ("uint32_t", "int", "int64_t", "float", "static_cast", "Role"):
            v = self.expr(args[0], scope) if args else OPAQUE
            if name == "Role" and isinstance(v, int):
                return self.env.consts["@roles"][v]
            return v
        if OP_RE.search(txt(n.child_by_field_name("arguments"))):
            raise ExtractError(f"{self.role}: op inside an unknown call {name}(...)")
        return OPAQUE

    def tmem_buffer(self, col, n):
        if isinstance(col, int):
            for buf, (first, width) in self.env.tmem.items():
                if first <= col < first + width:
                    return buf
        raise ExtractError(f"{self.role}: TMEM address {col} of {txt(n)[:60]} in no buffer")

    def tma(self, n, args, scope, site):
        fn = txt(n.child_by_field_name("function"))
        if "BULK_COPY_G2S" in fn:  # SM90_BULK_COPY_G2S::copy(src, bar, ss.x[s], bytes)
            bar = self.expr(args[1], scope)
            base, idx = _array_base(args[2])
            if base is None:  # ss.lse2: one stage (the 2-CTA kernel)
                base = "".join(txt(args[2]).split())
            kind = self.env.arrays.get(base)
            if kind is None:
                raise ExtractError(f"{self.role}: bulk copy into {txt(args[2])}: no buffer")
            stage = self.expr(idx, scope) if idx is not None else ""
            self._load(bar, f"{kind}{stage}", kind, site)
            return None
        src = self.expr(args[0], scope)
        if isinstance(src, tuple) and src[0] == "tma":  # a load: copy(tma.with(bar), g, s)
            _, which, bar = src
            kind = TMA_LOADS.get(which)
            if kind is None:
                raise ExtractError(f"{self.role}: TMA load {which} with no buffer")
            idx = self.expr(self.args(args[2])[-1], scope)
            self._load(bar, f"{kind}{idx}", kind, site)
            return None
        if txt(args[0]) == "kp.tma_o":  # the TMA store reads the staging buffer
            self.data(pm.Read("sO", self.tag("sO", "read")))
            return None
        if txt(args[0]) == "kp.tma_dq":
            # The backward's dQ reduce-adds read the reduce warpgroup's own staging buffers,
            # ordered by its named barrier and bulk-group waits, not by an mbarrier: not part
            # of the model (as in the hand-written one).
            return None
        if OP_RE.search(txt(n.child_by_field_name("arguments"))):
            raise ExtractError(f"{self.role}: copy(...) of an unknown kind: {txt(n)[:60]}")
        return None

    def _load(self, bar, buf, kind, site):
        """A TMA / bulk load completing bar: the first copy after the expect_tx is the Tma
        step, every further one before the next sync op one more write of it (K and V under
        one expect_tx; Q with its lse2 and D rows). A further copy into a buffer the step
        already writes is another part of that write (the decode producer's boxes, Note [tma
        boxes]): the buffers are the model's unit, and every part lands before the barrier's
        phase completes."""
        if self.expect is None or self.expect != bar:
            raise ExtractError(f"{self.role}: TMA copy on {bar} without its "
                               "arrive_and_expect_tx")  # fmt: skip
        tag = self.tag(kind, "tma")
        if self.expect_op is None:
            self.expect_op = Op(pm.Tma(bar.name, bar.idx, buf, tag, 0), site)
            self.ops.append(self.expect_op)
        else:
            st = self.expect_op.step
            if (buf, tag) in [(st.buf, st.tag)] + [(b, t) for b, t, _ in st.more]:
                return
            self.expect_op.step = pm.replace(st, more=st.more + ((buf, tag, 0),))

    def mma_elected(self, n, name, args, scope, site):
        """elected_umma_ss / _ts(a, b, tmem_d, accumulate, idesc): the destination is every
        TMEM buffer in the idesc's N columns from tmem_d (S over both warpgroups' halves);
        the MMA is named by its operand kinds (env.mma_products) and its tags by that name."""
        fn = n.child_by_field_name("function")
        group = 1
        if fn.type == "template_function":  # elected_umma_ss<2>: cta_group::2, the CTA pair
            group = int(txt(fn.child_by_field_name("arguments").named_children[0]))
        if group not in (1, 2):
            raise ExtractError(f"{self.role}: cta_group {group}")
        ctas = [""] if group == 1 else ["@0", "@1"]  # TMEM of this CTA, or of both
        if name == "elected_umma_ss":
            a_bufs = self._desc_bufs(args[0], scope)
        else:
            a = self.tmem_buffer(self.expr(args[0], scope), args[0])
            a_bufs = [a + c for c in ctas]
        b_bufs = self._desc_bufs(args[1], scope)
        kinds = (_kind(a_bufs[0].split("@")[0]), _kind(b_bufs[0].split("@")[0]))
        product = self.env.mma_products.get(kinds)
        if product is None:
            raise ExtractError(f"{self.role}: MMA of {kinds} not in the spec")
        col, desc = self.expr(args[2], scope), self.expr(args[4], scope)
        if not isinstance(col, int) or not isinstance(desc, InstrDesc):
            raise ExtractError(f"{self.role}: MMA destination unknown: {txt(args[2])}")
        # N columns; a pair MMA of M = 128 (64 rows per CTA) has the 2 x 2 layout: N / 2
        # columns of all 128 lanes in each CTA (Note [bwd 2-CTA])
        width = desc.n // 2 if group == 2 and desc.m == 128 else desc.n
        dsts = [b + c for b, (first, w) in self.env.tmem.items()
                if first < col + width and col < first + w for c in ctas]  # fmt: skip
        if not dsts:
            raise ExtractError(f"{self.role}: TMEM columns {col}+{width} in no buffer")
        reads = [(b, self.tag(_kind(b.split("@")[0]), f"mma-{product}")) for b in a_bufs + b_bufs]
        acc = self.expr(args[3], scope)
        if acc is OPAQUE:
            raise ExtractError(f"{self.role}: accumulate flag of {name} unknown")
        if acc:
            reads += [(d, self.acc_tag(product)) for d in dsts]
        tag = self.tag(product, "mma-write")
        more = tuple((d, tag, 0) for d in dsts[1:])
        self.ops.append(Op(pm.Mma(tuple(reads), dsts[0], tag, 0, more), site))
        return None

    def _desc_bufs(self, a, scope):
        if a.type != "call_expression":
            raise ExtractError(f"{self.role}: MMA operand {txt(a)} is not a descriptor call")
        which = txt(a.child_by_field_name("function"))
        fn = self.env.descs.get(which)
        if fn is None:
            raise ExtractError(f"{self.role}: MMA operand {which} with no buffer")
        idx = self.expr(self.args(a)[-1], scope)
        if not isinstance(idx, int):
            raise ExtractError(f"{self.role}: MMA operand {txt(a)[:60]}: stage unknown")
        return fn(idx)

    def mma(self, name, args, scope, site):
        reads = []
        if name == "umma_ss":  # A and B: shared-memory descriptors dQ(.., q), dK(.., stage)
            for a in args[:2]:
                reads.append(self._smem_operand(a, scope))
        else:  # umma_ts: A is P in TMEM, B a descriptor
            buf = self.tmem_buffer(self.expr(args[0], scope), args[0])
            reads.append((buf, self.tag(_kind(buf), "mma-read")))
            reads.append(self._smem_operand(args[1], scope))
        dst = self.tmem_buffer(self.expr(args[2], scope), args[2])
        kind = _kind(dst)
        acc = self.expr(args[3], scope)
        if acc is OPAQUE:
            raise ExtractError(f"{self.role}: accumulate flag of {name} unknown")
        if acc:
            reads.append((dst, self.acc_tag(kind)))
        self.ops.append(Op(pm.Mma(tuple(reads), dst, self.tag(kind, "mma-write"), 0), site))
        return None

    def _smem_operand(self, a, scope):
        if a.type != "call_expression":
            raise ExtractError(f"{self.role}: MMA operand {txt(a)} is not a descriptor call")
        which = txt(a.child_by_field_name("function"))
        kind = {"dQ": "sQ", "dK": "sK", "dV": "sV"}.get(which)
        if kind is None:
            raise ExtractError(f"{self.role}: MMA operand {which} with no buffer")
        idx = self.expr(self.args(a)[-1], scope)
        return (f"{kind}{idx}", self.tag(kind, "mma"))


def _kind(buf):
    """A buffer's kind: sQ1 -> sQ, S_0 -> S, O1 -> O."""
    return re.sub(r"_?\d+$", "", buf)


def _calls(node):
    """The call expressions of a subtree."""
    out = [node] if node.type == "call_expression" else []
    for c in node.named_children:
        out += _calls(c)
    return out


def _collapse(ops):
    """The ops of every iteration of a data-only loop as one iteration: an op equal to an
    earlier one of the loop is the same access again (chunks of one buffer); an MMA with the
    destination and tag of an earlier one is a further K slice of it, whose operands join the
    first slice's and whose accumulate read of the destination (the partial sum of the same
    MMA) is dropped."""
    out = []
    for op in ops:
        st = op.step
        if isinstance(st, pm.Mma):
            dst = {b for b, _, _ in st.writes()}
            prev = next((o for o in out if isinstance(o.step, pm.Mma)
                         and o.step.writes() == st.writes()), None)  # fmt: skip
            if prev is not None:
                extra = tuple(r for r in st.reads if r[0] not in dst and r not in prev.step.reads)
                prev.step = pm.replace(prev.step, reads=prev.step.reads + extra)
                continue
        if any(o.step == st for o in out):
            continue
        out.append(op)
    return out


def _array_base(n):
    """('ss.stat_a', first index node) for ss.stat_a[q][row]; (None, None) otherwise."""
    idx = None
    while n.type == "subscript_expression":
        idx = n.child_by_field_name("indices").named_children[0]
        n = n.child_by_field_name("argument")
    return ("".join(txt(n).split()), idx) if idx is not None else (None, None)


def _need_known(role, bar, parity, n):
    if not isinstance(bar, BarRef) or not isinstance(bar.idx, int) or not isinstance(parity, int):
        raise ExtractError(f"{role}: barrier or parity not known at {txt(n)[:70]}")


def _is_sync(step):
    return isinstance(step, (pm.Wait, pm.Arrive, pm.Commit, pm.Tma))


# ---- The SM100 forward -----------------------------------------------------------------------
def _ring(name, offset=0):
    return lambda v: v(name).count + offset


def _per_q(name, offset=0):
    return lambda v: v(name)[v("q")].count + offset


def fwd_tags(rescale: bool) -> dict:
    """The data-flow specification: the logical index of the value each access means, from
    the accessing role's own counters (every counter counts across the CTA's work tiles)."""
    kv = lambda kind, name: lambda v: (kind, v(name).count)  # noqa: E731
    return {
        ("sQ", "tma"): kv("Q", "q_free"),
        ("sQ", "mma"): lambda v: ("Q", v("q_ready").count - 1),  # counted before the S MMAs
        ("sK", "tma"): kv("K", "k_free"),
        ("sK", "mma"): kv("K", "k_ready"),
        ("sV", "tma"): kv("V", "v_free"),
        ("sV", "mma"): kv("V", "v_ready"),
        # S of KV block g (g counts blocks across tiles): written by the g-th S MMA, read by
        # softmax; P_g over it, read by PV(g); O after PV(g), rescaled by correction ("R")
        ("S", "mma-write"): kv("S", "k_ready"),
        ("S", "ld"): lambda v: ("S", v("s_ready").count - 1),
        ("S", "st"): lambda v: ("P", v("s_ready").count - 1),
        ("S", "mma-read"): kv("P", "v_ready"),
        ("O", "mma-write"): kv("O", "v_ready"),
        ("O", "mma-acc"): lambda v: ("R" if rescale else "O", v("v_ready").count - 1),
        ("O", "ld"): lambda v: ("O", v("o_done")[v("q")].count - 1),
        ("O", "st"): lambda v: ("R", v("o_done")[v("q")].count - 1),
        ("stats", "write"): lambda v: ("st", v("st_free").count - 1),
        ("stats", "read"): lambda v: ("st", v("st_ready")[v("q")].count - 1),
        ("tile", "write"): lambda v: ("T", v("n")),
        ("tile", "read"): lambda v: ("T", v("n")),
        ("sO", "write"): lambda v: ("out", v("staged").count - 1),
        ("sO", "read"): lambda v: ("out", v("staged").count - 1),
    }


@dataclass
class FwdConfig:
    tiles: tuple = (3,)
    q_tiles: int = 2  # 1: hd 256 (Note [one-tile order])
    tma_store_o: bool | None = None  # None: the traits' kTmaStoreO (hd 128 / hd 256)
    rescale: bool = True  # the correction warps' vote (Note [conditional rescale])


def fwd_env(cfg: FwdConfig, text: str, stages: int, tile_slots: int) -> Env:
    """Trait constants of an hd 128 (two Q tiles) or hd 256 (one Q tile) instance: only their
    relations matter (TMEM columns of S0 | S1 | O0 | O1, the staging decision)."""
    block_n, dv = (128, 128) if cfg.q_tiles == 2 else (64, 256)
    store = cfg.tma_store_o if cfg.tma_store_o is not None else cfg.q_tiles == 2
    s0, s1, o0 = 0, block_n, 2 * block_n
    tmem = {"S0": (s0, block_n), "S1": (s1, block_n), "O0": (o0, dv)}
    if cfg.q_tiles == 2:
        tmem["O1"] = (o0 + dv, dv)
    tiles = cfg.tiles
    roles = re.search(r"enum class Role : int \{([^}]*)\}", text)
    if not roles:
        raise ExtractError("enum class Role not found")
    consts = {
        "T::kQTiles": cfg.q_tiles, "T::kStages": stages, "kSBuffers": 2,
        "kTileSlots": tile_slots, "T::kBlockN": block_n, "T::kHeadDimV": dv,
        "T::kHeadDim": dv, "T::kMmaK": 16, "T::kTmaStoreO": store,
        "T::kPair": False, "T::kItemTiles": cfg.q_tiles,
        # the 16-bit instances (FP8's kind::f8f6f4 MMAs have the same barriers and buffers;
        # P's K slice is 8 columns either way)
        "T::kFp8": False, "T::kPSliceColumns": 8,
        "Plan::kS0": s0, "Plan::kS1": s1, "Plan::kO0": o0, "Plan::kO1": o0 + dv,
        "Plan::kP0": s0, "Plan::kP1": s1, "blockIdx": ThreadIdx(0),
        "@roles": [r.strip() for r in roles.group(1).split(",") if r.strip()],
        "@overrides": {
            # the run-time work list of this CTA: tile w has tiles[w] KV blocks
            "tile_work": lambda kp, coord: TileWork(coord, 0, tiles[coord.n]),
            "next_item": lambda counter, w: w + 1,
            "tmem_allocate_for_cta": lambda *a: 0,
        },
    }  # fmt: skip
    sched = type("Sched", (), {"total": lambda self: len(tiles),
                               "at": lambda self, w: Coord(w, 0)})()  # fmt: skip
    kp = {"kp.sched": sched, "kp.tma_store_o": store}
    oracles = {
        "__any_sync(0xffffffffu, factor != 1.0f)": cfg.rescale,  # some row of the warp rescales
        "__any_sync(0xffffffffu, in_seq)": True,  # the warp has rows in the sequence
    }
    return Env(tiles, consts, oracles, kp, tmem, fwd_tags(cfg.rescale))


@dataclass(frozen=True)
class InstrDesc:  # an MMA instruction descriptor: its M and N
    m: int
    n: int


class ThreadIdx:
    def __init__(self, x):
        self.x = x


def read_sources(root: Path, files=FWD_FILES) -> dict[str, str]:
    """Reads the files now (other work may edit them): {relative path: text}."""
    return {f: (Path(root) / f).read_text() for f in files}


def extract_fwd(cfg: FwdConfig, sources: dict[str, str], called=None) -> dict[str, list[Op]]:
    """{role: ops} of every role of fwd_kernel that records an op: each role's first thread
    (threadIdx.x = 32 · its first warp) runs the kernel entry; a role's arrive counts all its
    threads (its warps x 32 when lane 1 records a program too, else one thread). `called`
    (a set) collects the names of the functions the roles ran."""
    kernel = sources[FWD_FILES[0]]
    table = pm.parse_kernel(kernel)
    slots = int(re.search(r"constexpr int kTileSlots = (\d+);", sources[FWD_FILES[3]]).group(1))
    env = fwd_env(cfg, kernel, table.stages, slots)
    return _extract(sources, kernel, FWD_ENTRY, env, called)


def _extract(sources, kernel, entry, env, called):
    funcs = {}
    for fname, text in sources.items():
        funcs.update(functions(parse(text), fname))
    warps = int(re.search(r"constexpr int kWarps = (\d+);", kernel).group(1))
    by_role = {}
    for w in range(warps):
        role = Interp(funcs, env, "?", 1).call_function("warp_role", [w])
        by_role.setdefault(role, []).append(w)
    progs = {}
    for role, ws in by_role.items():
        name = role[1:].lower()
        lane0 = _run_thread(funcs, env, name, 32 * ws[0], 1, entry, called)
        if not lane0:
            continue
        wide = _run_thread(funcs, env, name, 32 * ws[0] + 1, 1, entry)
        threads = 32 * len(ws) if wide else 1
        progs[name] = _run_thread(funcs, env, name, 32 * ws[0], threads, entry)
    return progs


def _run_thread(funcs, env, name, tid, threads, entry, called=None):
    it = Interp(funcs, env, name, threads)
    env.consts["threadIdx"] = ThreadIdx(tid)
    it.call_function(entry, [OPAQUE])
    if called is not None:
        called |= it.called
    it.close_expect()
    if it.expect is not None:
        raise ExtractError(f"{name}: arrive_and_expect_tx on {it.expect} without its copy")
    return it.ops


# ---- The SM100 backward (1 CTA per kv tile, or kSplit = 2 at d > 128) -----------------------
BWD_FILES = (
    "csrc/sm100/bwd/kernel.cuh",
    "csrc/sm100/bwd/roles.cuh",
    "csrc/sm100/bwd/compute.cuh",
)
BWD_ENTRY = "bwd_kernel"


def bwd_tags() -> dict:
    """The backward's data-flow specification. Q block i of the CTA (every role's loop
    variable i, or its own Ring count where S(i) / dP(i) are issued outside the loop) names
    every value: Q(i) (with its lse2 and D rows), dO(i), S(i) -> P(i) over it, dP(i) -> dS(i)
    over it -> dQ(i) over that (Note [bwd TMEM plan]), dS(i) in shared memory, and the dK / dV
    accumulators after the i-th MMA. MMAs are named by their operands (bwd_env's
    mma_products); K and V are loaded once."""
    i = lambda name: lambda v: (name, v("i"))  # noqa: E731
    prev = lambda name: lambda v: (name, v("i") - 1)  # noqa: E731
    last = lambda name: lambda v: (name, v("t").iters - 1)  # noqa: E731
    return {
        ("sK", "tma"): lambda v: ("K",),
        ("sV", "tma"): lambda v: ("V",),
        ("sQ", "tma"): i("Q"),
        ("sLSE", "tma"): i("Q"),
        ("sDPS", "tma"): i("Q"),
        ("sDO", "tma"): i("dO"),
        # S(i) and dP(i) are issued right after the wait that counted their Q / dO stage
        ("sK", "mma-S"): lambda v: ("K",),
        ("sQ", "mma-S"): lambda v: ("Q", v("q_ready").count - 1),
        ("S", "mma-write"): lambda v: ("S", v("q_ready").count - 1),
        ("sV", "mma-dP"): lambda v: ("V",),
        ("sDO", "mma-dP"): lambda v: ("dO", v("do_ready").count - 1),
        ("dP", "mma-write"): lambda v: ("dP", v("do_ready").count - 1),
        ("S", "mma-dV"): i("P"),
        ("sDO", "mma-dV"): i("dO"),
        ("dV", "mma-acc"): prev("dV"),
        ("dV", "mma-write"): i("dV"),
        ("DP", "mma-dK"): i("dS"),
        ("sQ", "mma-dK"): i("Q"),
        ("dK", "mma-acc"): prev("dK"),
        ("dK", "mma-write"): i("dK"),
        ("sDS", "mma-dQ"): i("dS"),
        ("sK", "mma-dQ"): lambda v: ("K",),
        ("dQ", "mma-write"): i("dQ"),
        # the compute warpgroups (their half of S / dP, P and dS over it, dS to shared memory)
        ("S", "ld"): i("S"),
        ("S", "st"): i("P"),
        ("DP", "ld"): i("dP"),
        ("DP", "st"): i("dS"),
        ("sDS", "write"): i("dS"),
        ("sLSE", "read"): i("Q"),
        ("sDPS", "read"): i("Q"),
        ("dK", "ld"): last("dK"),
        ("dV", "ld"): last("dV"),
        # the reduce warpgroup loads dQ(i) from the dP columns
        ("DP", "ld", "reduce"): i("dQ"),
    }


@dataclass
class BwdConfig:
    iters: int = 3  # Q blocks of the CTA (t.iters)
    head_dim: int = 128  # d = d_v: 64, 96, 128; 192, 256 split in two CTAs (one modelled)
    head_dim_v: int | None = None  # None: head_dim; (192, 128) is a kStageTable row


def bwd_shape(d, dv):
    """BwdShape and BwdTmemPlan (csrc/tmem.cuh), restated: the split, the slices, kBlockM and
    the TMEM columns. The formulas are the header's; the model needs only which buffer a
    column falls in."""
    split = 2 if d > 128 or dv > 128 else 1
    sd, sdv, bm = d // split, dv // split, 128 if split == 1 else 64
    dq_cols = max(sd, bm)
    cols = {"kS": 0, "kDP": bm}
    cols["kDQ"] = cols["kDP"]
    cols["kDK"] = cols["kDP"] + dq_cols
    cols["kDV"] = cols["kDK"] + sd
    return split, sd, sdv, bm, cols


def bwd_env(cfg: BwdConfig, text: str, stages_q: int, stages_do: int) -> Env:
    d = cfg.head_dim
    dv = cfg.head_dim_v if cfg.head_dim_v is not None else d
    split, sd, sdv, bm, cols = bwd_shape(d, dv)
    half = bm // 2  # query columns of one compute warpgroup
    # TMEM: each compute warpgroup's half of S (P over it) and dP (dS, then dQ over it); the
    # dQ columns beyond dP's (kSliceD > kBlockM in the split) belong to the second half.
    tmem = {
        "S_0": (cols["kS"], half), "S_1": (cols["kS"] + half, half),
        "DP_0": (cols["kDP"], half), "DP_1": (cols["kDP"] + half, cols["kDK"] - cols["kDP"] - half),
        "dK": (cols["kDK"], sd), "dV": (cols["kDV"], sdv),
    }  # fmt: skip
    roles = re.search(r"enum class Role : int \{([^}]*)\}", text)
    if not roles:
        raise ExtractError("enum class Role not found")
    iters = cfg.iters

    def slice_column(region, k):  # BwdTmemPlan::slice_column
        per_wg = bm // 2 // 16
        return region + (k // per_wg) * (bm // 2) + (k % per_wg) * 8

    consts = {
        "T::kStagesQ": stages_q, "T::kStagesDo": stages_do, "T::kSplit": split,
        "T::kBlockM": bm, "T::kBlockN": 128, "T::kHeadDim": d, "T::kHeadDimV": dv,
        "T::kSliceD": sd, "T::kSliceDV": sdv, "T::kMmaK": 16, "T::kDqCols": 32,
        "T::kDqBuffers": 2, "blockIdx": ThreadIdx(0),
        **{f"Plan::{k}": v for k, v in cols.items()},
        "@roles": [r.strip() for r in roles.group(1).split(",") if r.strip()],
        "@overrides": {
            # CTA h = 0 of the tile (the split's CTAs share no barrier or buffer); its Q
            # blocks are iterations 0 .. iters - 1
            "tile_work": lambda kp: type("TileWork", (), {
                "iters": iters, "h": 0, "n": 0,
                "m_of": lambda self, i: i, "g_of": lambda self, i: 0})(),
            "tmem_allocate_for_cta": lambda *a: 0,
            "make_runtime_instr_desc": lambda desc: desc,
            "slice_column": slice_column,
        },
    }  # fmt: skip
    oracles = {
        # the per-block mask and softcap choices select one of four instances of the same
        # loop (compute_p's run): no barrier or buffer depends on them
        "masked": False,
        "score.softcap": False,
        "!__any_sync(0xffffffffu, in_seq)": False,  # the warp has rows in the sequence
    }
    stage = lambda kind: lambda s: [f"{kind}{s // split}"]  # noqa: E731 (s·kSplit + h)
    descs = {
        "dK": lambda s: [f"sK{s}"], "dQ": lambda s: [f"sQ{s}"], "dV": lambda s: [f"sV{s}"],
        "dDO": lambda s: [f"sDO{s}"], "dDOt": stage("sDO"), "dQt": stage("sQ"),
        "dKt": stage("sK"),
        # dQ's A is dSᵀ: every K slice (16 kv rows) spans all query columns, both halves
        "dDSt": lambda s: ["sDS_0", "sDS_1"],
    }  # fmt: skip

    def sds_half(args):  # sDS(row, column, 0): the warpgroup half the column falls in
        if not isinstance(args[1], int):
            raise ExtractError("store to sDS at an unknown column")
        return f"sDS_{args[1] // half}"

    products = {("sK", "sQ"): "S", ("sV", "sDO"): "dP", ("S", "sDO"): "dV", ("DP", "sQ"): "dK",
                ("sDS", "sK"): "dQ"}  # fmt: skip
    return Env(
        tiles=(),
        consts=consts,
        oracles=oracles,
        kp={},
        tmem=tmem,
        tags=bwd_tags(),
        arrays={"ss.lse2": "sLSE", "ss.dpsum": "sDPS"},
        tensors={"sDS": sds_half},
        descs=descs,
        mma_products=products,
    )


def _pmb():
    import protocol_model_bwd as pmb

    return pmb


def extract_bwd(cfg: BwdConfig, sources: dict[str, str], called=None) -> dict[str, list[Op]]:
    """{role: ops} of bwd_kernel's roles (as extract_fwd)."""
    kernel = sources[BWD_FILES[0]]
    table = _pmb().parse_kernel(kernel)
    sq, sdo = table.stages_of(cfg.head_dim, cfg.head_dim_v)
    env = bwd_env(cfg, kernel, sq, sdo)
    return _extract(sources, kernel, BWD_ENTRY, env, called)


def machine_bwd(table, cfg: BwdConfig, progs) -> pm.Machine:
    sq, sdo = table.stages_of(cfg.head_dim, cfg.head_dim_v)
    bars = {n: (table.copies(n, sq, sdo), spec.arrivals) for n, spec in table.bars.items()}
    return pm.Machine(bars, progs, mma_in_order=True)


def finish_bwd(progs, needs=None):
    return finish(progs, needs, free_at_start=_pmb().FREE_AT_START)


def explore_bwd(cfg: BwdConfig, sources: dict[str, str], needs=None, stop_on=None):
    table = _pmb().parse_kernel(sources[BWD_FILES[0]])
    progs, own = finish_bwd(extract_bwd(cfg, sources), needs)
    return pm.search(machine_bwd(table, cfg, progs), stop_on), own


# ---- The SM100 2-CTA backward (d = 128, a CTA pair per 256 kv rows) ---------------------------
BWD2_FILES = (
    "csrc/sm100/bwd/kernel_2cta.cuh",
    "csrc/sm100/bwd/roles_2cta.cuh",
    "csrc/sm100/bwd/compute.cuh",
)
BWD2_ENTRY = "bwd_kernel_2cta"


@dataclass
class Bwd2Config:
    iters: int = 2  # Q blocks of the pair


def bwd2_env(cfg: Bwd2Config, text: str) -> Env:
    """Traits2 (kernel_2cta.cuh): d = 128, kBlockM = 128, the 1-CTA kernel's TMEM plan per CTA.
    Each role runs once per CTA rank (tile_work's rank); its own barriers and buffers get the
    rank as a suffix (name@rank), the pair MMAs' operands and destinations, the multicast
    commits, the arrivals on a named CTA and the DSMEM stores name theirs."""
    _, sd, sdv, bm, cols = bwd_shape(128, 128)
    env = bwd_env(BwdConfig(iters=cfg.iters, head_dim=128), text, 1, 1)
    iters = cfg.iters
    env.consts.update({
        "T::kHalfM": bm // 2, "T::kHalfD": 64, "T::kPairN": 256, "T::kDqChunks": 4,
        "ss.tmem_base": 0,
    })  # fmt: skip
    env.consts["@overrides"]["tile_work"] = lambda kp: type("TileWork", (), {
        "iters": iters, "h": 0, "n": env.consts["@rank"], "rank": env.consts["@rank"],
        "pair": 0, "m_of": lambda self, i: i, "g_of": lambda self, i: 0})()  # fmt: skip
    both = lambda kind: lambda s: [f"{kind}{s}@0", f"{kind}{s}@1"]  # noqa: E731
    env.descs = {
        "dK": both("sK"), "dQ": both("sQ"), "dV": both("sV"), "dDO": both("sDO"),
        "dDOdT": both("sDOd"), "dQdT": both("sQd"), "dKdT": both("sKd"),
        # dQ's A is dSᵀ of the pair: both CTAs' sDS, each holding both CTAs' kv rows
        "dDSt": lambda s: [f"sDS_{r}@{c}" for c in (0, 1) for r in (0, 1)],
    }  # fmt: skip
    env.mma_products = {("sK", "sQ"): "S", ("sV", "sDO"): "dP", ("S", "sDOd"): "dV",
                        ("DP", "sQd"): "dK", ("sDS", "sKd"): "dQ"}  # fmt: skip
    env.arrays = {"ss.lse2": "sLSE", "ss.dpsum": "sDPS"}

    def sds_rows(args):  # sDS(ds_row, column, 0): the pair's kv row -> the writing CTA
        if not isinstance(args[0], int):
            raise ExtractError("DSMEM store to sDS at an unknown row")
        return f"sDS_{args[0] // 128}"

    env.tensors = {"sDS": sds_rows}
    i = lambda name: lambda v: (name, v("i"))  # noqa: E731
    env.tags.update({
        ("sKd", "tma"): lambda v: ("Kd",), ("sQd", "tma"): i("Q"), ("sDOd", "tma"): i("dO"),
        # issue_s(i) / issue_dp(i) take the Q block
        ("sQ", "mma-S"): i("Q"), ("S", "mma-write"): i("S"),
        ("sDO", "mma-dP"): i("dO"), ("dP", "mma-write"): i("dP"),
        ("sDOd", "mma-dV"): i("dO"), ("sQd", "mma-dK"): i("Q"),
        ("sKd", "mma-dQ"): lambda v: ("Kd",),
    })  # fmt: skip
    return env


def extract_bwd2(cfg: Bwd2Config, sources: dict[str, str], called=None) -> dict[str, list[Op]]:
    """{role@rank: ops} of bwd_kernel_2cta's roles in both CTAs of the pair."""
    kernel = sources[BWD2_FILES[0]]
    env = bwd2_env(cfg, kernel)
    progs = {}
    for rank in (0, 1):
        env.consts["@rank"] = rank
        for role, ops in _extract(sources, kernel, BWD2_ENTRY, env, called).items():
            progs[f"{role}@{rank}"] = [Op(_at(op.step, rank), op.site) for op in ops]
    return progs


def _at(st, rank):
    """A step of CTA rank's role: its own barriers and buffers (no @ yet) get @rank."""
    loc = lambda name: name if "@" in name else f"{name}@{rank}"  # noqa: E731
    if isinstance(st, (pm.Wait, pm.Arrive, pm.Commit)):
        return pm.replace(st, bar=loc(st.bar))
    if isinstance(st, pm.Tma):
        more = tuple((loc(b), t, r) for b, t, r in st.more)
        return pm.replace(st, bar=loc(st.bar), buf=loc(st.buf), more=more)
    if isinstance(st, pm.Mma):
        reads = tuple((loc(b), t) for b, t in st.reads)
        more = tuple((loc(b), t, r) for b, t, r in st.more)
        return pm.replace(st, reads=reads, buf=loc(st.buf), more=more)
    if isinstance(st, (pm.Read, pm.Write)):
        return pm.replace(st, buf=loc(st.buf))
    raise ExtractError(f"step {st} of CTA {rank}")


def _pmb2():
    import protocol_model_bwd2 as pmb2

    return pmb2


def finish_bwd2(progs, needs=None):
    return finish(progs, needs, free_at_start=_pmb2().FREE_AT_START)


def machine_bwd2(specs, cfg, progs) -> pm.Machine:
    return pm.Machine({n: (1, a) for n, a in _pmb2()._bars(specs).items()}, progs, True)


def explore_bwd2(cfg: Bwd2Config, sources: dict[str, str], needs=None, stop_on=None):
    specs = _pmb2().parse_kernel(sources[BWD2_FILES[0]])
    progs, own = finish_bwd2(extract_bwd2(cfg, sources), needs)
    return pm.search(machine_bwd2(specs, cfg, progs), stop_on), own


# ---- The SM100 2-CTA forward (hd 256, a CTA pair per 256 query rows) ---------------------------
FWD2_FILES = (
    "csrc/sm100/fwd/kernel_2cta.cuh",
    "csrc/sm100/fwd/kernel.cuh",
    "csrc/sm100/fwd/epilogue.cuh",
    "csrc/sm100/fwd/softmax.cuh",
)
FWD2_ENTRY = "fwd_kernel_2cta"


@dataclass
class Fwd2Config:
    blocks: int = 3  # KV blocks of the cluster's one work item (128 keys each)
    rescale: bool = True  # the correction warps' vote (Note [conditional rescale])


def fwd2_tags(rescale: bool) -> dict:
    """fwd_tags for the pair: the MMAs are elected cta_group::2 ones, named by their operands
    (S = sQ·sKᵀ, O = P·sV); each CTA's softmax and correction read their own CTA's S, P, O."""
    kv = lambda kind, name: lambda v: (kind, v(name).count)  # noqa: E731
    tags = fwd_tags(rescale)
    tags.update({
        ("sQ", "tma"): lambda v: ("Q",),
        ("sQ", "mma-S"): lambda v: ("Q",),
        ("sK", "mma-S"): kv("K", "k_ready"),
        ("S", "mma-write"): kv("S", "k_ready"),
        ("S", "mma-O"): kv("P", "v_ready"),
        ("sV", "mma-O"): kv("V", "v_ready"),
    })  # fmt: skip
    return tags


def fwd2_env(cfg: Fwd2Config, text: str) -> Env:
    """FwdTraits2<256, 256> (kernel_2cta.cuh): kBlockN 128 keys per block (each CTA 64 K rows,
    d_v / 2 V columns per stage), one Q tile per CTA with S double-buffered; TMEM per CTA
    S0 | S1 | O0 = 0 | 128 | 256 (FwdTmemPlan<256, 128>). Each role runs once per CTA rank
    (block_rank_in_cluster); as extract_bwd2, its own barriers and buffers get the rank."""
    block_n, dv = 128, 256
    s0, s1, o0 = 0, block_n, 2 * block_n
    env = fwd_env(FwdConfig(tiles=(cfg.blocks,), q_tiles=1, tma_store_o=False,
                            rescale=cfg.rescale), text, 2, 1)  # fmt: skip
    env.tmem = {"S0": (s0, block_n), "S1": (s1, block_n), "O0": (o0, dv)}
    blocks = cfg.blocks
    env.consts.update({
        "T::kPair": True, "T::kItemTiles": 2, "T::kFp8": False, "T::kBlockN": block_n,
        "T::kBlockM": 128,
        "T::kKRows": block_n // 2, "T::kVCols": dv // 2, "T::kHeadDim": dv,
        "T::kHeadDimV": dv, "T::kTmaStoreO": False, "T::kQTiles": 1, "T::kStages": 2,
        "Plan::kS0": s0, "Plan::kS1": s1, "Plan::kO0": o0, "Plan::kO1": o0 + dv,
        "Plan::kP0": s0, "Plan::kP1": s1, "ss.tmem_base": 0,
        # take_tile<T> with kPair: the cluster's one work item, written by the kernel's start
        "ss.tile_item": [Coord(0, 0)],
    })  # fmt: skip
    env.consts["@overrides"].update({
        "tile_work": lambda kp, coord: TileWork(coord, 0, blocks),
        "block_rank_in_cluster": lambda: env.consts["@rank"],
        "make_runtime_instr_desc": lambda desc: desc,
    })  # fmt: skip
    env.kp = {"kp.tma_store_o": False}
    both = lambda kind: lambda s: [f"{kind}{s}@0", f"{kind}{s}@1"]  # noqa: E731
    # the pair MMA reads the operand at the same offset in both CTAs' shared memory
    env.descs = {"dQ": both("sQ"), "dK": both("sK"), "dV": both("sV")}
    env.mma_products = {("sQ", "sK"): "S", ("S", "sV"): "O"}
    env.tags = fwd2_tags(cfg.rescale)
    return env


def extract_fwd2(cfg: Fwd2Config, sources: dict[str, str], called=None) -> dict[str, list[Op]]:
    """{role@rank: ops} of fwd_kernel_2cta's roles in both CTAs of the pair (roles with no op,
    e.g. the odd CTA's MMA warp and softmax1, are absent)."""
    env = fwd2_env(cfg, sources[FWD2_FILES[1]])
    progs = {}
    for rank in (0, 1):
        env.consts["@rank"] = rank
        for role, ops in _extract(sources, sources[FWD2_FILES[1]], FWD2_ENTRY, env,
                                  called).items():  # fmt: skip
            progs[f"{role}@{rank}"] = [Op(_at(op.step, rank), op.site) for op in ops]
    return progs


def fwd2_bars(pair_text: str, enum_text: str | None = None) -> dict[str, tuple]:
    """{name@rank: (copies, arrivals)} of kBarriersPair (the enum Bar of kernel.cuh; kNone
    rows have no copy), both CTAs' copies."""
    if enum_text is None:
        enum_text = (ROOT / FWD2_FILES[1]).read_text()
    _, _, rows = pm.parse_bar_table(enum_text + "\n" + pair_text, "kBarriersPair")
    stages = re.search(r"static constexpr int kStages = (\d+);", pair_text)
    if not stages:
        raise ExtractError("FwdTraits2::kStages not found")
    copies = {"kPerQTile": 1, "kPerStage": int(stages.group(1)), "kPerSBuffer": 2, "kNone": 0}
    bars = {}
    for name, kind, arrivals in rows:
        if kind not in copies:
            raise ExtractError(f"kBarriersPair {name}: copies {kind} not in the pair's policy")
        for rank in (0, 1):
            if copies[kind]:
                bars[f"{name}@{rank}"] = (copies[kind], arrivals)
    return bars


def machine_fwd2(pair_text: str, progs) -> pm.Machine:
    """Both CTAs; exit_drained: the closing cluster_sync lets both CTAs exit once every role of
    both has finished, so a commit or TMA still in flight then arrives on a CTA that left."""
    return pm.Machine(fwd2_bars(pair_text), progs, mma_in_order=True, exit_drained=True)


# The "...Empty" barriers of each CTA whose buffer is free before its first use (annotate).
FWD2_FREE_AT_START = {f"{b}@{r}" for b in ("kKEmpty", "kVEmpty", "kStatsEmpty") for r in (0, 1)}


def finish_fwd2(progs, needs=None):
    return finish(progs, needs, free_at_start=FWD2_FREE_AT_START)


def explore_fwd2(cfg: Fwd2Config, sources: dict[str, str], needs=None, stop_on=None):
    progs, own = finish_fwd2(extract_fwd2(cfg, sources), needs)
    return pm.search(machine_fwd2(sources[FWD2_FILES[0]], progs), stop_on), own


# ---- From extracted ops to the explorer's programs -------------------------------------------
def finish(progs: dict[str, list[Op]], needs: dict | None = None, free_at_start=None):
    """protocol_model steps: each write declares the reads its value gets (summed over every
    role's reads of that tag), each wait the completion it means: by occurrence on the
    unmutated source (annotate), carried to a mutant through the wait's site and the
    occurrence at that site (`needs`, from wait_needs of the original). free_at_start: the
    barriers whose buffer is free before its first use (None: the forward's rule). Returns
    (programs, needs of these programs)."""
    reads = {}
    for role, ops in progs.items():
        for op in ops:
            st = op.step
            for buf, tag in _reads_of(st):
                if tag is None:
                    raise ExtractError(f"{role}: accumulate into {buf} with no tag rule")
                reads[(buf, tag)] = reads.get((buf, tag), 0) + 1
    out, own = {}, {}
    for role, ops in progs.items():
        steps, seen = [], {}
        raw = [op.step for op in ops]
        free = _free_at_start(raw) if free_at_start is None else free_at_start
        annotated = pm.annotate(raw, free_at_start=free)
        for op, ann in zip(ops, annotated, strict=True):
            st = _with_reads(op.step, reads)
            if isinstance(st, pm.Wait):
                k = seen.get(op.site, 0)
                seen[op.site] = k + 1
                key = (role, op.site, k)
                own[key] = ann.need
                need = needs.get(key, ann.need) if needs is not None else ann.need
                st = pm.replace(st, need=need)
            steps.append(st)
        out[role] = fuse(steps)
    return out, own


def fuse(prog):
    """The hand model's reductions (protocol_model.Take, Publish), applied where the source
    has the exact pattern: a wait, the one read (write) of the slot it guards, and the
    release (publish) arrival, adjacent in the role's program. Between the wait and the
    arrival only this role touches the slot, so interleavings inside the triple change
    nothing the checks see (a producer that does not wait rewrites the slot before the wait
    passes as well, and that is reported). A mutant that breaks the pattern is explored
    unfused."""
    out, i = [], 0
    while i < len(prog):
        a, b, c = (prog[i : i + 3] + [None, None])[:3]
        if type(a) is pm.Wait and isinstance(c, pm.Arrive) and c.idx == a.idx:
            if type(b) is pm.Read:
                out.append(pm.Take(a.bar, a.idx, a.parity, a.need, buf=b.buf, tag=b.tag,
                                   empty=c.bar, count=c.count))  # fmt: skip
                i += 3
                continue
            if type(b) is pm.Write:
                out.append(pm.Publish(a.bar, a.idx, a.parity, a.need, buf=b.buf, tag=b.tag,
                                      reads=b.reads, full=c.bar, count=c.count))  # fmt: skip
                i += 3
                continue
        out.append(a)
        i += 1
    return out


def _free_at_start(prog):
    """The hand model's rule: an "...Empty" barrier guards a buffer free before its first use,
    except the tile ring's (a slot's first use does not wait)."""
    return {st.bar for st in prog if isinstance(st, pm.Wait) and st.bar.endswith("Empty")} - {
        "kTileEmpty"
    }


def _reads_of(st):
    if isinstance(st, pm.Read):
        return ((st.buf, st.tag),)
    if isinstance(st, pm.Mma):
        return st.reads
    return ()


def _with_reads(st, reads):
    more = tuple((b, t, reads.get((b, t), 0)) for b, t, _ in getattr(st, "more", ()))
    if isinstance(st, pm.Tma):
        return pm.replace(st, reads=reads.get((st.buf, st.tag), 0), more=more)
    if isinstance(st, pm.Mma):
        return pm.replace(st, reads_of_result=reads.get((st.buf, st.tag), 0), more=more)
    if isinstance(st, pm.Write):
        return pm.replace(st, reads=reads.get((st.buf, st.tag), 0))
    return st


def machine(table: pm.Table, cfg: FwdConfig, progs: dict[str, list]) -> pm.Machine:
    bars = {n: (spec.count(cfg.q_tiles, table.stages), spec.arrivals)
            for n, spec in table.bars.items()}  # fmt: skip
    return pm.Machine(bars, progs, mma_in_order=True)


def explore_fwd(cfg: FwdConfig, sources: dict[str, str], needs=None, stop_on=None):
    """Extracts, explores; returns (Result, needs of the extracted programs)."""
    table = pm.parse_kernel(sources[FWD_FILES[0]])
    progs, own = finish(extract_fwd(cfg, sources), needs)
    return pm.search(machine(table, cfg, progs), stop_on), own


def main(argv):
    sources = read_sources(ROOT)
    tiles = tuple(int(a) for a in argv) or (3,)
    for q_tiles in (2, 1):
        cfg = FwdConfig(tiles=tiles, q_tiles=q_tiles)
        res, _ = explore_fwd(cfg, sources)
        print(f"SM100 fwd, {q_tiles} Q tile(s), tiles {tiles}: {res.states} states, "
              f"{len(res.violations)} violations")  # fmt: skip
        for kind, msg in res.violations[:10]:
            print(f"  {kind}: {msg}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

#!/usr/bin/env python3
"""Role programs of the SM90 backward (bwd_kernel with bwd_consumer, d <= 128, or with
bwd_consumer_split, d > 128), extracted from the source by tools/sync_extract_sm90.py's
interpreter (docs/testing.md, "SM90 and decode extraction") and explored by
tools/protocol_model.py's Machine.

Roles: the producer thread (threadIdx.x 0), the dQ reducer warp (warp 1, 32 threads; not in
the split variant) and the two consumer warpgroups. Barriers: the tile ring, kv_full /
kv_empty, the pipelines pipe_q (Q with its lse2 rows, one transaction) and pipe_do (dO with
its D rows), and the named barriers of enum BwdBarrier (kDsWritten, kDqFull / kDqEmpty per
warpgroup, kEpilogue, kDkDvStaged, kDkDvRead), each id a barrier of the count its calls give.

Buffers and decisions (in addition to sync_extract_sm90's):
  - sK0, sV0 (one K/V buffer, tag: the tile), sQ / lse2 and sDO / dpsum per pipeline stage
    (tag: the pipeline state's count), dS per dS stage and warpgroup (sDS<s>_<w>: each
    warpgroup stores its kv rows; the dQ GEMM reads both halves), dQ's buffer per warpgroup
    (dQ_<w>; the reducer's bulk reduce-add reads both halves, and is complete at its
    wait_group before the reducer's arrivals), the dK / dV staging rows per warpgroup
    (dVst_<w>, dKst_<w>; the row stores and the reducer's TMA stores read both halves).
  - Aliasing (Note [persistent bwd], Note [TMA-store dK/dV]): dV is staged over dS and dK
    over dQ's buffer; a write of one side is also a write (of no value) of every buffer of
    the other, so that a staged row written while a dS or dQ value is unread, or a dS / dQ
    store while a staged row is unread, is an overwrite.
  - Split variant: Pᵀ and dSᵀ per dS stage and warpgroup half (sPt<s>_<w>, sDS<s>_<w>), read
    whole by the dQ, dV and dK GEMMs; dK / dV leave from registers.
  - Deterministic mode: the global semaphores order CTAs (not modelled); within the CTA the
    split consumers' turn is a buffer (InterpBwd.turn) that their named barriers order
    (`sem != nullptr` is the configuration's deterministic flag). The reducer's turn is one
    role's and not modelled.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import protocol_model as pm  # noqa: E402
import sync_extract as se  # noqa: E402
import sync_extract_sm90 as s9  # noqa: E402
from sync_extract import OPAQUE, BarRef, ExtractError, txt  # noqa: E402

ROOT = se.ROOT
BWD90_FILES = (
    "csrc/sm90/bwd/kernel.cuh",
    "csrc/sm90/bwd/common.cuh",
    "csrc/sm90/bwd/consumer.cuh",
    "csrc/sm90/bwd/consumer_split.cuh",
    "csrc/sm90/bwd/epilogue.cuh",
    "csrc/sm90/common.cuh",
    "csrc/common/tile_ring.cuh",
)
WGS = 2  # consumer warpgroups
# Written together: a write of one side writes (no value into) every buffer of the other.
ALIASES = {
    "dVst": [f"sDS{s}_{w}" for s in range(2) for w in range(WGS)],
    "dKst": [f"dQ_{w}" for w in range(WGS)],
    "sDS": [f"dVst_{w}" for w in range(WGS)],
    "dQ": [f"dKst_{w}" for w in range(WGS)],
}
PARTS = ("sDS", "sPt")  # per-warpgroup halves of a stage, read whole by the GEMMs


@dataclass
class BwdConfig90:
    tiles: tuple = (2,)  # Q blocks that see each kv tile of the CTA
    group: int = 1  # query heads per kv head (the blocks repeat per head)
    early_dp: bool = True  # T::kEarlyDp (64-row blocks: d 96, 128)
    dkdv_regs: bool = False  # T::kDkDvRegs (128-row blocks: d 64)
    dq_regs: bool = False  # T::kDqFromRegisters && !deterministic: no reducer traffic
    tma_store: bool = True  # T::kTmaStoreDkDv && kp.out.on (dense problems)
    stages: int = 2  # T::kStages
    split: bool = False  # T::kSplitD (d > 128: bwd_consumer_split)
    deterministic: bool = False  # the split consumers' turns around their dQ reduce-adds
    # Note [GQA head slices]: kp.grid.slices > 1, dK / dV added to the workspace (red_dk_dv)
    # instead of stored; `group` is then the item's q heads
    slices: bool = False


def hd128(tiles=(2,), **kw):
    return BwdConfig90(tiles=tiles, **kw)


def hd256(tiles=(2,), **kw):  # the split variant
    kw = {"early_dp": False, "dkdv_regs": False, "tma_store": False, "split": True, **kw}
    return BwdConfig90(tiles=tiles, **kw)


def hd64(tiles=(2,), **kw):  # 128-row blocks: dQ and dK / dV from registers
    kw = {"early_dp": False, "dkdv_regs": True, "dq_regs": True, "tma_store": False, **kw}
    return BwdConfig90(tiles=tiles, **kw)


@dataclass
class Tile:  # BwdTile, as far as the roles read it
    k: int  # the item (the tile's place in the ring)
    blocks: int
    n: int = 0
    skip: bool = False
    head_kv: object = OPAQUE
    b: object = OPAQUE
    heads: int = 1  # the item's q heads (BwdConfig90.group)
    head0: object = OPAQUE
    seq: object = OPAQUE
    mask: object = OPAQUE


def _tnum(t):
    return t.k if isinstance(t, Tile) else t


class InterpBwd(s9.Interp90):
    """Interp90 with the backward's buffers (module docstring)."""

    def expr(self, n, scope):
        if n.type == "comma_expression":
            self.expr(n.child_by_field_name("left"), scope)
            return self.expr(n.child_by_field_name("right"), scope)
        return super().expr(n, scope)

    def subscript(self, n, scope):
        base, idx = se._array_base(n)
        if base == "items":  # take_item: the published int item (-1: the end)
            slot = self.expr(idx, scope)
            self.data(pm.Read(f"tile{slot}", self.tag("tile", "read")))
            k = self.lookup("n")
            return k if k < len(self.env.tiles) else -1
        return super().subscript(n, scope)

    def write(self, buf, kind):
        self.data(pm.Write(buf, self.tag(kind, "write"), 0))
        for other in self.env.aliases.get(kind, ()):
            self.data(pm.Write(other, ("alias",), 0))

    def read_parts(self, kind):
        for w in range(WGS):
            self.data(pm.Read(f"{kind}_{w}", self.tag(kind, "read")))

    def assign(self, n, scope):
        left = n.child_by_field_name("left")
        if re.match(r"ss\.dq\s*\[", txt(left)):  # this warpgroup's dQ for the reducer
            v = self.expr(n.child_by_field_name("right"), scope)
            self.write(f"dQ_{self.lookup('wg')}", "dQ")
            return v
        return super().assign(n, scope)

    def stmt(self, n, scope):
        if txt(n).lstrip().startswith("asm") and "cp.reduce.async.bulk" in txt(n):
            self.read_parts("dQ")  # the reduce-add of dQ's buffer, both halves
            return None
        if txt(n).lstrip().startswith("asm") and "red.release.gpu.global.add" in txt(n):
            self.turn("passed", 0)  # dq_turn_pass_all: the next CTA's turn
            return None
        return super().stmt(n, scope)

    def turn(self, state, reads):
        """The split consumers' deterministic turn (Note [deterministic dQ]) as a value of a
        buffer `turn`: held from thread 0's dq_turn_wait, read by each warpgroup's reduce-adds,
        then passed; a reduce-add before the turn is held reads a stale value, a pass before
        every reduce-add overwrites an unread one."""
        if self.env.turns:
            self.data(pm.Write("turn", (state, self.lookup("t"), self.lookup("i")), reads))

    def call(self, n, scope):  # noqa: C901 (one dispatch over the backward's calls)
        fn = n.child_by_field_name("function")
        name = s9.callee_name(fn)
        args = self.args(n)
        if name == "q_blocks_seeing":  # (mask, n, m_begin&, m_end&): out parameters
            blocks = self.expr(args[0], scope)
            for a, v in zip(args[2:4], (0, getattr(blocks, "blocks", OPAQUE)), strict=True):
                self._lvalue(a, scope)[1](v)
            return None
        if name == "of" and "BwdTile" in txt(fn):
            item = self.expr(args[1], scope)
            blocks = self.env.tiles[item]
            return Tile(item, blocks, heads=self.env.group, mask=s9.MaskObj(blocks))
        if name == "dq_turn_wait":
            self.turn("held", 0)
            return None
        if name == "red_add_fragment":
            if self.env.turns:
                self.data(pm.Read("turn", ("held", self.lookup("t"), self.lookup("i"))))
            return None
        if name == "issue_gemm":
            for a in args[1:3]:
                self.operand(a, scope)
            return None
        if name in ("stage_rows", "stage_swizzled"):
            buf = self.expr(args[0], scope)
            if not isinstance(buf, s9.BufAddr):
                raise ExtractError(f"{self.role}: {name} into no buffer: {txt(n)[:60]}")
            self.write(f"{buf.kind}_{self.lookup('wg')}", buf.kind)
            return None
        if name in ("write_rows", "tma_store_rows"):
            buf = self.expr(args[0 if name == "write_rows" else 2], scope)
            if not isinstance(buf, s9.BufAddr):
                raise ExtractError(f"{self.role}: {name} of no buffer: {txt(n)[:60]}")
            self.read_parts(buf.kind)
            return None
        if name == "copy" and "BULK_COPY_G2S" in txt(fn):
            return se.Interp.tma(self, n, args, scope, (self.file, n.start_byte))
        view = txt(args[-1]).split("(")[0] if args else None
        if name == "copy" and view in ("tDSsDSt", "tPsPt"):  # dSᵀ or Pᵀ (stmatrix)
            stage = self.expr(self.args(args[-1])[-1], scope)
            if not isinstance(stage, int):
                raise ExtractError(f"{self.role}: dS stage unknown")
            kind = "sDS" if view == "tDSsDSt" else "sPt"
            self.write(f"{kind}{stage}_{self.lookup('tid') // 128}", kind)
            return None
        if name == "data" and txt(fn) == "ss.ds.data":
            return s9.BufAddr("dVst", "dVst")
        return super().call(n, scope)

    def operand(self, a, scope):
        """A wgmma operand: a stage of a shared buffer, a whole one, or registers."""
        if a.type == "call_expression":
            view = txt(a.child_by_field_name("function"))
            kind = self.env.views.get(view)
            if kind is None:
                return
            idx = self.expr(self.args(a)[-1], scope)
            if not isinstance(idx, int):
                raise ExtractError(f"{self.role}: wgmma operand stage unknown: {txt(a)[:60]}")
            if kind in PARTS:
                for w in range(WGS):
                    self.data(pm.Read(f"{kind}{idx}_{w}", self.tag(kind, "read")))
            else:
                self.data(pm.Read(f"{kind}{idx}", self.tag(kind, "read")))
        elif txt(a) in self.env.plain_views:
            kind = self.env.plain_views[txt(a)]
            self.data(pm.Read(f"{kind}0", self.tag(kind, "read")))


def _bwd_tags():
    kv = lambda v: ("KV", v("kv_use"))  # noqa: E731 (the producer's count of tiles)
    block = lambda kind: lambda v: (kind, _tnum(v("t")), v("i"))  # noqa: E731
    return {
        ("sK", "tma"): kv, ("sV", "tma"): kv,
        ("sK", "read"): lambda v: ("KV", v("t")), ("sV", "read"): lambda v: ("KV", v("t")),
        ("sQ", "tma"): lambda v: ("Q", v("q_state").count),
        ("lse2", "tma"): lambda v: ("Q", v("q_state").count),
        ("sQ", "read"): lambda v: ("Q", v("q_state").count),
        ("lse2", "read"): lambda v: ("Q", v("q_state").count),
        ("sDO", "tma"): lambda v: ("dO", v("do_state").count),
        ("dpsum", "tma"): lambda v: ("dO", v("do_state").count),
        ("sDO", "read"): lambda v: ("dO", v("do_state").count),
        ("dpsum", "read"): lambda v: ("dO", v("do_state").count),
        ("sDS", "write"): block("dS"), ("sDS", "read"): block("dS"),
        ("sPt", "write"): block("P"), ("sPt", "read"): block("P"),
        ("dQ", "write"): block("dQ"), ("dQ", "read"): block("dQ"),
        ("dVst", "write"): lambda v: ("dV", _tnum(v("t"))),
        ("dVst", "read"): lambda v: ("dV", _tnum(v("t"))),
        ("dKst", "write"): lambda v: ("dK", _tnum(v("t"))),
        ("dKst", "read"): lambda v: ("dK", _tnum(v("t"))),
        ("tile", "write"): lambda v: ("T", v("n")), ("tile", "read"): lambda v: ("T", v("n")),
    }  # fmt: skip


def bwd90_env(cfg: BwdConfig90, sources) -> s9.Env90:
    if cfg.slices and cfg.tma_store:
        raise ValueError("slices: kp.out.on is false (launch_bwd), so tma_store=False")
    common = sources["csrc/sm90/bwd/common.cuh"]
    enum = re.search(r"enum BwdBarrier : uint32_t \{(.*?)\};", common, re.S)
    if not enum:
        raise ExtractError("enum BwdBarrier not found")
    ids = {}
    for name, val in re.findall(r"^\s*(k\w+) = (\w+),?", enum.group(1), re.M):
        ids[name] = int(val) if val.isdigit() else ids[val]
    reducer = re.search(r"constexpr int kReducerThreads = (\d+);", common)
    consts = {
        **ids, "kReducerThreads": int(reducer.group(1)), "kTileSlots": s9._tile_slots(sources),
        "T::kStages": cfg.stages, "T::kDsStages": 2, "T::kConsumerThreads": 128 * WGS,
        "T::kSplitD": cfg.split, "T::kEarlyDp": cfg.early_dp, "T::kDkDvRegs": cfg.dkdv_regs,
        "T::kTmaStoreDkDv": cfg.tma_store, "T::kDqFromRegisters": cfg.dq_regs,
        "T::kKVBytes": 1, "T::kQBytes": 1, "T::kDOBytes": 1, "T::kRowStatBytes": 1,
        "blockIdx": se.ThreadIdx(0), "WarpGroupRole::kProducer": 0,
    }  # fmt: skip
    kp = {
        "kp.tiles": len(cfg.tiles), "kp.group": cfg.group, "kp.out.on": cfg.tma_store,
        "kp.grid.slices": 2 if cfg.slices else 1,
        "kp.p.fwd.deterministic": False, "kp.p.fwd.tile_counter": None,
        "kp.p.fwd.cu_seqlens_q": None,
    }  # fmt: skip
    for d in ("q", "k", "v", "do"):
        kp[f"kp.tma_{d}"] = s9.TmaDesc(f"kp.tma_{d}")
    tiles = cfg.tiles
    env = s9.Env90(
        tiles, consts, {"leader": True, "sem != nullptr": cfg.deterministic}, kp, {}, _bwd_tags(),
        arrays={"ss.lse2": "lse2", "ss.dpsum": "dpsum"},
        fields={"ss.kv_full": BarRef("kv_full", 0), "ss.kv_empty": BarRef("kv_empty", 0),
                "ss.tile_full": BarRef("tile_full", 0), "ss.tile_empty": BarRef("tile_empty", 0),
                "ss.dq": s9.BufAddr("dKst", "dKst")},
        views={"tSrQ": "sQ", "tKrQt": "sQ", "tPrDO": "sDO", "tVrDOt": "sDO", "tQrDS": "sDS",
               "tVrPt": "sPt", "tKrDSt": "sDS"},
        decls={"rows_v": (lambda v: s9.BufAddr("dVst", "dVst"), "staging"),
               "rows_k": (lambda v: s9.BufAddr("dKst", "dKst"), "rows_v")},
        overrides={"next_item": lambda it, c, w: w + 1,
                   "make_producer_start_state": lambda it: s9.PState(cfg.stages, 0, 1)},
    )  # fmt: skip
    env.plain_views = {"tSrK": "sK", "tQrKt": "sK", "tPrV": "sV"}
    env.aliases = {} if cfg.split else ALIASES  # the split variant stages nothing
    env.turns = cfg.split and cfg.deterministic
    env.group = cfg.group
    env.prims = {"q_blocks_seeing", "issue_gemm", "stage_rows", "stage_swizzled", "write_rows",
                 "tma_store_rows", "dq_turn_wait", "red_add_fragment", "red_dk_dv"}  # fmt: skip
    return env


def extract_bwd90(cfg: BwdConfig90, sources, called=None):
    env = bwd90_env(cfg, sources)
    roles = [("producer", 0), ("reducer", 32)] + [(f"consumer{w}", 128 * (w + 1))
                                                  for w in range(WGS)]  # fmt: skip
    # (the split variant has no reducer: its run records nothing and is left out)
    return s9._extract90(sources, "bwd_kernel", env, roles, called, InterpBwd)


def main(argv):
    sources = se.read_sources(ROOT, BWD90_FILES)
    tiles = tuple(int(a) for a in argv) or (2,)
    configs = (
        ("hd128, TMA-store dK/dV", hd128(tiles)),
        ("hd128, row stores", hd128(tiles, tma_store=False)),
        ("hd64", hd64(tiles)),
        ("hd64, deterministic", hd64(tiles, dq_regs=False)),
        ("hd256 (split)", hd256(tiles)),
        ("hd256 (split), deterministic", hd256(tiles, deterministic=True)),
        ("hd128, GQA head slices", hd128(tiles, tma_store=False, group=2, slices=True)),
        ("hd64, GQA head slices", hd64(tiles, slices=True)),
        ("hd256 (split), GQA head slices", hd256(tiles, slices=True)),
    )
    for label, cfg in configs:
        res, _ = s9.explore(extract_bwd90, cfg, sources)
        print(f"SM90 bwd, {label}, Q blocks {tiles}: {res.states} states, "
              f"{len(res.violations)} violations")  # fmt: skip
        for kind, msg in res.violations[:10]:
            print(f"  {kind}: {msg}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

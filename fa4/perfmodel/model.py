"""Per-tile cycle model (the arithmetic; reports.py: validation and tables; cli.py: command
line and plots) of the attention forward on H100/H200 (SM90) and B200 (SM100).

For one 128-row Q tile against one KV block of kBlockN keys it counts the cycles each unit of
an SM needs: tensor cores (MMA), MUFU.EX2, the FP32 pipe, the ALU pipe, instruction issue,
shared memory, tensor memory (SM100) and the tile's share of HBM. An overlap policy turns the
units into a period per KV block; tiles, the persistent static scheduler (causal: its
longest-first order, simulated) and per-tile load/store costs turn periods into a time and
TFLOP/s. docs/perfmodel.md has the unit rates with their sources, the validation against the
H200 measurements and the B200 predictions.

    python -m fa4.perfmodel --arch sm90 --hdim 128 --seqlen 16384 [--causal] [--emu 0.25]
    python -m fa4.perfmodel --validate bench/results/2026-11-29-fa4-fwd-sm90.csv
    python -m fa4.perfmodel --sm100-table

The backward is in backward.py. Standard library only; nothing here needs torch or a GPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

BLOCK_M = 128  # rows of one Q tile, both architectures
TOKENS, HIDDEN = 16384, 2048  # the standard sweep (DESIGN.md §6): batch·seqlen, heads·hdim


@dataclass(frozen=True)
class Arch:
    """Unit rates of one GPU, per SM and clock (docs/perfmodel.md, "Unit rates")."""

    name: str
    sms: int
    clock_ghz: float  # the clock the datasheet's dense BF16 peak is stated at (derived)
    mma_flop_clk: int  # dense BF16 tensor-core FLOP per clock per SM
    mma_eff: float  # achievable fraction of it (measured GEMM / datasheet peak)
    hbm_tbs: float  # practical HBM bandwidth, TB/s
    tmem_bytes_clk: int = 0  # tcgen05.ld/st bytes per clock per SM (0: no tensor memory)
    mufu_clk: int = 16  # MUFU.EX2 results per clock per SM
    fp32_clk: int = 128  # FFMA/FADD/FMUL lanes per clock per SM (packed f32x2 counts 2)
    alu_clk: int = 64  # FMNMX/FSETP/FSEL/ISETP/F2FP lanes per clock per SM
    issue_clk: int = 128  # 4 schedulers x 1 warp instruction x 32 threads per clock
    smem_bytes_clk: int = 128  # shared-memory bandwidth per SM
    tile_latency_us: float = 1.0  # exposed latency per Q tile (first loads, barriers): estimate
    launch_us: float = 3.0  # kernel launch as timed by do_bench: estimate

    def peak_tflops(self) -> float:
        return self.sms * self.mma_flop_clk * self.clock_ghz * 1e-3

    def gemm_tflops(self) -> float:
        return self.peak_tflops() * self.mma_eff


# H100/H200 SXM: 989.4 TFLOP/s dense BF16 = 132 SMs x 4096 FLOP/clk x 1.83 GHz; the bf16 GEMM
# measured on this project's H200 (8192^3) reaches 790, so mma_eff = 790 / 989.4. HBM: H200
# copy measured at 4.3 TB/s (datasheet 4.8); H100 SXM datasheet 3.35, scaled by the same 0.9.
H200 = Arch("h200", sms=132, clock_ghz=1.83, mma_flop_clk=4096, mma_eff=790 / 989.4, hbm_tbs=4.3)
H100 = replace(H200, name="h100", hbm_tbs=3.0)
# B200: 2.25 PFLOP/s dense BF16 = 148 SMs x 8192 FLOP/clk x 1.856 GHz. No B200 is available:
# mma_eff is assumed equal to the H200's, HBM is 0.9 x the 8 TB/s datasheet, TMEM is an estimate.
B200 = Arch(
    "b200",
    sms=148,
    clock_ghz=1.856,
    mma_flop_clk=8192,
    mma_eff=790 / 989.4,
    hbm_tbs=7.2,
    tmem_bytes_clk=512,
)
ARCHS = {"sm90": H200, "h200": H200, "h100": H100, "sm100": B200, "b200": B200}


@dataclass(frozen=True)
class Code:
    """The softmax side's instructions per KV block, as thread-instruction counts.

    elem: per S element (one score): issue slots and operations per pipe, with no emulated
    exponential; emu_*: added per emulated element (MUFU.EX2 replaced by exp2_poly<3>);
    oelem: per O element when O is rescaled; fixed: per softmax thread per block; masked: per S
    element on a block cut by the causal diagonal.
    """

    threads: int  # softmax threads per 128-row tile
    elem_issue: float
    elem_fp32: float
    elem_alu: float
    emu_issue: float
    emu_fp32: float
    emu_alu: float
    oelem_issue: float
    oelem_fp32: float
    fixed: tuple[tuple[int, int], ...]  # (hdim, instructions) measured or estimated, by hdim
    masked_issue: float
    masked_alu: float
    rescale_every_block: bool  # True: O scaled every block (no conditional rescale skip)
    tmem: bool  # S/P/O live in tensor memory (tcgen05.ld/st traffic)
    correction_off_path: bool  # the O rescale runs in a separate warpgroup (SM100 FA4)

    def fixed_at(self, hdim: int) -> float:
        """Per-thread fixed instructions, interpolated linearly in hdim between table rows."""
        pts = sorted(self.fixed)
        if hdim <= pts[0][0]:
            return pts[0][1]
        for (h0, f0), (h1, f1) in zip(pts, pts[1:], strict=False):
            if hdim <= h1:
                return f0 + (f1 - f0) * (hdim - h0) / (h1 - h0)
        return pts[-1][1]


# SM90 fa4 kernel, counted in its SASS (cuobjdump of the hd 64, 128 and 256 instances, bf16,
# the steady path of the consumer loop: no mask, no softcap; docs/perfmodel.md, "SM90
# instruction counts"). Per S element: FMNMX, FFMA, MUFU.EX2, FADD, half an F2FP; per O element
# one FMUL (the kernel scales O every block, factor 1 included); exp2_poly<3> is 12 instructions
# for 1 MUFU (+11): 3 FFMA, 3 FADD, 1 IMAD (FP32 pipe: 7), 2 FMNMX, 2 FSETP, 1 FSEL (ALU: 5).
SM90_FA4 = Code(
    threads=256,
    elem_issue=4.5,
    elem_fp32=2.0,
    elem_alu=1.5,
    emu_issue=11.0,
    emu_fp32=7.0,
    emu_alu=5.0,
    oelem_issue=1.0,
    oelem_fp32=1.0,
    fixed=((64, 183), (128, 200), (256, 234)),
    masked_issue=3.6,
    masked_alu=3.5,
    rescale_every_block=True,
    tmem=False,
    correction_off_path=False,
)
# SM100 FA4 forward (docs/sm100.md; no B200 runs it, so estimated): one thread per row, S from
# TMEM, packed FFMA2/FADD2 for the scale and the row sum (and for exp2_poly's FP32 part: its 6
# FP32 ops in 3 issue slots, 9 slots in all), conditional rescale done by the correction
# warpgroup off the softmax's path, ~40 instructions of barriers and bookkeeping per block.
SM100_FA4 = Code(
    threads=128,
    elem_issue=3.55,
    elem_fp32=2.0,
    elem_alu=1.5,
    emu_issue=8.0,
    emu_fp32=7.0,
    emu_alu=5.0,
    oelem_issue=0.56,
    oelem_fp32=1.0,
    fixed=((64, 40), (256, 40)),
    masked_issue=3.6,
    masked_alu=3.5,
    rescale_every_block=False,
    tmem=True,
    correction_off_path=True,
)
# FA3-style on SM100: the same data flow without the FA4 techniques: no packed FP32, MUFU only,
# O rescaled every block by the softmax warps themselves (TMEM load, FMUL, store).
SM100_FA3 = replace(
    SM100_FA4,
    elem_issue=4.55,
    emu_issue=11.0,
    oelem_issue=1.06,
    rescale_every_block=True,
    correction_off_path=False,
)


@dataclass(frozen=True)
class Config:
    """One forward problem and the kernel shape that runs it."""

    arch: Arch
    hdim: int
    causal: bool = False
    seqlen: int = 16384
    batch: int | None = None  # None: the standard sweep, TOKENS // seqlen
    heads: int | None = None  # None: HIDDEN // hdim
    emu: float = 0.0  # fraction of the exponentials through exp2_poly (FMA pipe)
    block_n: int | None = None  # None: the kernel's kBlockN (default_block_n)
    two_cta: bool = False  # SM100 cta_group::2: each CTA stages half of K and V
    policy: str = "serial"  # serial | partial | overlapped | pingpong (see period())
    code: Code = SM90_FA4
    rescale_frac: float = 0.1  # blocks that rescale O when conditional (tau = 8): estimate
    q_tiles: int = 1  # 128-row Q tiles per CTA (SM90 1: its two warpgroups split 128 rows)
    hidden: float = 0.5  # partial: share of the shorter of MMA / softmax hidden under the other
    sync_clk: float = 600.0  # pingpong: handoff latency per block of one group (estimate)

    @property
    def n(self) -> int:
        return self.block_n or default_block_n(self.arch, self.hdim)

    @property
    def b(self) -> int:
        return self.batch or max(1, TOKENS // self.seqlen)

    @property
    def h(self) -> int:
        return self.heads or max(1, HIDDEN // self.hdim)


def default_block_n(arch: Arch, hdim: int) -> int:
    """kBlockN of the kernels: SM90 sm90/fwd/traits.cuh (registers), SM100 tmem.cuh (TMEM).

    SM90 hd 256 stays at 64 here: the validation CSVs were measured with that kernel; the kernel
    now runs 80 keys per block at hd 256 (Note [hd256 kBlockN 80]), which a revalidation against
    a new full sweep would have to take in."""
    if not arch.tmem_bytes_clk:
        return 128 if hdim <= 128 else 64
    return 64 if hdim >= 192 else 128  # tmem.cuh fwd_block_n: hd 256 at 64 (shared memory)


def sm90_config(hdim: int, causal: bool = False, seqlen: int = 16384, **kw) -> Config:
    """The SM90 fa4 kernel as built (sm90/fwd/traits.cuh: 128 x kBlockN, two warpgroups; at
    hd 64 the kernel runs 192-row tiles on three warpgroups, whose per-row costs are the same:
    the third warpgroup's extra overlap is not modelled)."""
    return Config(kw.pop("arch", H200), hdim, causal, seqlen, **kw)


def sm100_config(hdim: int, causal: bool = False, seqlen: int = 16384, style="fa4", **kw):
    """The SM100 forward design (docs/sm100.md; style "fa4") or FA3-style scheduling on the
    same GPU.

    fa4: two Q tiles per CTA (one for hd 256, tmem.cuh), ping-pong softmax warpgroups, correction
    warpgroup, packed FP32, conditional rescale, the emulation fraction of EMU_SIXTEENTHS.
    fa3: the same tiles and overlap, but every exponential on MUFU, O rescaled every block by the
    softmax warps, scalar FP32.
    """
    kw.setdefault("q_tiles", 1 if hdim > 192 else 2)
    kw.setdefault("policy", "pingpong")
    arch = kw.pop("arch", B200)
    if style == "fa4":
        kw.setdefault("emu", emu_sixteenths("sm100", hdim, causal) / 16)
        return Config(arch, hdim, causal, seqlen, code=SM100_FA4, **kw)
    if style == "fa3":
        return Config(arch, hdim, causal, seqlen, code=SM100_FA3, **kw)
    raise ValueError(f"style must be fa4 or fa3, not {style!r}")


def fwd_flops(b: int, h: int, s: int, d: int, causal: bool) -> float:
    """The benchmark's count (bench_util.flops): 4·b·h·s²·d, halved for causal."""
    return 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)


# --- per-tile units -------------------------------------------------------------------------


def mma_cycles(cfg: Config) -> float:
    """S = Q·Kᵀ and O += P·V of one 128 x N tile at the achievable tensor-core rate."""
    flops = 2 * 2 * BLOCK_M * cfg.n * cfg.hdim
    return flops / (cfg.arch.mma_flop_clk * cfg.arch.mma_eff)


def mufu_cycles(cfg: Config) -> float:
    return BLOCK_M * cfg.n * (1 - cfg.emu) / cfg.arch.mufu_clk


def _rescale_share(cfg: Config) -> float:
    return 1.0 if cfg.code.rescale_every_block else cfg.rescale_frac


def softmax_ops(cfg: Config, masked: bool = False) -> dict[str, float]:
    """Thread-instructions (issue, oissue: the O rescale's) and lane-operations (fp32, alu) of
    one 128 x N tile's softmax."""
    c, e = cfg.code, cfg.emu
    elems, oelems = BLOCK_M * cfg.n, BLOCK_M * cfg.hdim * _rescale_share(cfg)
    issue = elems * (c.elem_issue + e * c.emu_issue) + c.threads * c.fixed_at(cfg.hdim)
    alu = elems * (c.elem_alu + e * c.emu_alu)
    if masked:
        issue += elems * c.masked_issue
        alu += elems * c.masked_alu
    return {
        "issue": issue,
        "oissue": oelems * c.oelem_issue,
        "fp32": elems * (c.elem_fp32 + e * c.emu_fp32) + oelems * c.oelem_fp32,
        "alu": alu,
    }


def smem_bytes(cfg: Config) -> float:
    """Shared-memory bytes per tile: MMA operand reads plus the TMA writes of K and V.

    SM90 (two 64-row warpgroups): each warpgroup's wgmma reads its Q rows, and all of K and V,
    so K and V are read twice; P comes from registers. SM100: one 128-row MMA per Q tile reads
    Q, K, V; P comes from TMEM; K and V are written once per CTA for its q_tiles Q tiles, and
    2-CTA halves K and V per CTA (each CTA stages half of the B operand).
    """
    d, n, el = cfg.hdim, cfg.n, 2
    kv = n * 2 * d * el
    if not cfg.arch.tmem_bytes_clk:
        return BLOCK_M * d * el + 2 * kv + kv
    split = 2 if cfg.two_cta else 1
    return BLOCK_M * d * el + kv / split + kv / split / cfg.q_tiles


def tmem_bytes(cfg: Config) -> float:
    """tcgen05.ld of S (fp32), tcgen05.st of P (16-bit), O load + store when rescaled."""
    if not cfg.code.tmem:
        return 0.0
    elems = BLOCK_M * cfg.n
    return elems * 4 + elems * 2 + BLOCK_M * cfg.hdim * 8 * _rescale_share(cfg)


def hbm_bytes_per_block(cfg: Config) -> float:
    """K and V bytes one tile-block pulls from HBM: the L2 serves the Q tiles of a head that run
    at the same time (m-block-fastest order), so HBM sees each block once per that many."""
    sharing = max(1, min(cfg.arch.sms, math.ceil(cfg.seqlen / BLOCK_M)))
    return cfg.n * 2 * cfg.hdim * 2 / sharing


def tile_units(cfg: Config, masked: bool = False) -> dict[str, float]:
    """Cycles each unit of one SM spends on one 128 x N tile (a KV block of one Q tile).

    chain: the softmax warps' own time per block: their thread-instructions at the SM's issue
    rate, at least the tile's MUFU time; an off-path correction warpgroup's work is left out.
    """
    a = cfg.arch
    ops = softmax_ops(cfg, masked)
    own = ops["issue"] + (0.0 if cfg.code.correction_off_path else ops["oissue"])
    units = {
        "mma": mma_cycles(cfg),
        "mufu": mufu_cycles(cfg),
        "fp32": ops["fp32"] / a.fp32_clk,
        "alu": ops["alu"] / a.alu_clk,
        "issue": (ops["issue"] + ops["oissue"]) / a.issue_clk,
        "smem": smem_bytes(cfg) / a.smem_bytes_clk,
        "tmem": tmem_bytes(cfg) / a.tmem_bytes_clk if a.tmem_bytes_clk else 0.0,
        "hbm": hbm_bytes_per_block(cfg) / (a.hbm_tbs * 1e12 / a.sms / (a.clock_ghz * 1e9)),
    }
    units["chain"] = max(own / a.issue_clk, units["mufu"])
    return units


SIMT_UNITS = ("mufu", "fp32", "alu", "issue", "tmem")
UNITS = ("mma", "mufu", "fp32", "alu", "issue", "smem", "tmem", "hbm")


def softmax_cycles(units: dict[str, float]) -> float:
    """The softmax side as a whole: its slowest pipe (the pipes run in parallel)."""
    return max(units[k] for k in SIMT_UNITS)


def tensor_cycles(units: dict[str, float]) -> float:
    """The MMAs, slowed to the shared-memory time when their operands cannot be read faster."""
    return max(units["mma"], units["smem"])


def period(units: dict[str, float], cfg: Config) -> float:
    """Cycles per KV block per 128-row tile under the overlap policy.

    serial:     the MMAs, then the softmax, nothing overlapped between them;
    partial:    the longer of the two plus (1 - hidden) of the shorter;
    overlapped: every unit busy all the time, the slowest sets the pace;
    pingpong:   overlapped, but each of two groups (warpgroups, Q tiles, or the double-buffered
                S of a single Q tile) runs MMA -> softmax -> MMA in order with a handoff
                latency sync_clk, so two groups hide at most that chain.
    """
    mma, simt, hbm = tensor_cycles(units), softmax_cycles(units), units["hbm"]
    if cfg.policy == "serial":
        return max(mma + simt, hbm)
    if cfg.policy == "partial":
        return max(max(mma, simt) + (1 - cfg.hidden) * min(mma, simt), hbm)
    bound = max(mma, simt, hbm)
    if cfg.policy == "overlapped":
        return bound
    if cfg.policy == "pingpong":
        return max(bound, (mma + units["chain"] + cfg.sync_clk) / 2)
    raise ValueError(f"policy: serial, partial, overlapped or pingpong, not {cfg.policy!r}")


def bound_unit(units: dict[str, float], cfg: Config) -> str:
    """What sets the period: a unit, "chain" (the pingpong dependency) or "mma+softmax"."""
    if cfg.policy in ("serial", "partial"):
        return "mma+softmax"
    p = period(units, cfg)
    cands = {k: units[k] for k in UNITS}
    if p > max(cands.values()) + 1e-9:
        return "chain"
    return max(cands, key=cands.get)


# --- whole problem --------------------------------------------------------------------------


def blocks_of_tile(cfg: Config, m_block: int) -> tuple[int, int]:
    """(unmasked, masked) KV blocks the 128-row Q tile m_block visits (causal: aligned at the
    diagonal, s_q = s_k)."""
    n_total = math.ceil(cfg.seqlen / cfg.n)
    if not cfg.causal:
        return n_total, 0
    last_row = min(cfg.seqlen, (m_block + 1) * BLOCK_M) - 1
    first_diag = (m_block * BLOCK_M) // cfg.n  # the first block some row sees only in part
    return first_diag, last_row // cfg.n + 1 - first_diag


def tile_overhead_us(cfg: Config, units: dict[str, float]) -> float:
    """Per 128-row Q tile, outside the steady loop: a fixed latency (first loads, barriers), the
    Q load and O store through this SM's share of HBM (non-causal tiles all start and end
    together), and for overlapping policies the pipeline fill (the first S GEMM and the last
    softmax hide nothing)."""
    a = cfg.arch
    q_o_bytes = 2 * BLOCK_M * cfg.hdim * 2 + BLOCK_M * 4  # Q, O (16-bit), LSE (fp32)
    io_us = q_o_bytes / (a.hbm_tbs * 1e12 / a.sms) * 1e6
    fill = 0.0 if cfg.policy == "serial" else min(tensor_cycles(units), softmax_cycles(units))
    return a.tile_latency_us + io_us + fill / (a.clock_ghz * 1e3)


def tile_costs_us(cfg: Config) -> list[float]:
    """Time of each 128-row Q tile m_block (the same for every head and batch)."""
    clk_us = 1.0 / (cfg.arch.clock_ghz * 1e3)
    full_u, mask_u = tile_units(cfg), tile_units(cfg, masked=True)
    p_full, p_mask = period(full_u, cfg), period(mask_u, cfg)
    extra = tile_overhead_us(cfg, full_u)
    costs = []
    for m in range(math.ceil(cfg.seqlen / BLOCK_M)):
        n_full, n_mask = blocks_of_tile(cfg, m)
        costs.append((n_full * p_full + n_mask * p_mask) * clk_us + extra)
    return costs


def lpt_section_heads(l2_bytes: int, seqlen_k: int, hdim: int, hdim_v: int, elem: int) -> int:
    """common/tile_scheduler.cuh's lpt_section_heads (group 1): pairs whose K, V fit half the L2."""
    kv = seqlen_k * (hdim + hdim_v) * elem
    return max(1, min((l2_bytes // 2) // kv if kv else 1, 1 << 20))


def schedule_order(cfg: Config, n_items: int) -> list[int]:
    """Item index within its head (m-block of CTA tiles) in the order of TileScheduler::at:
    m-block fastest (non-causal); causal: sections of lpt_section_heads (b, h) pairs (the
    50 MB the SM90 launch passes), m-block descending, pair fastest."""
    pairs = cfg.b * cfg.h
    if not cfg.causal:
        return [w % n_items for w in range(pairs * n_items)]
    section = lpt_section_heads(50 << 20, cfg.seqlen, cfg.hdim, cfg.hdim, 2)
    order = []
    for first in range(0, pairs, section):
        size = min(section, pairs - first)
        order += [n_items - 1 - r // size for r in range(size * n_items)]
    return order


def makespan_us(cfg: Config) -> tuple[float, float]:
    """(makespan, balanced): CTA c runs items c, c + grid, ... (static persistent scheduler);
    balanced spreads the same work evenly over the SMs. An item is one CTA tile: q_tiles
    consecutive 128-row Q tiles, which share the SM's units (their costs add)."""
    tiles = tile_costs_us(cfg)
    q = cfg.q_tiles
    items = [sum(tiles[i : i + q]) for i in range(0, len(tiles), q)]
    order = schedule_order(cfg, len(items))
    grid = min(cfg.arch.sms, len(order))
    per_cta = [0.0] * grid
    for w, m in enumerate(order):
        per_cta[w % grid] += items[m]
    return max(per_cta), sum(per_cta) / grid


@dataclass(frozen=True)
class Prediction:
    cfg: Config
    units: dict[str, float]  # cycles per unmasked 128 x N tile
    period: float  # cycles per unmasked 128 x N tile under the policy
    bound: str
    time_us: float
    balanced_us: float  # the same work spread evenly over the SMs (no schedule tail)
    tflops: float

    def balanced_tflops(self) -> float:
        return self.tflops * self.time_us / self.balanced_us


def predict(cfg: Config) -> Prediction:
    units = tile_units(cfg)
    span, balanced = makespan_us(cfg)
    time_us = span + cfg.arch.launch_us
    flops = fwd_flops(cfg.b, cfg.h, cfg.seqlen, cfg.hdim, cfg.causal)
    return Prediction(
        cfg,
        units,
        period(units, cfg),
        bound_unit(units, cfg),
        time_us,
        balanced + cfg.arch.launch_us,
        flops / (time_us * 1e-6) / 1e12,
    )


def steady_tflops(cfg: Config) -> float:
    """TFLOP/s of the steady loop alone (no tile edges, no schedule tail)."""
    flops = 4.0 * BLOCK_M * cfg.n * cfg.hdim
    sec = period(tile_units(cfg), cfg) / (cfg.arch.clock_ghz * 1e9)
    return flops * cfg.arch.sms / sec / 1e12


# --- emulation fraction ---------------------------------------------------------------------


def emu_balance(cfg: Config) -> float:
    """The fraction e at which MUFU time equals the FMA side (the slowest of the FP32 pipe, ALU
    pipe and issue): below it MUFU bounds the softmax, above it the FMA side does. Both are
    linear in e, so the crossing is solved directly."""

    def fma_side(e: float) -> float:
        u = tile_units(replace(cfg, emu=e))
        return max(u["fp32"], u["alu"], u["issue"])

    m0, m1 = tile_units(replace(cfg, emu=0.0))["mufu"], tile_units(replace(cfg, emu=1.0))["mufu"]
    lo, hi = 0.0, 1.0
    if fma_side(0.0) >= m0:
        return 0.0
    for _ in range(40):  # the FMA side is a max of lines: bisect the crossing
        mid = (lo + hi) / 2
        if m0 + (m1 - m0) * mid > fma_side(mid):
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def choose_emu_sixteenths(cfg: Config) -> int:
    """kEmuSixteenths that minimises the steady period (ties: the least emulation, which costs
    registers and power for nothing once MUFU is off the critical path)."""
    best = min(
        range(17), key=lambda k: (round(period(tile_units(replace(cfg, emu=k / 16)), cfg), 6), k)
    )
    return best


EMU_HDIMS = (64, 96, 128, 192, 256)
# The kernels' default emulation fraction, in sixteenths of the exponentials (kEmuSixteenths):
# chosen by choose_emu_sixteenths for the SM90 kernel as it is (serial policy: the measured
# one, docs/perfmodel.md) and the SM100 design (pingpong policy). tests/models/test_perfmodel.py
# recomputes it, so this literal cannot drift from the model; the kernels read it from here.
EMU_SIXTEENTHS = {
    ("sm90", 64): 0,
    ("sm90", 96): 0,
    ("sm90", 128): 0,
    ("sm90", 192): 0,
    ("sm90", 256): 0,
    ("sm100", 64): 4,
    ("sm100", 96): 4,
    ("sm100", 128): 4,
    ("sm100", 192): 4,
    ("sm100", 256): 0,
}


def emu_sixteenths(arch: str, hdim: int, causal: bool = False) -> int:
    """The table's entry; causal uses the same value (the unmasked blocks dominate)."""
    return EMU_SIXTEENTHS[(arch, hdim)]


def computed_emu_table() -> dict[tuple[str, int], int]:
    table = {}
    for h in EMU_HDIMS:
        table[("sm90", h)] = choose_emu_sixteenths(sm90_config(h))
        table[("sm100", h)] = choose_emu_sixteenths(sm100_config(h, emu=0.0))
    return table

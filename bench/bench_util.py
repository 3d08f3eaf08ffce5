"""Pure parts of the benchmark (no torch, no CUDA): FLOP counts, the sweep, CSV rows, tables.

DESIGN.md §6: bf16, 16k tokens per batch (batch = 16384 // seqlen), heads = 2048 // hdim,
forward FLOPs 4·b·h·s_q·s_k·d (halved for causal), backward 2.5 × forward.
"""

from __future__ import annotations

import csv
import hashlib
import math
from dataclasses import dataclass
from pathlib import Path

TOKENS = 16384  # tokens per batch: batch × seqlen
HIDDEN = 2048  # heads × hdim
SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
HDIMS = (128, 64, 256)  # hd128 first: the points the issues' targets care most about
# Head dims the kernels have but the standard sweep leaves out, whose 2048 / hdim is not whole:
# they run with heads = 2048 // hdim (hidden 2016 at hd96, 1920 at hd192), asked for by --hdims.
OFF_SWEEP_HDIMS = (96, 192)
DIRECTIONS = ("fwd", "bwd", "fwd+bwd")
QUICK_SEQLENS = (16384, 1024)
BWD_FACTOR = 2.5  # backward = 2.5 × forward (2 GEMMs forward, 5 backward)
# An impl "fails" (is not timed) when max |out - out_sdpa_flash| (and the same for each gradient)
# exceeds TOLERANCE · max(1, max |reference|): absolute 2e-2 for values up to 1, relative above,
# since bf16 gradients reach |g| ~ 4 at causal points, where one bf16 ulp is 0.016-0.03.
TOLERANCE = 2e-2
REFERENCE_IMPL = "sdpa-flash"
OURS = "fa4"

# sm_mhz: the SM clock read before / after the timing (NVML; blank without pynvml); clock_reasons:
# NVML's clock event reasons seen at either read, hex (0x4 power cap, 0x20 / 0x40 thermal, ...).
# host_us: the host's time per call, read right after the timing (bench_impls.host_us): where it
# approaches ms, the host paces the timed loop and the reading is the host's, not the GPU's.
# ms_rounds: with bench.py --rounds N, each round's median ms (ms is their median); sm_mhz then
# holds each round's before / after, space-separated, and clock_reasons their union.
# The FP8 forward mode (bench.py --dtype e4m3) appends four columns, blank in a bf16 run's rows
# (dtype says bf16 there): dtype, the inputs' dtype of the row (e4m3, or bf16 for fa4-bf16);
# ratio_fa4_bf16, the row's TFLOP/s over fa4-bf16's at the same point and direction;
# fp8_gemm_ceiling_tflops, the run's FP8 GEMM ceiling (fp8_gemm_tflops); frac_fp8_ceiling, the
# row's TFLOP/s over it. heads_kv: k and v's heads (= heads but at GQA points); label: the model
# point's (MODEL_POINTS), blank at the standard sweep's. Columns are only ever appended: older
# CSVs read back without them (no heads_kv: MHA; no label: a standard point).
CSV_FIELDS = (
    "impl direction hdim causal seqlen batch heads ms tflops peak_extra_mib max_abs_diff status "
    "sm_mhz clock_reasons host_us ms_rounds dtype ratio_fa4_bf16 fp8_gemm_ceiling_tflops "
    "frac_fp8_ceiling heads_kv label"
).split()
FP8_COLUMNS = ("ratio_fa4_bf16", "fp8_gemm_ceiling_tflops", "frac_fp8_ceiling")
# bench.py --dtype e4m3: fa4 is the FP8 forward, fa4-bf16 its bf16 forward on the same (dequantized)
# values, sdpa-cudnn-fp8 cuDNN's FP8 SDPA where torch exposes one (else its rows are skipped).
DTYPES = ("bf16", "e4m3")
FP8_IMPLS = ("fa4", "fa4-bf16", "sdpa-cudnn-fp8")
FP8_BASELINE = "fa4-bf16"
# The FP8 GEMM ceiling: an m × n × k e4m3 matmul (torch._scaled_mm, bf16 out), 2·m·n·k FLOPs.
CEILING_MNK = (8192, 8192, 8192)


@dataclass(frozen=True)
class Point:
    """One problem of the sweep: q, k, v are (batch, seqlen, heads, hdim)."""

    hdim: int
    causal: bool
    seqlen: int
    batch: int
    heads: int
    # GQA: k and v have heads_kv heads (0: as many as q). The standard sweep's points are MHA;
    # the model-shaped points (MODEL_POINTS) are GQA and carry a label naming the model.
    heads_kv: int = 0
    label: str = ""

    @property
    def key(self) -> tuple:
        return (self.hdim, self.causal, self.seqlen)

    @property
    def kv_heads(self) -> int:
        return self.heads_kv or self.heads

    @property
    def name(self) -> str:
        """The label, or the standard sweep's hd / causal / seqlen spelled out."""
        return self.label or f"hd{self.hdim}{' causal' if self.causal else ''} {_k(self.seqlen)}"


# Model-shaped GQA points (bench.py --model-points; --sustained): attention of one layer of a
# training step, causal, q heads : kv heads and head dim as the models'. FLOPs count the q heads
# (each q head does the full QK^T and PV whatever kv head it reads). gpt-oss alternates
# full-attention layers with sliding-window (128) layers; only the full layers are modelled here.
MODEL_POINTS = (
    Point(128, True, 8192, 1, 32, 8, "llama3-8b-8k"),  # 32 : 8, hd128
    Point(128, True, 4096, 4, 32, 8, "llama3-8b-4x4k"),  # the same layer, batch 4 x 4k training
    Point(128, True, 8192, 1, 28, 4, "qwen2.5-7b-8k"),  # 28 : 4, hd128
    Point(128, True, 4096, 4, 28, 4, "qwen2.5-7b-4x4k"),
    Point(64, True, 8192, 1, 64, 8, "gpt-oss-8k"),  # 64 : 8, hd64 (full-attention layers)
)


def model_points(names: str | None = None) -> list[Point]:
    """MODEL_POINTS, or those whose labels are in the comma list `names` ("all": every one)."""
    want = [n.strip() for n in (names or "").split(",") if n.strip()]
    by = {p.label: p for p in MODEL_POINTS}
    bad = [n for n in want if n not in by and n != "all"]
    if bad:
        raise ValueError(f"unknown model points {bad}: choose from all, {', '.join(by)}")
    if not want or "all" in want:
        return list(MODEL_POINTS)
    return [by[n] for n in want]


def flops(
    direction: str, batch: int, heads: int, seqlen_q: int, seqlen_k: int, hdim: int, causal: bool
) -> float:
    """FLOPs of one call: fwd 4·b·h·s_q·s_k·d (two GEMMs), halved when causal; bwd 2.5×."""
    fwd = 4.0 * batch * heads * seqlen_q * seqlen_k * hdim
    if causal:
        fwd /= 2
    factor = {"fwd": 1.0, "bwd": BWD_FACTOR, "fwd+bwd": 1.0 + BWD_FACTOR}
    if direction not in factor:
        raise ValueError(f"direction {direction!r}: expected one of {DIRECTIONS}")
    return fwd * factor[direction]


def point_flops(direction: str, p: Point) -> float:
    return flops(direction, p.batch, p.heads, p.seqlen, p.seqlen, p.hdim, p.causal)


def tflops(direction: str, p: Point, ms: float) -> float:
    return point_flops(direction, p) / (ms * 1e-3) / 1e12


def gemm_tflops(
    ms: float, m: int = CEILING_MNK[0], n: int = CEILING_MNK[1], k: int = CEILING_MNK[2]
) -> float:
    """TFLOP/s of one m × n × k matmul taking ms: 2·m·n·k / t (the FP8 GEMM ceiling)."""
    return 2.0 * m * n * k / (ms * 1e-3) / 1e12


def fill_fp8_columns(rows: list[dict], ceiling_tflops: float | None) -> list[dict]:
    """The FP8 mode's derived columns of one point's rows (in place; also returns rows): each
    ok row's TFLOP/s over fa4-bf16's in its direction, and over the FP8 GEMM ceiling."""
    base = {r["direction"]: _tf(r) for r in rows if r["impl"] == FP8_BASELINE}
    for r in rows:
        for k in FP8_COLUMNS:
            r[k] = ""
        if ceiling_tflops:
            r["fp8_gemm_ceiling_tflops"] = f"{ceiling_tflops:.1f}"
        tf = _tf(r)
        if tf is None:
            continue
        b = base.get(r["direction"])
        if b:
            r["ratio_fa4_bf16"] = f"{tf / b:.3f}"
        if ceiling_tflops:
            r["frac_fp8_ceiling"] = f"{tf / ceiling_tflops:.3f}"
    return rows


def is_fp8_rows(rows: list[dict]) -> bool:
    """Whether rows come from an FP8 run (bench.py --dtype e4m3)."""
    return any(r.get("dtype") == "e4m3" for r in rows)


def fp8_table(rows: list[dict], direction: str) -> str:
    """Markdown: an FP8 run's TFLOP/s per impl per point, fa4 (FP8) over fa4-bf16, and the
    fraction of the FP8 GEMM ceiling fa4 reaches."""
    rows = [r for r in rows if r["direction"] == direction]
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    cell = _by_point(rows)
    head = ["hd", "causal", "seqlen", *impls, f"{OURS} / {FP8_BASELINE}",
            f"{OURS} % of FP8 GEMM ceiling"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key in sorted(cell):
        by = cell[key]
        vals = []
        for i in impls:
            r = by.get(i)
            tf = _tf(r) if r else None
            vals.append(f"{tf:.0f}" if tf is not None else ("-" if r is None else _short(r)))
        ours = by.get(OURS, {})
        frac = ours.get("frac_fp8_ceiling")
        vals += [ours.get("ratio_fa4_bf16") or "n/a", f"{100 * float(frac):.1f}" if frac else "n/a"]
        lines.append("| " + " | ".join([*_point_cells(by), *vals]) + " |")
    return "\n".join(lines)


def agrees(max_abs_diff: float, ref_max_abs: float) -> bool:
    """The correctness guard; NaN never agrees."""
    return max_abs_diff <= TOLERANCE * max(1.0, ref_max_abs)


# The FP8 rows' guard adds docs/numerics.md "FP8"'s bound on rounding P to e4m3 to the bf16 one:
# (u + n · 2^-10 / 256) · max|v| for n keys, u = 2^-4 (e4m3's unit roundoff). The bf16 guard
# alone fails a correct FP8 forward at causal points (rows of a few keys: ~0.07 at |ref| ~ 3.7).
FP8_P_ROUNDING = 2.0**-4


def fp8_bound(ref_max_abs: float, v_max_abs: float, seqlen_k: int) -> float:
    """The largest max |out - ref| an FP8 row may have (agrees_fp8)."""
    p_rounding = (FP8_P_ROUNDING + seqlen_k * 2.0**-10 / 256) * v_max_abs
    return TOLERANCE * max(1.0, ref_max_abs) + p_rounding


def agrees_fp8(max_abs_diff: float, ref_max_abs: float, v_max_abs: float, seqlen_k: int) -> bool:
    """The correctness guard of an FP8 (e4m3) row; NaN never agrees."""
    return max_abs_diff <= fp8_bound(ref_max_abs, v_max_abs, seqlen_k)


def point_seed(p: Point) -> int:
    """A seed that depends on the point only (not on its place in a filtered sweep)."""
    return p.seqlen * 1000 + p.hdim * 2 + int(p.causal)


def make_point(hdim: int, causal: bool, seqlen: int) -> Point:
    if TOKENS % seqlen or (HIDDEN % hdim and hdim not in OFF_SWEEP_HDIMS):
        raise ValueError(
            f"seqlen {seqlen} must divide {TOKENS} and hdim {hdim} divide {HIDDEN} "
            f"(or be one of {OFF_SWEEP_HDIMS})"
        )
    return Point(hdim, causal, seqlen, TOKENS // seqlen, HIDDEN // hdim)


def sweep(hdims=HDIMS, seqlens=SEQLENS, causals=(False, True)) -> list[Point]:
    """Points in run order: hdim (as given), then causal, then seqlen (as given)."""
    return [make_point(d, c, s) for d in hdims for c in causals for s in seqlens]


def parse_ints(text: str | None, default: tuple[int, ...]) -> tuple[int, ...]:
    """'1k,16k,512' -> (1024, 16384, 512); None -> default."""
    if not text:
        return tuple(default)
    out = []
    for tok in text.split(","):
        tok = tok.strip().lower()
        out.append(int(tok[:-1]) * 1024 if tok.endswith("k") else int(tok))
    return tuple(out)


def rotated(items: list, i: int) -> list:
    """items started at position i (mod len): --rotate-impls runs point i's implementations in
    this order, so that none is always the first timed after the previous point's (the low
    readings of docs/decisions.md "the short points' two modes" follow a change of load)."""
    k = i % len(items) if items else 0
    return list(items[k:]) + list(items[:k])


def parse_names(text: str | None, allowed: tuple[str, ...]) -> tuple[str, ...]:
    if not text:
        return tuple(allowed)
    names = tuple(t.strip() for t in text.split(",") if t.strip())
    bad = [n for n in names if n not in allowed]
    if bad:
        raise ValueError(f"unknown {bad}: choose from {', '.join(allowed)}")
    return names


def make_row(
    impl: str,
    direction: str,
    p: Point,
    ms=None,
    peak_extra_mib=None,
    max_abs_diff=None,
    status="ok",
    sm_mhz="",
    clock_reasons="",
    host_us=None,
    ms_rounds=(),
    dtype="bf16",
) -> dict:
    """A CSV row; ms / tflops / memory / diff are blank when not measured; the FP8 mode's
    derived columns (FP8_COLUMNS) blank until fill_fp8_columns."""

    def fmt(x, spec):
        return "" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)

    tf = tflops(direction, p, ms) if ms else None
    return dict(
        impl=impl,
        direction=direction,
        hdim=p.hdim,
        causal=int(p.causal),
        seqlen=p.seqlen,
        batch=p.batch,
        heads=p.heads,
        ms=fmt(ms, ".4f"),
        tflops=fmt(tf, ".1f"),
        peak_extra_mib=fmt(peak_extra_mib, ".1f"),
        max_abs_diff=fmt(max_abs_diff, ".2e"),
        status=status,
        sm_mhz=sm_mhz,
        clock_reasons=clock_reasons,
        host_us=fmt(host_us, ".1f"),
        ms_rounds=" ".join(format(x, ".4f") for x in ms_rounds),
        dtype=dtype,
        **dict.fromkeys(FP8_COLUMNS, ""),
        heads_kv=p.kv_heads,
        label=p.label,
    )


def source_digest(root: Path) -> str:
    """A digest of the sources that decide what a run measures (csrc/, fa4/*.py, setup.py), by
    content: the device's copy of the tree can carry a stale .git, so `git log` there named
    another commit than the files it ran (docs/decisions.md, 2026-12-03). Compare it with this
    function's value on the commit the run is recorded against."""
    root = Path(root)
    files = sorted(
        [*root.glob("csrc/**/*"), *root.glob("fa4/**/*.py"), root / "setup.py"],
        key=lambda f: f.relative_to(root).as_posix(),
    )
    h = hashlib.sha256()
    for f in files:
        if f.is_file() and f.name != "_build_config.py":
            h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


class CsvLog:
    """Appends rows to a CSV and flushes each, so a run killed at its time limit keeps its rows."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, "w", newline="")
        self._w = csv.DictWriter(self._f, fieldnames=CSV_FIELDS)
        self._w.writeheader()
        self._f.flush()

    def write(self, row: dict) -> None:
        self._w.writerow(row)
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _tf(row) -> float | None:
    return float(row["tflops"]) if row["status"].startswith("ok") and row["tflops"] else None


def ratio_table(rows: list[dict], direction: str) -> str:
    """Markdown table: TFLOP/s per impl per point, the best peer, and fa4 / best peer."""
    rows = [r for r in rows if r["direction"] == direction]
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    peers = [i for i in impls if i != OURS and not i.startswith(OURS + "-")]  # fa4-det is ours
    cell = _by_point(rows)
    head = ["hd", "causal", "seqlen", *impls, "best peer", f"{OURS} / best"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key in sorted(cell):
        by = cell[key]
        vals = []
        for i in impls:
            r = by.get(i)
            tf = _tf(r) if r else None
            vals.append(f"{tf:.0f}" if tf is not None else ("-" if r is None else _short(r)))
        best = max(((_tf(by[i]), i) for i in peers if i in by and _tf(by[i]) is not None),
                   default=None)  # fmt: skip
        ours = _tf(by[OURS]) if OURS in by else None
        best_s = f"{best[0]:.0f} ({best[1]})" if best else "n/a"
        ratio = f"{ours / best[0]:.2f}" if best and best[0] > 0 and ours is not None else "n/a"
        lines.append("| " + " | ".join([*_point_cells(by), *vals, best_s, ratio]) + " |")
    return "\n".join(lines)


def sweep_gaps(rows: list[dict], direction: str) -> str:
    """One line naming the points of DESIGN.md §6's sweep with no ok fa4 row in `direction`, a
    seqlen missing at every hdim and causal as one entry, so that a run which left a point out
    says so under its table (no standing run before 2026-12-06 had seqlen 8k; docs/decisions.md,
    2026-12-05). "" when nothing is missing."""
    have = {  # row_point: a model point's row never stands for a standard point
        row_point(r)
        for r in rows
        if r["direction"] == direction and r["impl"] == OURS and _tf(r) is not None
    }
    missing = [p for p in sweep() if (0, p.hdim, int(p.causal), p.seqlen) not in have]
    if not missing:
        return ""
    parts = []
    for s in SEQLENS:
        at = [p for p in missing if p.seqlen == s]
        if len(at) == len(sweep(seqlens=(s,))):
            parts.append(f"{_k(s)} (every hd, causal and not)")
        else:
            parts += [f"hd{p.hdim} {'causal ' if p.causal else ''}{_k(s)}" for p in at]
    return f"{direction}: standard-sweep points without an ok {OURS} row: " + ", ".join(parts)


def memory_table(rows: list[dict], direction: str) -> str:
    """Markdown table: peak extra device memory (MiB) per impl per point."""
    rows = [r for r in rows if r["direction"] == direction]
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    cell = _by_point(rows)
    head = ["hd", "causal", "seqlen", *impls]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key in sorted(cell):
        by = cell[key]
        vals = [(by[i]["peak_extra_mib"] or "-") if i in by else "-" for i in impls]
        lines.append("| " + " | ".join([*_point_cells(by), *vals]) + " |")
    return "\n".join(lines)


_MODEL_ORDER = {p.label: i for i, p in enumerate(MODEL_POINTS)}


def row_point(r: dict) -> tuple:
    """A row's point in the tables, in their order: the standard sweep's by (hdim, causal,
    seqlen), then the labelled (model) points in MODEL_POINTS order. Keyed by the label, a GQA
    point stays apart from the MHA point of its hdim, causal and seqlen; a row without a label
    (or an old CSV's, without the column) is a standard point."""
    label = r.get("label") or ""
    if label:
        return (1, _MODEL_ORDER.get(label, len(MODEL_POINTS)), label)
    return (0, int(r["hdim"]), int(r["causal"]), int(r["seqlen"]))


def _by_point(rows: list[dict]) -> dict[tuple, dict[str, dict]]:
    cell: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        cell.setdefault(row_point(r), {})[r["impl"]] = r
    return cell


def _point_cells(by: dict[str, dict]) -> list[str]:
    """A table line's hd, causal and seqlen cells; a model point's label stands in the hd cell."""
    r = next(iter(by.values()))
    hd = r.get("label") or str(r["hdim"])
    return [hd, "yes" if int(r["causal"]) else "no", _k(int(r["seqlen"]))]


def _short(row) -> str:
    return row["status"].split(":")[0]  # skipped / failed / error


def _k(s: int) -> str:
    return f"{s // 1024}k" if s % 1024 == 0 else str(s)

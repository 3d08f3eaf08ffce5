"""The decode sweep (`bench.py --decode`): KV-cache attention at memory bandwidth.

  python3 bench/bench.py --decode --out /tmp/decode                 # the whole sweep, < 4 min
  python3 bench/bench.py --decode --decode-cases paged --impls fa4,flash-attn-4
  python3 bench/bench.py --decode --impls fa4 --decode-splits 0,1,2,4,8,16   # split tuning
  python3 bench/bench.py --decode --impls fa4,fa4-fp8cache --hdims 128         # FP8 KV cache
  python3 bench/bench.py --replot /tmp/decode/results.csv            # table + plot, no GPU

Cases (bf16, 32 q heads, cache_seqlens = the whole cache for every sequence):
- decode: 1 query token; (batch, KV) in (16, 8k), (64, 32k), (4, 128k); hd 128 and 64; 8 kv
  heads (GQA 4:1) and 4 (8:1);
- spec: 2, 4 and 8 causal query tokens (bottom-right aligned), batch 16, KV 8k, hd128, GQA 4:1;
- paged: page sizes 16 and 256 for (16, 8k) and (64, 32k), hd128, GQA 4:1, a shuffled page
  table over a pool of exactly batch · KV / page_size pages, each beside its unpaged decode case
  (the same K/V values, the same q: the paged pool is built from the dense cache).

GB/s counts the K and V bytes the case must read: batch · seqlen_k · kv_heads · (d + d_v) · 2,
whatever an implementation does internally (an SDPA that needs its kv heads expanded is still
credited with the nominal bytes, and says so in the note column).

FP8 KV cache (fa4-fp8cache, only when named in --impls): fa4.attention_with_kvcache on the same
cache quantized to e4m3 per (batch, kv head) by fa4.reference_fp8.quantize (k_descale /
v_descale), the same bf16 q. Its kv_bytes and GB/s count the bytes it reads, 1 per element
(kv_dtype e4m3); vs_bf16_cache is its tokens/s over fa4's (the bf16 cache, heuristic splits) at
the same case, i.e. fa4's ms over its ms, and its target is >= 1.8x there (the same GB/s on half
the bytes would be 2x). It is checked against the float32 reference on the dequantized cache.

Every implementation's output is first compared with a float32 reference (GQA and bottom-right
causal written out, chunked over the batch): beyond DECODE_TOLERANCE · max|ref| it is marked
failed and not timed. Timing as bench.py: triton's do_bench median, L2 flushed before each call.
Each call is timed eagerly, so where the host's launch cost per call exceeds the kernel's time
(small cases) the timing is the host's; --decode-graphs times a CUDA-graph replay of the call
instead (as serving engines run decode), and the note column says so (GRAPH_NOTE).

Robustness: the measuring runs in a worker process (bench_decode_run.py) under a supervisor
(this file). A Python exception is one row's `error:` status. A worker that dies (segfault,
sticky CUDA error) or stops making progress for --decode-step-timeout-s is replaced by a new
one that starts again at the case it was on, without the implementation that was running there
for the rest of that case family (decode / spec / paged16 / paged256); the row says why.

Outputs under --out: results.csv (the rows, written per case as measured, then rewritten with the
columns that compare rows: best peer, ratios, target), decode_gbps.png, and the printed table.
"""

from __future__ import annotations

import csv
import json
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

HEADS_Q = 32
DTYPE_BYTES = 2  # bf16
FP8_BYTES = 1  # e4m3: the FP8 cache's bytes per element
DECODE_SHAPES = ((16, 8192), (64, 32768), (4, 131072))  # (batch, seqlen_k)
HDIMS = (128, 64)
KV_HEADS = (8, 4)  # GQA 4:1 and 8:1 with 32 q heads
SPEC_SEQLENS_Q = (2, 4, 8)
SPEC_SHAPE = (16, 8192)
PAGE_SIZES = (16, 256)
PAGED_SHAPES = ((16, 8192), (64, 32768))
KINDS = ("decode", "spec", "paged")
IMPLS = ("fa4", "flash-attn-4", "sdpa-cudnn", "sdpa-flash")
OURS = "fa4"
# Only when named in --impls (the standard decode sweep's time budget stays as it was): fa4 on an
# e4m3 cache, compared with OURS on the bf16 cache; target TARGET_FP8_CACHE x its tokens/s.
FP8_CACHE = "fa4-fp8cache"
EXTRA_IMPLS = (FP8_CACHE,)
TARGET_FP8_CACHE = 1.8
# --decode-graphs: what each timed row's note ends with.
GRAPH_NOTE = "; timed as a CUDA-graph replay"
# The check before timing: max |out - ref| <= DECODE_TOLERANCE · max |ref|. Decode outputs are
# averages over thousands of keys (|out| ~ 0.02-0.1 for unit-normal inputs), so the standard
# sweep's absolute 2e-2 would pass anything; 2 % of the largest entry is ~5 bf16 half-ulps.
DECODE_TOLERANCE = 2e-2
# The decode targets (docs/perf.md, Decode): decode >= 1.05x the best peer, or >= 93 % of the
# datasheet HBM bandwidth where 1.05x the best peer is past it; spec-decode >= 1.05x
# flash-attn-4; paged >= 0.90x of the same case unpaged.
TARGET_RATIO = 1.05
TARGET_PEAK_FRAC = 0.93
TARGET_PAGED = 0.90
SPEC_PEER = "flash-attn-4"
MEMORY_CAP = 40e9  # bytes: no case's tensors may need more
FLUSH_BYTES = 256 * 2**20  # triton do_bench's L2 flush buffer
REF_CHUNK_BYTES = 2**30  # fp32 K+V of one reference chunk
# SDPA backends without GQA support get kv heads expanded (a copy) only up to this size.
EXPAND_CAP = 12e9
DEFAULT_BUDGET_S = 150.0  # no new flash-attn-4 JIT compile after this (decode defaults)
DEFAULT_STOP_S = 210.0  # no new case after this: the sweep stays under 4 minutes
MAX_RESTARTS = 6
# A worker still running this long after --stop-s (a case that started just before it and got
# slow, or a hang) is stopped: the sweep ends near stop_s + HARD_STOP_GRACE_S whatever happens.
HARD_STOP_GRACE_S = 30.0

CSV_FIELDS = (
    "impl case kind batch seqlen_q seqlen_k heads_q heads_kv hdim page_size causal num_splits "
    "kv_bytes ms gbps peak_frac best_peer best_peer_gbps ratio_best_peer vs_unpaged target "
    "max_abs_diff rel_diff status note gpu hbm_peak_gbps peak_extra_mib host_us sm_mhz "
    "clock_reasons ms_rounds kv_dtype vs_bf16_cache flush"
).split()
DERIVED = ("best_peer", "best_peer_gbps", "ratio_best_peer", "vs_unpaged", "target",
           "vs_bf16_cache")  # fmt: skip


@dataclass(frozen=True)
class Case:
    """One decode problem: q (batch, seqlen_q, heads_q, hdim); the cache (batch, seqlen_k,
    heads_kv, hdim) dense, or paged in pages of page_size rows."""

    kind: str
    batch: int
    seqlen_k: int
    seqlen_q: int
    heads_kv: int
    hdim: int
    page_size: int = 0
    causal: bool = False
    heads_q: int = HEADS_Q

    @property
    def hdim_v(self) -> int:
        return self.hdim

    @property
    def group(self) -> int:
        return self.heads_q // self.heads_kv

    @property
    def family(self) -> str:
        """What a crashed implementation is excluded from for the rest of the run."""
        return f"paged{self.page_size}" if self.page_size else self.kind

    @property
    def name(self) -> str:
        label = {"decode": "decode", "spec": f"spec{self.seqlen_q}"}.get(self.kind)
        label = label or f"paged{self.page_size}"
        return f"{label} b{self.batch} kv{_k(self.seqlen_k)} hd{self.hdim} gqa{self.group}"

    @property
    def kv_key(self) -> tuple:
        """Cases with one kv_key share the dense K/V tensors (and their values)."""
        return (self.batch, self.seqlen_k, self.heads_kv, self.hdim)

    @property
    def kv_bytes(self) -> int:
        return kv_bytes(self.batch, self.seqlen_k, self.heads_kv, self.hdim, self.hdim_v)

    @property
    def twin(self) -> Case | None:
        """The unpaged case a paged one is compared with."""
        if not self.page_size:
            return None
        return replace(self, kind="decode", page_size=0)

    def seed(self, base: int = 0) -> int:
        b, s, h, d = self.kv_key
        return base + (b * 1_000_003 + s) * 1009 + h * 31 + d

    def memory_bytes(self, fp8_cache: bool = False) -> int:
        """An upper estimate of the device memory the case needs at once: the dense cache, a
        paged pool of the same size, q / out / fp32 partial outputs for up to 128 splits, the
        reference's fp32 chunk and the L2 flush buffer; with fp8_cache also the e4m3 cache (and
        its pool), half the size, and the quantization's fp32 chunk."""
        q_bytes = self.batch * self.seqlen_q * self.heads_q * self.hdim * DTYPE_BYTES
        splits = 128 * self.batch * self.seqlen_q * self.heads_q * (self.hdim_v + 1) * 4
        pool = self.kv_bytes if self.page_size else 0
        fp8 = (self.kv_bytes + pool) // 2 + 2 * REF_CHUNK_BYTES if fp8_cache else 0
        return (self.kv_bytes + pool + 4 * q_bytes + splits + 2 * REF_CHUNK_BYTES + FLUSH_BYTES
                + fp8)  # fmt: skip


def kv_bytes(
    batch: int,
    seqlen_k: int,
    heads_kv: int,
    hdim: int,
    hdim_v: int | None = None,
    elem_bytes: int = DTYPE_BYTES,
):
    """The K and V bytes a decode call must read: batch · seqlen_k · kv_heads · (d + d_v) ·
    elem_bytes (2: bf16; 1: the FP8 cache)."""
    return batch * seqlen_k * heads_kv * (hdim + (hdim if hdim_v is None else hdim_v)) * elem_bytes


def is_fp8_cache(impl: str) -> bool:
    """fa4-fp8cache, or one of its forced split counts (fa4-fp8cache-splits<n>)."""
    return impl == FP8_CACHE or impl.startswith(FP8_CACHE + "-splits")


def impl_kv_bytes(impl: str, case: Case) -> int:
    """The K and V bytes impl reads at case: 1 byte per element for the FP8 cache."""
    if not is_fp8_cache(impl):
        return case.kv_bytes
    return kv_bytes(case.batch, case.seqlen_k, case.heads_kv, case.hdim, case.hdim_v, FP8_BYTES)


def cases(kinds=KINDS, hdims=None) -> list[Case]:
    """The sweep in run order: cases sharing a dense cache are adjacent (decode, then spec-decode,
    then the paged variants of that cache)."""
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        raise ValueError(f"unknown case kinds {bad}: choose from {', '.join(KINDS)}")
    out = []
    for batch, seqlen in DECODE_SHAPES:
        for hd in HDIMS:
            if hdims and hd not in hdims:
                continue
            for h_kv in KV_HEADS:
                base = Case("decode", batch, seqlen, 1, h_kv, hd)
                if "decode" in kinds:
                    out.append(base)
                if hd != 128 or h_kv != 8:
                    continue
                if "spec" in kinds and (batch, seqlen) == SPEC_SHAPE:
                    out += [replace(base, kind="spec", seqlen_q=s, causal=True)
                            for s in SPEC_SEQLENS_Q]  # fmt: skip
                if "paged" in kinds and (batch, seqlen) in PAGED_SHAPES:
                    out += [replace(base, kind="paged", page_size=p) for p in PAGE_SIZES]
    return out


def hbm_peak_gbps(device_name: str) -> float | None:
    """The datasheet HBM bandwidth (GB/s) of the device, from its name; None when unknown."""
    n = device_name.upper()
    if "H200" in n:
        return 4800.0
    if "H100" in n:
        if "PCIE" in n:
            return 2000.0
        if "NVL" in n:
            return 3900.0
        return 3350.0  # H100 SXM5 (80GB HBM3)
    if "H20" in n:
        return 4000.0
    return None


def splits_names(splits, base: str = OURS) -> list[tuple[str, int]]:
    """(impl name, num_splits) of fa4 (or of base, fa4-fp8cache) per --decode-splits value: 0
    (the heuristic) is the base name, n > 0 "<base>-splits<n>"."""
    return [(base if s == 0 else f"{base}-splits{s}", s) for s in splits]


def is_ours(impl: str) -> bool:
    return impl == OURS or impl.startswith(OURS + "-")


def parse_splits(text: str | None) -> tuple[int, ...]:
    if not text:
        return (0,)
    vals = tuple(int(t) for t in text.split(",") if t.strip())
    if not vals or any(v < 0 for v in vals) or len(set(vals)) != len(vals):
        raise ValueError(f"--decode-splits {text!r}: distinct integers >= 0 (0 = heuristic)")
    return vals


def _fmt(x, spec):
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def make_row(
    impl: str,
    case: Case,
    ms=None,
    status="ok",
    note="",
    num_splits=None,
    max_abs_diff=None,
    ref_max=None,
    gpu="",
    hbm_peak=None,
    peak_extra_mib=None,
    host_us=None,
    sm_mhz="",
    clock_reasons="",
    ms_rounds=(),
) -> dict:
    """A CSV row; the columns that compare rows (DERIVED) are filled by finalize(). kv_bytes
    and GB/s are the bytes impl reads (impl_kv_bytes)."""
    nbytes = impl_kv_bytes(impl, case)
    gbps = nbytes / (ms * 1e-3) / 1e9 if ms else None
    rel = max_abs_diff / ref_max if max_abs_diff is not None and ref_max else None
    row = dict.fromkeys(CSV_FIELDS, "")
    row.update(
        impl=impl, case=case.name, kind=case.kind, batch=case.batch, seqlen_q=case.seqlen_q,
        seqlen_k=case.seqlen_k, heads_q=case.heads_q, heads_kv=case.heads_kv, hdim=case.hdim,
        page_size=case.page_size, causal=int(case.causal),
        num_splits="" if num_splits is None else num_splits, kv_bytes=nbytes,
        ms=_fmt(ms, ".4f"), gbps=_fmt(gbps, ".1f"),
        peak_frac=_fmt(gbps / hbm_peak if gbps and hbm_peak else None, ".3f"),
        max_abs_diff=_fmt(max_abs_diff, ".2e"), rel_diff=_fmt(rel, ".2e"), status=status,
        note=note, gpu=gpu, hbm_peak_gbps=_fmt(hbm_peak, ".0f"),
        peak_extra_mib=_fmt(peak_extra_mib, ".1f"), host_us=_fmt(host_us, ".1f"), sm_mhz=sm_mhz,
        clock_reasons=clock_reasons, ms_rounds=" ".join(format(x, ".4f") for x in ms_rounds),
        kv_dtype="e4m3" if is_fp8_cache(impl) else "bf16",
    )  # fmt: skip
    return row


def _ms(row) -> float | None:
    ok = row.get("status", "").startswith("ok") and row.get("ms")
    return float(row["ms"]) if ok else None


def agrees(max_abs_diff: float, ref_max: float) -> bool:
    """The check before timing; NaN never agrees."""
    return max_abs_diff <= DECODE_TOLERANCE * ref_max + 1e-6


def _gbps(row) -> float | None:
    ok = row.get("status", "").startswith("ok") and row.get("gbps")
    return float(row["gbps"]) if ok else None


def finalize(rows: list[dict]) -> list[dict]:
    """Fills the DERIVED columns from the measured ones (in place; also returns rows): the best
    ok peer of each case and each fa4 row's ratio to it (spec-decode: to flash-attn-4, the
    issue's peer there), each paged row's GB/s over the same impl's at the unpaged case, and
    whether each fa4 row meets the decode target."""
    by_case: dict[str, dict[str, dict]] = {}
    for r in rows:
        by_case.setdefault(r["case"], {})[r["impl"]] = r
    for r in rows:
        for k in DERIVED:
            r[k] = ""
    for by in by_case.values():
        peers = [(g, i) for i, r in by.items() if not is_ours(i) and (g := _gbps(r)) is not None]
        best = max(peers, default=None)
        any_row = next(iter(by.values()))
        kind = any_row["kind"]
        for impl, r in by.items():
            if best:
                r["best_peer"], r["best_peer_gbps"] = best[1], f"{best[0]:.1f}"
            ours = _gbps(r)
            if not is_ours(impl) or ours is None:
                continue
            if best:
                r["ratio_best_peer"] = f"{ours / best[0]:.3f}"
            if kind == "decode":
                r["target"] = _decode_target(ours, best, r.get("hbm_peak_gbps"))
            elif kind == "spec":
                peer = _gbps(by[SPEC_PEER]) if SPEC_PEER in by else None
                r["target"] = _verdict(ours / peer >= TARGET_RATIO) if peer else "n/a (no peer)"
        if kind == "paged":
            twin = _twin_name(any_row)
            for impl, r in by.items():
                base = by_case.get(twin, {}).get(impl)
                g, g0 = _gbps(r), _gbps(base) if base else None
                if g is not None and g0:
                    r["vs_unpaged"] = f"{g / g0:.3f}"
                    if is_ours(impl):
                        r["target"] = _verdict(g / g0 >= TARGET_PAGED)
                elif g is not None and is_ours(impl):
                    r["target"] = "n/a (no unpaged row)"
        _fp8_cache_columns(by)
    return rows


def _fp8_cache_columns(by: dict[str, dict]) -> None:
    """The FP8 cache's row of one case: tokens/s over fa4's on the bf16 cache (the same tokens:
    fa4's ms over its ms) and its target, >= TARGET_FP8_CACHE x (replacing the decode target:
    its GB/s counts half the bytes of its peers')."""
    for impl, r in by.items():
        ms = _ms(r)
        if not is_fp8_cache(impl) or ms is None:
            continue
        base = _ms(by[OURS]) if OURS in by else None
        if base is None:
            r["target"] = f"n/a (no ok {OURS} bf16-cache row)"
            continue
        ratio = base / ms
        r["vs_bf16_cache"] = f"{ratio:.3f}"
        r["target"] = _verdict(ratio >= TARGET_FP8_CACHE) + f" ({TARGET_FP8_CACHE}x {OURS})"


def _verdict(ok: bool) -> str:
    return "met" if ok else "missed"


def _decode_target(ours: float, best, hbm_peak: str) -> str:
    peak = float(hbm_peak) if hbm_peak else None
    if best is None:
        if peak:
            return _verdict(ours >= TARGET_PEAK_FRAC * peak) + " (no peer: 93 % of peak)"
        return "n/a (no peer)"
    if peak and TARGET_RATIO * best[0] > peak:
        return _verdict(ours >= TARGET_PEAK_FRAC * peak) + " (93 % of peak)"
    return _verdict(ours >= TARGET_RATIO * best[0])


def _twin_name(row: dict) -> str:
    hd, g = int(row["hdim"]), int(row["heads_q"]) // int(row["heads_kv"])
    return f"decode b{row['batch']} kv{_k(int(row['seqlen_k']))} hd{hd} gqa{g}"


def table(rows: list[dict]) -> str:
    """Markdown: GB/s per case per impl, the best peer, and for each fa4 row its ratio to the
    best peer, its fraction of the HBM peak, paged / unpaged, and the target."""
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    ours = [i for i in impls if is_ours(i)]
    by_case: dict[str, dict[str, dict]] = {}
    for r in rows:
        by_case.setdefault(r["case"], {})[r["impl"]] = r
    head = ["case", *impls, "best peer"]
    for o in ours:
        head += [f"{o} / best", f"{o} % peak", f"{o} paged / unpaged"]
        head += [f"{o} tokens/s / {OURS}"] if is_fp8_cache(o) else []
        head += [f"{o} target"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, by in by_case.items():
        vals = []
        for i in impls:
            r = by.get(i)
            g = _gbps(r) if r else None
            vals.append(f"{g:.0f}" if g is not None else ("-" if r is None else _short(r)))
        r0 = next(iter(by.values()))
        best = (
            f"{float(r0['best_peer_gbps']):.0f} ({r0['best_peer']})" if r0["best_peer"] else "n/a"
        )
        vals.append(best)
        for o in ours:
            r = by.get(o, {})
            frac = f"{100 * float(r['peak_frac']):.1f}" if r.get("peak_frac") else "n/a"
            vals += [r.get("ratio_best_peer") or "n/a", frac, r.get("vs_unpaged") or ""]
            vals += [r.get("vs_bf16_cache") or "n/a"] if is_fp8_cache(o) else []
            vals += [r.get("target") or ""]
        lines.append("| " + " | ".join([name, *vals]) + " |")
    return "\n".join(lines)


def target_summary(rows: list[dict]) -> list[str]:
    """One line per fa4 impl and case kind: how many of its points meet the decode target."""
    out = []
    impls = list(dict.fromkeys(r["impl"] for r in rows if is_ours(r["impl"])))
    for impl in impls:
        for kind in KINDS:
            rs = [r for r in rows if r["impl"] == impl and r["kind"] == kind]
            if not rs:
                continue
            met = [r for r in rs if r["target"].startswith("met")]
            missed = [r["case"] for r in rs if not r["target"].startswith("met")]
            line = f"{impl} {kind}: target met at {len(met)} of {len(rs)} points"
            out.append(line + (f"; not at: {', '.join(missed)}" if missed else ""))
    notes = sorted({(r["impl"], r["note"]) for r in rows if r["note"]})
    out += [f"note {impl}: {note}" for impl, note in notes]
    return out


def report(rows: list[dict], out: Path | None, title: str = "") -> None:
    rows = finalize(rows)
    print("\n### decode: GB/s of K and V read (bf16; ratio = fa4 / best peer)\n")
    print(table(rows))
    print()
    for line in target_summary(rows):
        print(line)
    print(
        f"targets: decode >= {TARGET_RATIO}x the best peer, or >= "
        f"{TARGET_PEAK_FRAC:.0%} of the HBM peak where {TARGET_RATIO}x the best peer is past it; "
        f"spec-decode >= {TARGET_RATIO}x {SPEC_PEER}; paged >= {TARGET_PAGED}x the same case "
        "unpaged (fa4 / best in the table is against the best peer of every kind)"
    )
    timed = [r for r in rows if r["ms"]]
    graphs = sum(r["note"].endswith(GRAPH_NOTE) for r in timed)
    if graphs:
        print(
            f"timing: CUDA-graph replays (--decode-graphs; {graphs} of {len(timed)} timed "
            "rows): the host's launch cost is left out, as in a serving engine's decode step"
        )
    if any(is_fp8_cache(r["impl"]) for r in rows):
        print(
            f"{FP8_CACHE}: e4m3 cache, GB/s of the bytes it reads (1 per element); tokens/s / "
            f"{OURS} = {OURS}'s ms (bf16 cache) over its ms at the same case; target >= "
            f"{TARGET_FP8_CACHE}x"
        )
    bad: dict[tuple, list] = {}
    for r in rows:
        if not _gbps(r):
            bad.setdefault((r["impl"], r["status"]), []).append(r["case"])
    for (impl, status), where in sorted(bad.items()):
        at = where[0] if len(where) == 1 else f"{len(where)} cases"
        print(f"{impl} at {at}: {status}")
    if out is not None:
        try:
            from bench_plot import plot_decode

            png = plot_decode(rows, out / "decode_gbps.png", title)
            if png:
                print(f"\nplot: {png}")
        except Exception as e:  # noqa: BLE001
            print(f"\nplot failed: {type(e).__name__}: {e}")


def is_decode_csv(path: Path) -> bool:
    with open(path, newline="") as f:
        return "case" in (next(csv.reader(f), None) or [])


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def write_csv(path: Path, rows: list[dict]) -> None:
    tmp = Path(str(path) + ".tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    os.replace(tmp, path)


def append_rows(path: Path, rows: list[dict]) -> None:
    """Appends rows to the CSV (its header written by the supervisor) and flushes them."""
    with open(path, "a", newline="") as f:
        csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore").writerows(rows)


def _short(row) -> str:
    return row["status"].split(":")[0]  # skipped / failed / error


def _k(s: int) -> str:
    return f"{s // 1024}k" if s % 1024 == 0 else str(s)


# ---- the supervisor ----------------------------------------------------------------------


def config(args) -> dict:
    """The sweep's settings from bench.py's arguments (pure; raises ValueError on bad ones)."""
    from bench_util import parse_ints, parse_names

    kinds = parse_names(args.decode_cases, KINDS)
    hdims = parse_ints(args.hdims, HDIMS)
    bad = [h for h in hdims if h not in HDIMS]
    if bad:
        raise ValueError(f"--hdims {bad}: the decode sweep has hd {HDIMS}")
    impls = parse_names(args.impls, IMPLS + EXTRA_IMPLS) if args.impls else IMPLS
    splits = parse_splits(args.decode_splits)
    if getattr(args, "decode_graphs", False) and getattr(args, "decode_value_checks", False):
        raise ValueError(
            "--decode-value-checks with --decode-graphs: fa4 skips its value checks while a "
            "CUDA graph is captured, so none would be timed"
        )
    todo = cases(kinds, hdims)
    if not todo:
        raise ValueError("no decode case selected")
    fp8 = any(is_fp8_cache(i) for i in impls)
    for c in todo:
        need = c.memory_bytes(fp8)
        if need > MEMORY_CAP:
            raise ValueError(f"{c.name} needs ~{need / 1e9:.1f} GB > 40 GB")
    return dict(cases=todo, impls=impls, splits=splits)


class Supervisor:
    """Runs workers until the sweep is done; replaces one that dies or hangs (see the module
    doc). The workers append rows to results.csv; the supervisor writes the crash rows."""

    def __init__(self, args, argv: list[str], worker_cmd=None):
        self.args, self.argv = args, argv
        self.out = Path(args.out)
        self.cfg = config(args)
        self.csv = self.out / "results.csv"
        self.state_path = self.out / "decode_state.json"
        self.progress_path = self.out / "decode_progress.json"
        self.worker_cmd = worker_cmd or [sys.executable, str(Path(__file__).with_name("bench.py"))]
        self.t0 = time.time()
        self.state = {"start": 0, "exclude": [], "t0": self.t0}
        self.proc: subprocess.Popen | None = None

    def elapsed(self) -> float:
        return time.time() - self.t0

    def run(self) -> int:
        self.out.mkdir(parents=True, exist_ok=True)
        write_csv(self.csv, [])
        old = signal.signal(signal.SIGTERM, self._term)
        try:
            self._loop()
        except KeyboardInterrupt:
            print("interrupted: reporting the rows measured so far", flush=True)
        finally:
            self._stop_worker()
            signal.signal(signal.SIGTERM, old)
            rows = read_csv(self.csv)
            write_csv(self.csv, finalize(rows))
            gpu = next((r["gpu"] for r in rows if r["gpu"]), "")
            report(rows, self.out, gpu)
            print(f"\n{len(rows)} rows in {self.csv} after {self.elapsed():.0f} s", flush=True)
        return 0

    def _term(self, signum, frame):
        raise KeyboardInterrupt

    def _loop(self) -> None:
        restarts = 0
        while True:
            self.progress_path.unlink(missing_ok=True)
            tmp = self.state_path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.state))
            os.replace(tmp, self.state_path)
            cmd = [*self.worker_cmd, *self.argv, "--decode-worker", str(self.state_path)]
            self.proc = subprocess.Popen(cmd)
            rc, hung = self._wait()
            self.proc = None
            if rc == 0:
                return
            if hung is None:
                late = f"--stop-s + {HARD_STOP_GRACE_S:g} s"
                print(f"decode: the worker ran past {late} and was stopped (its case's rows "
                      "are kept if it could still write them)")  # fmt: skip
                return
            prog = self._progress()
            if prog is None or prog.get("case") is None:
                print(f"decode worker exited with {rc} before measuring anything: stopping")
                return
            idx, impl = prog["case"], prog.get("impl")
            case = self.cfg["cases"][idx]
            how = (
                f"hung (no progress for {self.args.decode_step_timeout_s:g} s)"
                if hung
                else (f"died ({_rc_text(rc)})")
            )
            restarts += 1
            if impl is None:
                print(f"decode worker {how} setting up {case.name}: that case is skipped")
                self.state["start"] = idx + 1
            else:
                why = f"error: the worker {how} in {impl} at {case.name}"
                why += f": {prog['error']}" if prog.get("error") else ""
                print(why, flush=True)
                append_rows(self.csv, [make_row(impl, case, status=why)])
                self.state["exclude"].append(
                    {"impl": impl, "family": case.family, "case": idx, "why": why}
                )
                self.state["start"] = idx
            if restarts > MAX_RESTARTS or self.elapsed() > self.args.stop_s:
                print(f"decode: not restarting (restarts {restarts}, {self.elapsed():.0f} s)")
                return
            if self.state["start"] >= len(self.cfg["cases"]):
                return
            print(f"decode: new worker from case {self.state['start']}", flush=True)

    def _wait(self) -> tuple[int, bool | None]:
        """(the worker's exit status, whether it hung); hung None: stopped at the hard stop."""
        last = time.time()
        seen = None
        while True:
            if self.elapsed() > self.args.stop_s + HARD_STOP_GRACE_S:
                self._stop_worker()
                return (self.proc.returncode if self.proc else -9), None
            try:
                return self.proc.wait(timeout=1.0), False
            except subprocess.TimeoutExpired:
                pass
            try:
                m = self.progress_path.stat().st_mtime
            except FileNotFoundError:
                m = None
            if m != seen:
                seen, last = m, time.time()
            if time.time() - last > self.args.decode_step_timeout_s:
                self._stop_worker()
                return self.proc.returncode if self.proc else -9, True

    def _progress(self) -> dict | None:
        try:
            return json.loads(self.progress_path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def _stop_worker(self) -> None:
        p = self.proc
        if p is None or p.poll() is not None:
            return
        p.terminate()  # the worker reports its case's rows on SIGTERM
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()  # a hung kernel: SIGTERM is not handled until it returns
            p.wait()


def _rc_text(rc: int) -> str:
    if rc < 0:
        try:
            return f"signal {signal.Signals(-rc).name}"
        except ValueError:
            return f"signal {-rc}"
    return f"exit status {rc}"


def main(args, argv: list[str]) -> int:
    """bench.py --decode: the supervisor, or with --decode-worker the worker."""
    if args.decode_worker:
        import bench_decode_run

        _exit_with_parent()
        return bench_decode_run.worker(args, config(args), Path(args.decode_worker))
    try:
        Supervisor(args, worker_argv(argv)).run()
    except ValueError as e:
        print(f"bench --decode: {e}")
        return 2
    return 0


def _exit_with_parent() -> None:
    """A worker whose supervisor is gone (killed without a chance to stop it) exits too, even
    while its main thread waits on the GPU."""
    import threading

    parent = os.getppid()

    def watch():
        while os.getppid() == parent:
            time.sleep(2.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def worker_argv(argv: list[str]) -> list[str]:
    """The supervisor's arguments as the worker gets them (any --decode-worker removed)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == "--decode-worker":
            skip = True
            continue
        if a.startswith("--decode-worker="):
            continue
        out.append(a)
    return out

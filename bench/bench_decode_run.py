"""The decode sweep's worker (bench.py --decode, started by bench_decode.Supervisor): inputs,
the float32 reference, the implementations, the check, the timing. Needs torch; the GPU parts
run only in worker(); the rest also runs on CPU tensors (tests/tools/test_bench_decode.py).

The implementations, each called as a serving engine would call it on a full KV cache:
- fa4: fa4.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens (int32 tensor), causal,
  page_table, num_splits, backend="sm90"); one row per --decode-splits value (0 = heuristic).
  Its value checks (one host sync a call) run in the checked first call and are skipped while
  timed, as under CUDA-graph capture (--decode-value-checks times them too).
- fa4-fp8cache (only when named in --impls): the same call on the cache quantized to e4m3 per
  (batch, kv head) (quantize_cache: fa4.reference_fp8.quantize, chunked over the batch; the paged
  pools hold the e4m3 cache under the same page table), k_descale / v_descale, heuristic splits;
  checked against the float32 reference on the dequantized cache.
- flash-attn-4 (flash_attn.cute 4.0.0b36): dense flash_attn_func(q, k, v, causal) on the whole
  cache; paged flash_attn_varlen_func(q (b, s_q, h, d), k_pages, v_pages, seqused_k=...,
  page_table=..., causal). num_splits stays 1: its SM90 forward asserts "SplitKV not
  supported on SM 9.0".
- sdpa-cudnn / sdpa-flash: torch SDPA under one backend on (b, h, s, d) views of the cache,
  enable_gqa=True; spec-decode's causal mask is torch's causal_lower_right (CausalBias: the flash
  backend gets FA2's bottom-right causal, other backends a materialized mask). Where a backend
  refuses GQA, kv heads are expanded by a copy made before timing (up to EXPAND_CAP bytes), and
  GB/s still counts the nominal bytes. Dense cases only.

With --decode-graphs each variant's timed call is captured in a CUDA graph after the checked
first call (bench_impls.graph_replay), the first replay is checked against the reference too, and
the replay is what is timed (do_bench, L2 flushed before each replay) and its host µs measured;
a capture that raises is the row's error status. The graph is freed after timing and captured
again for each later round (--rounds).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import bench_decode as bd
import bench_util as bu
import torch
import torch.nn.functional as F

# Messages of CUDA errors after which the context is unusable.
STICKY = (
    "illegal memory access",
    "unspecified launch failure",
    "illegal instruction",
    "misaligned address",
    "device-side assert",
    "CUDA error: launch failure",
)


class Variant:
    """One way of calling an implementation on a case: fn() -> out, the call timed; check_fn,
    the call checked against the reference (fn when None); to_bshd(out) -> (b, s_q, h, d_v);
    note: what the CSV's note column says; keep: tensors it needs alive."""

    def __init__(self, fn, note: str, to_bshd=None, keep=(), check_fn=None):
        self.fn, self.note, self.keep = fn, note, keep
        self.check_fn = check_fn or fn
        self.to_bshd = to_bshd or (lambda t: t)


def _first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


class Impl:
    name = "?"
    jit = False
    num_splits = None

    def skip_reason(self, case) -> str | None:
        return None

    def context(self):
        return contextlib.nullcontext()

    def jit_key(self, case) -> tuple:
        return (self.name, case.hdim, case.group, case.seqlen_q, case.causal, case.page_size)

    def variants(self, case, t):
        """Variants to try in order until one runs (a generator: each is built when needed)."""
        raise NotImplementedError


class Fa4(Impl):
    def __init__(self, name="fa4", num_splits=0, value_checks=False, fp8_cache=False):
        self.name, self.num_splits, self.value_checks = name, num_splits, value_checks
        self.fp8_cache = fp8_cache  # the e4m3 cache (t.k8, t.v8 and their descales)
        self.reason = None
        try:
            import fa4

            self._fa4 = fa4
        except Exception as e:  # noqa: BLE001
            self.reason = f"fa4 not importable ({type(e).__name__}: {e})"
            return
        if not hasattr(fa4, "attention_with_kvcache"):
            self.reason = "this fa4 has no attention_with_kvcache (the inference API)"

    def skip_reason(self, case):
        if self.reason:
            return self.reason
        if torch.cuda.get_device_capability() != (9, 0):
            return "not an SM90 device"
        try:
            from fa4 import build_info

            built, why = build_info.CONFIG.get("built"), build_info.CONFIG.get("reason")
        except Exception:  # noqa: BLE001 - no build_info: let the call say
            built = True
        # Which kernel serves a decode case (the decode family or the sm90 forward) is the
        # dispatcher's choice: a head dim it cannot run is the call's error row, not a skip.
        return None if built else f"the CUDA extension was not built: {why}"

    def variants(self, case, t):
        f, n = self._fa4.attention_with_kvcache, self.num_splits
        kw = {}
        if self.fp8_cache:
            kc, vc = (t.k8_pool, t.v8_pool) if case.page_size else (t.k8, t.v8)
            kw = dict(k_descale=t.k_descale, v_descale=t.v_descale)
        else:
            kc, vc = (t.k_pool, t.v_pool) if case.page_size else (t.k, t.v)
        pt = t.page_table if case.page_size else None

        def checked():
            return _first(f(t.q, kc, vc, t.cache_seqlens, causal=case.causal, page_table=pt,
                            num_splits=n, backend="sm90", **kw))  # fmt: skip

        splits = "heuristic" if n == 0 else str(n)
        note = f"attention_with_kvcache(cache_seqlens int32 tensor, num_splits={n} ({splits}))"
        if self.fp8_cache:
            note += "; e4m3 cache, k_descale / v_descale (b, h_kv)"
        skip = getattr(getattr(self._fa4, "value_checks", None), "values_checked", None)
        if self.value_checks or skip is None:
            yield Variant(checked, note + "; value checks on while timed (a host sync a call)")
            return

        def fn():
            with skip():
                return checked()

        # The value checks (cache_seqlens, page_table entries in range) copy the index tensors
        # to the host: one device sync a call, which leaves the GPU idle between do_bench's
        # launches. Serving engines replay decode in CUDA graphs, where fa4 skips them, as do
        # the timed calls here; the first (checked) call runs them.
        yield Variant(fn, note + "; value checks in the first call, skipped while timed (as "
                      "under CUDA-graph capture)", check_fn=checked)  # fmt: skip


class FlashAttn4(Impl):
    name = "flash-attn-4"
    jit = True
    num_splits = 1

    def __init__(self):
        self.reason = None
        try:
            from flash_attn.cute import flash_attn_func, flash_attn_varlen_func

            self._func, self._varlen = flash_attn_func, flash_attn_varlen_func
        except Exception as e:  # noqa: BLE001
            self.reason = f"not importable ({type(e).__name__}: {str(e)[:200]})"

    def skip_reason(self, case):
        return self.reason

    def variants(self, case, t):
        if case.page_size:
            yield Variant(
                lambda: _first(self._varlen(t.q, t.k_pool, t.v_pool, seqused_k=t.cache_seqlens,
                                            page_table=t.page_table, causal=case.causal)),
                "flash_attn_varlen_func(page_table, seqused_k); num_splits=1 (no split-KV on SM90)",
            )  # fmt: skip
        else:
            yield Variant(
                lambda: _first(self._func(t.q, t.k, t.v, causal=case.causal)),
                "flash_attn_func on the whole cache; num_splits=1 (no split-KV on SM90)",
            )


class Sdpa(Impl):
    """torch SDPA restricted to one backend."""

    def __init__(self, name, backend):
        self.name, self.backend = name, backend

    def context(self):
        from torch.nn.attention import sdpa_kernel

        return sdpa_kernel(self.backend)

    def skip_reason(self, case):
        return "dense only: SDPA has no paged KV cache" if case.page_size else None

    def variants(self, case, t):
        q, k, v = (x.transpose(1, 2) for x in (t.q, t.k, t.v))  # views, no copy
        mask, mask_note = None, ""
        if case.causal and case.seqlen_q > 1:
            from torch.nn.attention.bias import causal_lower_right

            mask = causal_lower_right(case.seqlen_q, case.seqlen_k)
            mask_note = "; causal as causal_lower_right (CausalBias)"

        def back(o):
            return o.transpose(1, 2)

        yield Variant(
            lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True),
            "enable_gqa=True" + mask_note,
            back,
        )
        need = bd.kv_bytes(case.batch, case.seqlen_k, case.heads_q, case.hdim, case.hdim_v)
        have = torch.cuda.memory_allocated() if t.q.is_cuda else 0
        if need > bd.EXPAND_CAP or have + need > bd.MEMORY_CAP:
            raise RuntimeError(
                f"no kv-head expansion: the copy would take {need / 1e9:.1f} GB "
                f"(cap {bd.EXPAND_CAP / 1e9:.0f} GB)"
            )
        ke = k.repeat_interleave(case.group, dim=1)
        ve = v.repeat_interleave(case.group, dim=1)
        yield Variant(
            lambda: F.scaled_dot_product_attention(q, ke, ve, attn_mask=mask),
            f"kv heads expanded x{case.group} before timing (copy untimed; GB/s counts the "
            f"nominal {case.heads_kv}-head bytes)" + mask_note,
            back,
            keep=(ke, ve),
        )


def make_impls(names, splits, value_checks=False) -> list[Impl]:
    from torch.nn.attention import SDPBackend

    out: list[Impl] = []
    for n in names:
        if n == "fa4":
            out += [Fa4(name, s, value_checks) for name, s in bd.splits_names(splits)]
        elif n == bd.FP8_CACHE:
            out += [
                Fa4(name, s, value_checks, fp8_cache=True)
                for name, s in bd.splits_names(splits, bd.FP8_CACHE)
            ]
        elif n == "flash-attn-4":
            out.append(FlashAttn4())
        elif n == "sdpa-cudnn":
            out.append(Sdpa(n, SDPBackend.CUDNN_ATTENTION))
        elif n == "sdpa-flash":
            out.append(Sdpa(n, SDPBackend.FLASH_ATTENTION))
        else:
            raise ValueError(n)
    return out


# ---- inputs and the reference -------------------------------------------------------------


def dense_kv(case, seed: int, device="cuda"):
    """k, v: (batch, seqlen_k, heads_kv, d) bf16, standard normal, from the case's cache seed."""
    g = torch.Generator(device=device).manual_seed(seed)
    shape = (case.batch, case.seqlen_k, case.heads_kv, case.hdim)
    k = torch.randn(shape, generator=g, device=device, dtype=torch.bfloat16)
    v = torch.randn(shape[:-1] + (case.hdim_v,), generator=g, device=device, dtype=torch.bfloat16)
    return k, v


def case_inputs(case, k, v, seed: int, device="cuda"):
    """q (seeded by the cache and seqlen_q: a paged case gets its twin's q), cache_seqlens (the
    whole cache, int32), and for a paged case a shuffled page table and the pools built from the
    dense cache: key j of sequence b is row j % page_size of page page_table[b, j // page_size]."""
    g = torch.Generator(device=device).manual_seed(seed + 7919 * case.seqlen_q)
    q = torch.randn((case.batch, case.seqlen_q, case.heads_q, case.hdim), generator=g,
                    device=device, dtype=torch.bfloat16)  # fmt: skip
    seqlens = torch.full((case.batch,), case.seqlen_k, dtype=torch.int32, device=device)
    t = SimpleNamespace(q=q, k=k, v=v, cache_seqlens=seqlens, page_table=None, k_pool=None,
                        v_pool=None)  # fmt: skip
    if case.page_size:
        t.page_table, t.k_pool, t.v_pool = paged(k, v, case.page_size, seed + case.page_size)
    return t


def paged(k, v, page_size: int, seed: int):
    """(page_table int32 (b, pages), k_pool, v_pool (b · pages, page_size, h_kv, d)) holding
    the dense cache k, v in shuffled pages; the table depends on (b, pages, seed) only, so an
    e4m3 cache paged with the same seed gets the bf16 cache's table (copied as bytes)."""
    b, s = k.shape[:2]
    if s % page_size:
        raise ValueError(f"seqlen_k {s} is not a multiple of page size {page_size}")
    pages = s // page_size
    perm = torch.randperm(b * pages, generator=torch.Generator().manual_seed(seed))
    table = perm.to(device=k.device, dtype=torch.int32).view(b, pages).contiguous()
    idx = table.flatten().long()
    pools = []
    for x in (k, v):
        raw = x.view(torch.uint8) if x.element_size() == 1 else x  # e4m3: copy the bytes
        pool = torch.empty((b * pages, page_size, *x.shape[2:]), dtype=raw.dtype, device=x.device)
        pool.index_copy_(0, idx, raw.reshape(b * pages, page_size, *x.shape[2:]))
        pools.append(pool.view(x.dtype))
    return table, pools[0], pools[1]


def quantize_cache(x, heads_kv: int, chunk_bytes: int = bd.REF_CHUNK_BYTES):
    """(e4m3 cache, descale float32 (b, heads_kv)) of x (b, s, h_kv, d): fa4.reference_fp8's
    quantize, a batch chunk at a time (its fp32 copies of a whole 64 x 32k cache would take
    ~17 GB; per (batch, kv head) scaling makes the chunks' results those of one call)."""
    from fa4.reference_fp8 import quantize

    b = x.shape[0]
    per = max(1, chunk_bytes // max(1, x[0].numel() * 4))
    x8 = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    descale = torch.empty((b, heads_kv), dtype=torch.float32, device=x.device)
    for i in range(0, b, per):
        x8[i : i + per], descale[i : i + per] = quantize(x[i : i + per], heads_kv)
    return x8, descale


def add_fp8_cache(case, t, fp8, seed: int) -> None:
    """Puts the e4m3 cache fp8 = (k8, v8, k_descale, v_descale) into t (t.k8, t.v8,
    t.k_descale, t.v_descale), and for a paged case its pools under t's page table."""
    t.k8, t.v8, t.k_descale, t.v_descale = fp8
    t.k8_pool = t.v8_pool = None
    if case.page_size:
        table, t.k8_pool, t.v8_pool = paged(t.k8, t.v8, case.page_size, seed + case.page_size)
        assert torch.equal(table, t.page_table), "the e4m3 pools' table is the bf16 pools'"


def reference(q, k, v, causal: bool, chunk_bytes: int = bd.REF_CHUNK_BYTES, k_descale=None,
              v_descale=None):  # fmt: skip
    """out (b, s_q, h, d_v) float32: softmax(q k^T / sqrt(d)) v in float32, q head i reading kv
    head i // (h / h_kv), causal bottom-right aligned (query i sees keys j <= i + s_k - s_q);
    chunked over the batch so the fp32 copies of K and V stay near chunk_bytes. k_descale /
    v_descale (b, h_kv): an e4m3 cache's true values, stored x descale."""
    b, s_q, h, d = q.shape
    s_k, h_kv, dv = k.shape[1], k.shape[2], v.shape[-1]
    g = h // h_kv
    per = max(1, chunk_bytes // max(1, s_k * h_kv * (d + dv) * 4))
    out = torch.empty((b, s_q, h, dv), dtype=torch.float32, device=q.device)
    for i in range(0, b, per):
        n = min(per, b - i)
        qf = q[i : i + n].float().view(n, s_q, h_kv, g, d)
        kf, vf = k[i : i + n].float(), v[i : i + n].float()
        if k_descale is not None:
            kf *= k_descale[i : i + n, None, :, None]
        if v_descale is not None:
            vf *= v_descale[i : i + n, None, :, None]
        s = torch.einsum("bqhgd,bkhd->bhgqk", qf, kf) * d**-0.5
        if causal:
            rows = torch.arange(s_q, device=q.device)[:, None]
            cols = torch.arange(s_k, device=q.device)[None, :]
            s = s.masked_fill(cols > rows + (s_k - s_q), float("-inf"))
        p = torch.softmax(s, dim=-1)
        o = torch.einsum("bhgqk,bkhd->bqhgd", p, vf)
        out[i : i + n] = o.reshape(n, s_q, h, dv)
        del qf, kf, vf, s, p, o
    return out


def compare(out, ref) -> tuple[float, float]:
    """(max |out - ref|, max |ref|); NaN propagates into the first."""
    if tuple(out.shape) != tuple(ref.shape):
        raise ValueError(f"output shape {tuple(out.shape)} != {tuple(ref.shape)}")
    d = (out.float() - ref).abs().max().item()
    return d, ref.abs().max().item()


# ---- measuring ------------------------------------------------------------------------------


class StickyCudaError(Exception):
    """A CUDA error that leaves the context unusable: the worker must be replaced."""


def _err(e: BaseException) -> str:
    msg = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
    return f"{type(e).__name__}: {msg}"


def _is_sticky(e: BaseException) -> bool:
    s = str(e)
    return any(m in s for m in STICKY)


class Timed:
    def __init__(self, impl, var, diff, ref_max, mem, host):
        self.impl, self.var = impl, var
        self.diff, self.ref_max, self.mem, self.host = diff, ref_max, mem, host
        self.ms: list[float] = []
        self.mhz: list[str] = []
        self.why: list[str] = []

    def add(self, ms, mhz, why):
        self.ms.append(ms)
        self.mhz.append(mhz)
        self.why.append(why)

    def row(self, case, gpu, peak) -> dict:
        reasons = 0
        for w in self.why:
            reasons |= int(w, 16) if w else 0
        return bd.make_row(
            self.impl.name, case, ms=statistics.median(self.ms), note=self.var.note,
            num_splits=self.impl.num_splits, max_abs_diff=self.diff, ref_max=self.ref_max,
            gpu=gpu, hbm_peak=peak, peak_extra_mib=self.mem, host_us=self.host,
            sm_mhz=" ".join(m for m in self.mhz if m),
            clock_reasons=hex(reasons) if any(self.why) else "", ms_rounds=self.ms,
        )  # fmt: skip


def measure(bi, impl, case, t, ref, args, sync) -> Timed | dict:
    """Check, then time one implementation at one case: a Timed, or the row of its failure.
    Raises StickyCudaError when the CUDA context is lost."""
    errors = []
    with impl.context():
        gen = impl.variants(case, t)
        while True:
            try:
                var = next(gen)
            except StopIteration:
                break
            except Exception as e:  # noqa: BLE001 - building the next variant failed
                errors.append(_err(e))
                break
            try:
                t0 = time.perf_counter()
                out = var.to_bshd(var.check_fn())
                sync()
                first = time.perf_counter() - t0
                diff, ref_max = compare(out, ref)
                del out
            except Exception as e:  # noqa: BLE001
                if _is_sticky(e):
                    raise StickyCudaError(_err(e)) from e
                errors.append(f"[{var.note}] {_err(e)}")
                del var
                _free()
                continue
            print(f"    {impl.name}: first call {first:.2f} s (incl. any JIT)", flush=True)
            if not bd.agrees(diff, ref_max):
                bound = f"{bd.DECODE_TOLERANCE}·max|ref| = {bd.DECODE_TOLERANCE * ref_max:.3g}"
                return bd.make_row(impl.name, case, status=f"failed: max_abs_diff {diff:.3g} > "
                                   f"{bound}", note=var.note, num_splits=impl.num_splits,
                                   max_abs_diff=diff, ref_max=ref_max)  # fmt: skip
            replay = None
            try:
                if getattr(args, "decode_graphs", False):
                    replay = _capture(bi, var, ref)
                    if isinstance(replay, str):
                        return bd.make_row(impl.name, case, status=replay, note=var.note,
                                           num_splits=impl.num_splits, max_abs_diff=diff,
                                           ref_max=ref_max)  # fmt: skip
                    var.note += bd.GRAPH_NOTE
                timing = dict(warmup_ms=args.warmup_ms, rep_ms=args.rep_ms)
                # peak_extra_mib: the eager call's workspace (a replay allocates nothing).
                (mem, ms, host), mhz, why = bi.clocked(
                    lambda v=var, f=var.fn if replay is None else replay, tm=timing: (
                        bi.peak_extra_mib(v.fn), bi.time_ms(f, **tm), bi.host_us(f))
                )  # fmt: skip
            except Exception as e:  # noqa: BLE001
                if _is_sticky(e):
                    raise StickyCudaError(_err(e)) from e
                replay = None
                _free()
                return bd.make_row(impl.name, case, status=f"error: timing: {_err(e)}",
                                   note=var.note, num_splits=impl.num_splits, max_abs_diff=diff,
                                   ref_max=ref_max)  # fmt: skip
            if replay is not None:
                replay = None  # the graph and its memory pool (captured again for later rounds)
                _free()
            timed = Timed(impl, var, diff, ref_max, mem, host)
            timed.add(ms, mhz, why)
            return timed
    return bd.make_row(impl.name, case, status="error: " + ("; ".join(errors) or "no variant"),
                       num_splits=impl.num_splits)  # fmt: skip


def _capture(bi, var, ref):
    """var.fn captured as a CUDA graph (bi.graph_replay), its first replay checked against the
    reference like the eager first call: the replay, or the error status of a capture that
    raises or a replay that disagrees. Raises StickyCudaError when the CUDA context is lost."""
    try:
        replay = bi.graph_replay(var.fn)
        diff, ref_max = compare(var.to_bshd(replay()), ref)
    except Exception as e:  # noqa: BLE001
        if _is_sticky(e):
            raise StickyCudaError(_err(e)) from e
        _free()
        return f"error: CUDA-graph capture failed: {_err(e)}"
    if not bd.agrees(diff, ref_max):
        del replay
        _free()
        bound = f"{bd.DECODE_TOLERANCE}·max|ref| = {bd.DECODE_TOLERANCE * ref_max:.3g}"
        return f"failed: the CUDA-graph replay's max_abs_diff {diff:.3g} > {bound}"
    return replay


def retime(bi, t: Timed, args) -> None:
    graphs = getattr(args, "decode_graphs", False)
    with t.impl.context():
        fn = None
        try:
            fn = bi.graph_replay(t.var.fn) if graphs else t.var.fn
            ms, mhz, why = bi.clocked(
                lambda: bi.time_ms(fn, warmup_ms=args.warmup_ms, rep_ms=args.rep_ms)
            )
        except Exception as e:  # noqa: BLE001
            if _is_sticky(e):
                raise StickyCudaError(_err(e)) from e
            print(f"    {t.impl.name}: a later round failed: {_err(e)}", flush=True)
            return
        finally:
            if graphs:
                fn = None
                _free()
    t.add(ms, mhz, why)


def _free():
    import gc

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _write_progress(path: Path, **kw) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({**kw, "t": time.time()}))
    os.replace(tmp, path)


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def worker(args, cfg: dict, state_path: Path, bi=None) -> int:
    """Measures cfg's cases from state["start"] on, appending each case's rows to results.csv
    when the case is done; exits 3 (progress file naming the impl) on a lost CUDA context."""
    state = json.loads(Path(state_path).read_text())
    out = Path(args.out)
    csv_path, progress = out / "results.csv", out / "decode_progress.json"
    t0 = state["t0"]

    def elapsed():
        return time.time() - t0

    if not torch.cuda.is_available():
        print("bench --decode: needs a CUDA device")
        return 2
    if bi is None:
        import bench_impls as bi
    bi.set_flush(getattr(args, "flush", "zero"))
    first_worker = state["start"] == 0 and not state["exclude"]
    if first_worker:
        print("\n".join(bi.environment()))
        print("command:", " ".join(sys.argv))
    gpu = torch.cuda.get_device_name()
    peak = args.hbm_gbps or bd.hbm_peak_gbps(gpu)
    how = "CUDA-graph replays" if getattr(args, "decode_graphs", False) else "eager calls"
    print(f"decode sweep on {gpu}: HBM peak {peak or 'unknown'} GB/s; "
          f"{len(cfg['cases'])} cases; timing {how}; worker from case {state['start']}",
          flush=True)  # fmt: skip
    impls = make_impls(cfg["impls"], cfg["splits"], args.decode_value_checks)
    excluded = {(x["impl"], x["family"]): x for x in state["exclude"]}
    compiled: set[tuple] = set()
    signal.signal(signal.SIGTERM, _interrupt)
    kv_key, k, v, res = None, None, None, None
    want_fp8 = any(getattr(i, "fp8_cache", False) for i in impls)
    fp8, fp8_err = None, None  # the e4m3 cache of the current kv_key, or why there is none
    torch.backends.cuda.matmul.allow_tf32 = False  # the fp32 reference stays fp32

    def sync():
        torch.cuda.synchronize()

    try:
        for idx in range(state["start"], len(cfg["cases"])):
            case = cfg["cases"][idx]
            if elapsed() > args.stop_s:
                left = len(cfg["cases"]) - idx
                print(f"--stop-s {args.stop_s:g} reached: {left} cases not run", flush=True)
                break
            _write_progress(progress, case=idx, impl=None)
            if case.kv_key != kv_key:
                k = v = fp8 = None
                _free()
                torch.cuda.reset_peak_memory_stats()
                k, v = dense_kv(case, case.seed(args.seed))
                kv_key = case.kv_key
                if want_fp8:
                    fp8, fp8_err = _fp8_cache(case, k, v)
            t = case_inputs(case, k, v, case.seed(args.seed))
            ref = reference(t.q, k, v, case.causal)
            ref8 = None
            if fp8 is not None:
                add_fp8_cache(case, t, fp8, case.seed(args.seed))
                ref8 = reference(t.q, t.k8, t.v8, case.causal, k_descale=t.k_descale,
                                 v_descale=t.v_descale)  # fmt: skip
            sync()
            print(f"[{elapsed():6.1f}s] {case.name}: {case.kv_bytes / 1e9:.2f} GB of K+V",
                  flush=True)  # fmt: skip
            rows: list[dict] = []
            timed: list[Timed] = []
            try:
                order = bu.rotated(impls, idx) if args.rotate_impls else impls
                for impl in order:
                    ex = excluded.get((impl.name, case.family))
                    if ex is not None:
                        if ex["case"] != idx:  # the crash case has the supervisor's row
                            why = "skipped: excluded after " + ex["why"].removeprefix("error: ")
                            rows.append(bd.make_row(impl.name, case, status=why))
                        continue
                    why = impl.skip_reason(case)
                    is_fp8 = getattr(impl, "fp8_cache", False)
                    if why is None and is_fp8 and fp8 is None:
                        why = f"no e4m3 cache: {fp8_err}"
                    key = impl.jit_key(case)
                    if (why is None and impl.jit and key not in compiled
                            and elapsed() > args.budget_s):  # fmt: skip
                        why = "time budget (--budget-s) spent before this config's JIT compile"
                    if why:
                        rows.append(bd.make_row(impl.name, case, status=f"skipped: {why}"))
                        continue
                    _write_progress(progress, case=idx, impl=impl.name)
                    res = measure(bi, impl, case, t, ref8 if is_fp8 else ref, args, sync)
                    compiled.add(key)
                    if isinstance(res, dict):
                        rows.append(res)
                    else:
                        timed.append(res)
                for r in range(1, args.rounds):
                    for impl in bu.rotated(impls, idx + r) if args.rotate_impls else impls:
                        for tm in timed:
                            if tm.impl is impl:
                                _write_progress(progress, case=idx, impl=impl.name)
                                retime(bi, tm, args)
            except StickyCudaError:
                rows = None  # this case is measured again by the next worker
                raise
            finally:
                if rows is not None:
                    _write_rows(
                        csv_path, rows, timed, impls, case, gpu, peak, elapsed(), bi.flush_mode()
                    )
            del t, ref, ref8, timed, rows
            res = None  # the last Timed holds this case's tensors
            last = idx + 1 == len(cfg["cases"]) or cfg["cases"][idx + 1].kv_key != kv_key
            if last:
                hi = torch.cuda.max_memory_allocated() / 1e9
                print(f"    device memory high-water for this cache: {hi:.1f} GB", flush=True)
    except StickyCudaError as e:
        # The context is gone: report through the progress file and leave without cleanup
        # (the rows of this case are not written; the next worker measures it again).
        prog = json.loads(progress.read_text())
        _write_progress(progress, **{**prog, "error": str(e)})
        print(f"lost the CUDA context in {prog.get('impl')}: {e}", flush=True)
        sys.stdout.flush()
        os._exit(3)
    except KeyboardInterrupt:
        print("interrupted: the rows measured so far are in results.csv", flush=True)
    return 0


def _fp8_cache(case, k, v):
    """((k8, v8, k_descale, v_descale), None), or (None, why) when it cannot be made."""
    try:
        k8, kd = quantize_cache(k, case.heads_kv)
        v8, vd = quantize_cache(v, case.heads_kv)
    except Exception as e:  # noqa: BLE001 - e.g. fa4 not importable: the row says why
        if _is_sticky(e):
            raise StickyCudaError(_err(e)) from e
        _free()
        return None, _err(e)
    return (k8, v8, kd, vd), None


def _write_rows(path, rows, timed, impls, case, gpu, peak, elapsed, flush) -> None:
    """Appends one case's rows to the CSV in the order of --impls, and prints them; flush: how
    time_ms emptied the L2 (bench_impls.set_flush)."""
    rows = rows + [tm.row(case, gpu, peak) for tm in timed]
    rank = {i.name: n for n, i in enumerate(impls)}
    rows.sort(key=lambda r: rank.get(r["impl"], len(rank)))
    for r in rows:
        r["gpu"], r["hbm_peak_gbps"], r["flush"] = gpu, bd._fmt(peak, ".0f"), flush
        _print_row(elapsed, r)
    bd.append_rows(path, rows)


def _print_row(elapsed: float, r: dict) -> None:
    tail = f"{r['ms']} ms {r['gbps']} GB/s" if r["ms"] else ""
    frac = f"({100 * float(r['peak_frac']):.0f} % of peak)" if r["peak_frac"] else ""
    diff = f"rel diff {r['rel_diff']}" if r["rel_diff"] else ""
    print(f"[{elapsed:6.1f}s] {r['impl']:<14} {r['case']}: {tail} {frac} {diff} {r['status']}",
          flush=True)  # fmt: skip

"""The implementations under test, and how one call is timed and its memory measured.

Needs torch with a CUDA device; triton is optional (CUDA events with an L2 flush otherwise).
Every implementation takes q, k, v, dout allocated once per point as (batch, seqlen, heads, d)
bf16 tensors; prepare() makes the views it wants outside anything timed.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import statistics
import time
from collections import Counter

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


class Impl:
    name = "?"
    jit = False  # True: compiles a kernel per new configuration on its first call (slow)

    def skip_reason(self, direction: str, hdim: int) -> str | None:
        return None

    def context(self):
        return contextlib.nullcontext()

    def prepare(self, q, k, v, dout):
        """Views in this implementation's layout (untimed). Gradients are taken w.r.t. these."""
        return q, k, v, dout

    def fwd(self, q, k, v, causal: bool):
        raise NotImplementedError

    def to_bshd(self, t):
        """An output or gradient back in (batch, seqlen, heads, d) for the comparison."""
        return t


class Sdpa(Impl):
    """torch SDPA restricted to one backend (FLASH_ATTENTION is FA2; CUDNN_ATTENTION is cuDNN)."""

    def __init__(self, name: str, backend: SDPBackend):
        self.name, self.backend = name, backend

    def context(self):
        return sdpa_kernel(self.backend)

    def prepare(self, q, k, v, dout):
        # SDPA takes (b, h, s, d). transpose(1, 2) is a view, not a copy: same storage, strides
        # permuted (asserted below), last dim still stride 1, which both backends accept as is.
        # It is made here, once per point, outside the timed region; dout gets the same view, so
        # its strides match the output's (no .contiguous() copy of dout in backward). Whether a
        # backend copies internally shows in the --profile-kernels listing.
        views = tuple(t.transpose(1, 2) for t in (q, k, v, dout))
        assert all(
            a.data_ptr() == t.data_ptr() for a, t in zip(views, (q, k, v, dout), strict=True)
        )
        return views

    def fwd(self, q, k, v, causal):
        # GQA (fewer kv heads: the model-shaped points) through enable_gqa, no kv-head copy; a
        # backend without GQA support raises, and the row says so. Only passed for GQA, so
        # the MHA sweep calls SDPA exactly as before.
        gqa = {"enable_gqa": True} if k.shape[1] != q.shape[1] else {}
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, **gqa)

    def to_bshd(self, t):
        return t.transpose(1, 2)


class FlashAttn4(Impl):
    """flash-attn-4 (CuTe-DSL FA4, flash_attn.cute.flash_attn_func), from peer-wheels.sh."""

    name = "flash-attn-4"
    jit = True

    def __init__(self):
        self.reason = None
        try:
            from flash_attn.cute import flash_attn_func

            self._fn = flash_attn_func
        except Exception as e:  # noqa: BLE001 - any import failure is a skip reason
            self.reason = f"not importable ({type(e).__name__}: {str(e)[:200]})"

    def skip_reason(self, direction, hdim):
        return self.reason

    def fwd(self, q, k, v, causal):
        out = self._fn(q, k, v, causal=causal)
        return out[0] if isinstance(out, tuple) else out  # this version returns (out, lse)


class Fa4(Impl):
    """Ours: fa4.attention with backend='sm90', which raises rather than run the reference."""

    name = "fa4"

    def __init__(self):
        self.reason = None
        try:
            import fa4
            from fa4 import build_info

            self._fa4, self._info = fa4, build_info
        except Exception as e:  # noqa: BLE001
            self.reason = f"fa4 not importable ({type(e).__name__}: {e})"

    def skip_reason(self, direction, hdim):
        if self.reason:
            return self.reason
        if torch.cuda.get_device_capability() != (9, 0):
            return "not an SM90 device"
        for d in ("fwd",) if direction == "fwd" else ("fwd", "bwd"):
            why = self._info.missing_kernel("sm90", d, (hdim, hdim))
            if why:
                return f"no sm90 {d} kernel: {why}"
        return None

    def fwd(self, q, k, v, causal):
        return self._fa4.attention(q, k, v, causal=causal, backend="sm90")


class Fa4Deterministic(Fa4):
    """Ours with deterministic=True: the backward's dQ adds in a fixed order (its cost)."""

    name = "fa4-det"

    def fwd(self, q, k, v, causal):
        return self._fa4.attention(q, k, v, causal=causal, deterministic=True, backend="sm90")


# ---- the FP8 forward mode (bench.py --dtype e4m3) ---------------------------------------------
#
# Inputs: q, k, v drawn as make_inputs' (standard normal bf16) and quantized with
# fa4.reference_fp8.quantize (e4m3, descale float32 (b, h_kv): each (batch, kv head)'s largest
# |value| maps to 448); the fourth input is the descales (Fp8Scales) instead of dout. The
# reference every row is checked against is SDPA-flash on the dequantized values (bf16), and
# fa4-bf16 runs on those same dequantized values: the three compute on one set of true values.


class Fp8Scales:
    """The descales of one point's e4m3 q, k, v: float32 (b, h_kv) each."""

    def __init__(self, q, k, v):
        self.q, self.k, self.v = q, k, v


def quantize_fn():
    from fa4.reference_fp8 import quantize

    return quantize


def make_fp8_inputs(batch, seqlen, heads, hdim, seed, heads_kv=None):
    """(q8, k8, v8, Fp8Scales): make_inputs' values (same seed: the bf16 sweep's inputs of the
    point) quantized to e4m3 per (batch, kv head)."""
    quantize = quantize_fn()
    q, k, v, _ = make_inputs(batch, seqlen, heads, hdim, seed, False, heads_kv)
    h_kv = heads_kv or heads
    (q8, qd), (k8, kd), (v8, vd) = (quantize(t, h_kv) for t in (q, k, v))
    del q, k, v
    return q8, k8, v8, Fp8Scales(qd, kd, vd)


def dequantize(x8, descale):
    """e4m3 (b, s, h, d) and descale (b, h_kv) -> bf16 x8 · descale[b, head // group]."""
    group = x8.shape[2] // descale.shape[1]
    per_head = descale.repeat_interleave(group, dim=1)[:, None, :, None]
    return (x8.float() * per_head).to(torch.bfloat16)


def dequantize_inputs(inputs):
    """FP8 inputs -> (q, k, v, q) bf16: what the reference and fa4-bf16 compute on (the fourth,
    dout's place, is unused: the FP8 mode is forward only)."""
    q8, k8, v8, sc = inputs
    q, k, v = dequantize(q8, sc.q), dequantize(k8, sc.k), dequantize(v8, sc.v)
    return q, k, v, q


def fp8_v_max(inputs) -> float:
    """max |v| of FP8 inputs' true values: quantize maps each (batch, kv head)'s largest |v| to
    448 (exact in e4m3), so it is 448 x the largest v descale."""
    return 448.0 * inputs[3].v.max().item()


class Fa4Fp8(Fa4):
    """Ours, the FP8 forward: fa4.attention on e4m3 q, k, v with their descales, bf16 out."""

    name = "fa4"

    def skip_reason(self, direction, hdim):
        if self.reason:
            return self.reason
        if direction != "fwd":
            return "the FP8 forward is forward only"
        if torch.cuda.get_device_capability() != (9, 0):
            return "not an SM90 device"
        missing = getattr(self._info, "missing_instance", None)
        if missing is None:
            return "this fa4 has no FP8 forward (build_info.missing_instance)"
        why = missing("sm90", "fwd", (hdim, hdim), "e4m3")
        return f"no sm90 e4m3 fwd kernel: {why}" if why else None

    def prepare(self, q8, k8, v8, scales):
        self.scales = scales  # the point's descales; fwd is called with the tensors only
        return q8, k8, v8, None

    def fwd(self, q, k, v, causal):
        sc = self.scales
        return self._fa4.attention(q, k, v, causal=causal, backend="sm90", q_descale=sc.q,
                                   k_descale=sc.k, v_descale=sc.v)  # fmt: skip


class Fa4Bf16(Fa4):
    """Ours, the bf16 forward, on the FP8 inputs' dequantized values (the same-run baseline)."""

    name = "fa4-bf16"

    def prepare(self, q8, k8, v8, scales):
        return dequantize_inputs((q8, k8, v8, scales))


CUDNN_FP8_API = "torch.nn.attention.experimental._scaled_dot_product_attention_quantized"


@functools.cache
def cudnn_fp8_sdpa():
    """(the call, None) when this torch exposes an FP8 SDPA on cuDNN that runs on this device,
    else (None, "cuDNN FP8 SDPA: not exposed by torch <version> (why)"). The probe: torch's
    experimental _scaled_dot_product_attention_quantized with a per-tensor DescaleType (the
    cuDNN route; torch 2.11-2.13 have it with PER_HEAD only, which runs FA3's kernel), called
    on a small e4m3 problem under SDPBackend.CUDNN_ATTENTION."""
    why = None
    try:
        from torch.nn.attention.experimental import _scaled_dot_product_attention_quantized as m

        fn, kind = m._scaled_dot_product_attention_quantized, m.DescaleType
        per_tensor = getattr(kind, "PER_TENSOR", None)
        if per_tensor is None:
            why = f"{CUDNN_FP8_API} has no DescaleType.PER_TENSOR (the cuDNN route)"
    except Exception as e:  # noqa: BLE001
        why = f"no {CUDNN_FP8_API} ({type(e).__name__})"
    if why is None:

        def call(q8, k8, v8, causal, qd, kd, vd):
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return fn(q8, k8, v8, is_causal=causal, q_descale=qd, k_descale=kd,
                          v_descale=vd, q_descale_type=per_tensor, k_descale_type=per_tensor,
                          v_descale_type=per_tensor)  # fmt: skip

        try:
            x = torch.randn(1, 2, 128, 64, device="cuda").to(torch.float8_e4m3fn)
            one = torch.ones(1, device="cuda")
            out = call(x, x, x, False, one, one, one)
            torch.cuda.synchronize()
            if not torch.isfinite(out.float()).all():
                why = "the probe call returned non-finite values"
        except Exception as e:  # noqa: BLE001
            why = f"the probe call failed: {type(e).__name__}: {str(e).splitlines()[0][:160]}"
    if why is not None:
        return None, f"cuDNN FP8 SDPA: not exposed by torch {torch.__version__} ({why})"
    return call, None


class SdpaCudnnFp8(Impl):
    """cuDNN's FP8 SDPA where torch exposes one (cudnn_fp8_sdpa). It takes per-tensor descales,
    so prepare() requantizes the point's true values per tensor (untimed; one more e4m3
    rounding, within the check): (b, h, s, d) views of e4m3 tensors, the largest descale."""

    name = "sdpa-cudnn-fp8"

    def __init__(self):
        self._call, self.reason = cudnn_fp8_sdpa()

    def skip_reason(self, direction, hdim):
        if self.reason:  # the whole line is printed once at the start and in fp8_meta.json
            return "cuDNN FP8 SDPA not exposed by this torch (see fp8_meta.json)"
        return None if direction == "fwd" else "forward only"

    def prepare(self, q8, k8, v8, scales):
        views, ds = [], []
        for x, d in zip(
            dequantize_inputs((q8, k8, v8, scales))[:3], (scales.q, scales.k, scales.v), strict=True
        ):
            s = d.max().reshape(1)
            views.append((x.float() / s).to(torch.float8_e4m3fn).transpose(1, 2))
            ds.append(s)
        self.descales = ds
        return (*views, None)

    def fwd(self, q, k, v, causal):
        return self._call(q, k, v, causal, *self.descales)

    def to_bshd(self, t):
        return t.transpose(1, 2)


def make_fp8_impls(names) -> list[Impl]:
    """bench.py --dtype e4m3's implementations (bench_util.FP8_IMPLS)."""
    every = {"fa4": Fa4Fp8, "fa4-bf16": Fa4Bf16, "sdpa-cudnn-fp8": SdpaCudnnFp8}
    return [every[n]() for n in names]


def fp8_gemm_ceiling(rounds=1, warmup_ms=25, rep_ms=100, mnk=(8192, 8192, 8192)):
    """(median ms over rounds, each round's ms, the call) of one m × n × k e4m3 matmul,
    torch._scaled_mm(a, b.t(), scale_a=1, scale_b=1, out_dtype=bf16): a row-major (m, k), b
    row-major (n, k), so b.t() is the column-major operand cuBLASLt's FP8 GEMM wants. Timed by
    time_ms, as the attention calls are (L2 flushed before each call)."""
    m, n, k = mnk
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn((m, k), generator=g, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn((n, k), generator=g, device="cuda").to(torch.float8_e4m3fn)
    one = torch.ones((), device="cuda", dtype=torch.float32)

    def fn():
        return torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

    call = (f"torch._scaled_mm(a, b.t(), scale_a=1, scale_b=1, out_dtype=torch.bfloat16), "
            f"e4m3 {m}x{n}x{k}, use_fast_accum=False")  # fmt: skip
    return _ceiling(fn, call, rounds, warmup_ms, rep_ms)


def bf16_gemm_ceiling(rounds=1, warmup_ms=25, rep_ms=100, mnk=(8192, 8192, 8192)):
    """As fp8_gemm_ceiling for one bf16 m × n × k torch.matmul (a @ b.t()): the FP8 mode's
    second ceiling, so that the two GEMM rates are compared on one card in one run."""
    m, n, k = mnk
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn((m, k), generator=g, device="cuda").to(torch.bfloat16)
    b = torch.randn((n, k), generator=g, device="cuda").to(torch.bfloat16)
    return _ceiling(lambda: a @ b.t(), f"torch.matmul(a, b.t()), bf16 {m}x{n}x{k}", rounds,
                    warmup_ms, rep_ms)  # fmt: skip


def _ceiling(fn, call, rounds, warmup_ms, rep_ms):
    fn()
    torch.cuda.synchronize()
    times = [time_ms(fn, warmup_ms=warmup_ms, rep_ms=rep_ms) for _ in range(rounds)]
    return statistics.median(times), times, call


def make_impls(names) -> list[Impl]:
    every = {
        "fa4": Fa4,
        "fa4-det": Fa4Deterministic,
        "sdpa-flash": lambda: Sdpa("sdpa-flash", SDPBackend.FLASH_ATTENTION),
        "sdpa-cudnn": lambda: Sdpa("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION),
        "flash-attn-4": FlashAttn4,
    }
    return [every[n]() for n in names]


def make_inputs(batch, seqlen, heads, hdim, seed, requires_grad, heads_kv=None, device="cuda"):
    """q, dout: (b, s, h, d) and k, v: (b, s, h_kv, d) (h_kv = heads_kv or h), bf16, standard
    normal (never zeros: METHOD.md), drawn in the order q, k, v, dout: MHA inputs are the same
    for a seed whether heads_kv is given or not."""
    g = torch.Generator(device=device).manual_seed(seed)
    h_kv = heads_kv or heads
    ts = [torch.randn((batch, seqlen, h, hdim), generator=g, device=device, dtype=torch.bfloat16)
          for h in (heads, h_kv, h_kv, heads)]  # fmt: skip
    for t in ts[:3]:
        t.requires_grad_(requires_grad)
    return ts


def fwd_bwd(impl, args, causal):
    out = impl.fwd(*args[:3], causal)
    return torch.autograd.grad(out, args[:3], args[3])


def max_abs_diff(impl, got, ref) -> tuple[float, float]:
    """(max |got - ref|, max |ref|) over tensors (got in the impl's layout, ref in bshd).
    NaN propagates into the first."""
    worst, scale = 0.0, 0.0
    for a, b in zip(got, ref, strict=True):
        d = (impl.to_bshd(a).float() - b.float()).abs().max().item()
        if d != d:  # NaN
            return float("nan"), scale
        worst, scale = max(worst, d), max(scale, b.float().abs().max().item())
    return worst, scale


def peak_extra_mib(fn) -> float:
    """Peak device memory allocated during fn() above what was allocated before it (MiB)."""
    torch.cuda.synchronize()
    gc.collect()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    res = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del res
    return peak / 2**20


_flush_buf = None
# How time_ms empties the L2 before each timed call (bench.py --flush): "zero" is triton do_bench's
# zero_() of a 256 MiB buffer, which leaves the L2 full of dirty lines whose write-back the timed
# call pays for (up to the L2's 50 MB on an H100: ~16 µs at 3 TB/s, a fixed cost that weighs on
# short bandwidth-bound calls such as small-batch decode); "read" sums the same buffer instead,
# which leaves only clean lines (the state a serving step's weight-reading GEMMs leave).
FLUSHES = ("zero", "read")
_flush_mode = "zero"


def set_flush(mode: str) -> None:
    global _flush_mode
    if mode not in FLUSHES:
        raise ValueError(f"flush {mode!r}: choose from {FLUSHES}")
    _flush_mode = mode


def flush_mode() -> str:
    return _flush_mode


def time_ms(fn, warmup_ms=25, rep_ms=100) -> float:
    """Median ms of fn(), the L2 emptied before each call (set_flush): with "zero",
    triton.testing.do_bench if installed; with "read", the same loop with a read flush."""
    if _flush_mode == "read":
        return _events_ms(fn, warmup_ms, rep_ms, lambda buf: buf.view(torch.int32).sum())
    try:
        from triton.testing import do_bench
    except ImportError:
        return _events_ms(fn, warmup_ms, rep_ms, lambda buf: buf.zero_())
    return do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median")


def flush_buffer() -> torch.Tensor:
    """The 256 MiB buffer whose zero_() (or sum) flushes the L2 (> 60 MB) before a timed call."""
    global _flush_buf
    if _flush_buf is None:
        _flush_buf = torch.zeros(256 * 2**20, dtype=torch.int8, device="cuda")
    return _flush_buf


def _events_ms(fn, warmup_ms, rep_ms, flush) -> float:
    """do_bench's loop: a cost estimate from five flushed calls, warm-up calls, then
    rep_ms / estimate calls, each after flush(buffer) and between its own two events, read
    after one synchronize; the median."""
    buf = flush_buffer()
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        flush(buf)
        fn()
    end.record()
    torch.cuda.synchronize()
    est = max(start.elapsed_time(end) / 5, 1e-3)
    for _ in range(max(1, int(warmup_ms / est))):
        fn()
    n = max(5, int(rep_ms / est))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    for i in range(n):
        flush(buf)
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends, strict=True))


def host_us(fn, calls=20) -> float:
    """Host µs per call of `calls` calls of fn launched back to back, timed before the GPU is
    waited for: the host's share of one timed iteration (do_bench adds an L2 flush launch). The
    launch queue holds far more than `calls` launches, so the loop does not wait for the GPU."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t = time.perf_counter() - t0
    torch.cuda.synchronize()
    return t / calls * 1e6


class GraphReplay:
    """fn's launches captured in a CUDA graph: calling it replays them and returns the output
    captured (rewritten in place by each replay). The graph and its memory pool live as long
    as this object."""

    def __init__(self, graph, out):
        self.graph, self.out = graph, out

    def __call__(self):
        self.graph.replay()
        return self.out


def graph_replay(fn, warmup: int = 3) -> GraphReplay:
    """fn captured in a torch.cuda.CUDAGraph (the torch recipe: fn warmed up on a side stream,
    then captured once); raises what the capture raises (a host sync inside fn, say)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    torch.cuda.synchronize()
    return GraphReplay(graph, out)


_nvml = None


def gpu_clock() -> tuple[int, int] | None:
    """(SM clock in MHz, NVML clock event reasons bitmask) of the current device, or None when
    pynvml (nvidia-ml-py) is not installed or NVML does not answer."""
    global _nvml
    try:
        import pynvml

        if _nvml is None:
            pynvml.nvmlInit()
            _nvml = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        reasons = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        reasons = reasons or pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
        return pynvml.nvmlDeviceGetClockInfo(_nvml, pynvml.NVML_CLOCK_SM), int(reasons(_nvml))
    except Exception:  # noqa: BLE001 - no NVML: the columns stay blank
        return None


def clocked(fn):
    """fn()'s result and the (sm_mhz, clock_reasons) CSV fields read around it."""
    before = gpu_clock()
    res = fn()
    after = gpu_clock()
    if before is None or after is None:
        return res, "", ""
    return res, f"{before[0]}/{after[0]}", hex(before[1] | after[1])


def kernel_names(fn) -> Counter:
    """CUDA kernels one fn() launches (torch.profiler), name -> count."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = Counter()
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            names[e.name[:120]] += 1
    return names


def environment() -> list[str]:
    import subprocess
    from pathlib import Path

    import bench_util

    lines = [
        f"fa4 sources {bench_util.source_digest(Path(__file__).resolve().parents[1])} "
        "(bench_util.source_digest: compare on the commit this run is recorded against)",
        f"torch {torch.__version__} (CUDA {torch.version.cuda}), "
        f"cuDNN {torch.backends.cudnn.version()}",
    ]
    try:
        import triton

        lines.append(f"triton {triton.__version__}")
    except ImportError:
        lines.append("triton not installed: CUDA events with an L2 flush")
    try:
        from importlib.metadata import version

        lines.append(
            f"flash-attn-4 {version('flash-attn-4')}, "
            f"nvidia-cutlass-dsl {version('nvidia-cutlass-dsl')}"
        )
    except Exception as e:  # noqa: BLE001
        lines.append(f"flash-attn-4 version unknown ({type(e).__name__})")
    if torch.cuda.is_available():
        pr = torch.cuda.get_device_properties(0)
        lines.append(f"GPU {pr.name}, CC {pr.major}.{pr.minor}, {pr.multi_processor_count} SMs")
        q = "name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.draw,temperature.gpu"
        try:
            smi = subprocess.run(
                ["nvidia-smi", f"--query-gpu={q}", "--format=csv"],
                capture_output=True,
                text=True,
                timeout=20,
            )
            lines += smi.stdout.strip().splitlines()
        except Exception as e:  # noqa: BLE001
            lines.append(f"nvidia-smi: {e}")
    return lines

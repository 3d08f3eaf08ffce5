"""`python -m fa4`: what this installation can run here, and one attention checked and timed.

1. The build: archs, and per kernel family of the manifest (fa4/kernels.json) the head dims this
   build compiled, with the reason when none.
2. The device: the GPU and which family runs on it, or the CPU (the fp32 reference runs there),
   and its column of the support matrix (docs/support.md, fa4/support.py).
3. One causal GQA attention on that device through fa4.attention (the compiled kernel where one
   covers it, else the reference), checked against the fp32 reference with the tolerance rule of
   DESIGN.md §5 and timed against torch's scaled_dot_product_attention on the same inputs.
4. One decode step of a serving engine through fa4.attention_with_kvcache: a new token appended
   to a paged KV cache (page 64), then attention over it, checked the same way and timed against
   SDPA on the dense cache (which cannot read pages), as CUDA-graph replays (as a serving engine
   runs its decode step) and as eager calls.
Exit status 1 when a check fails.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings

import torch

from . import attention, attention_with_kvcache, build_info, manifest, reference, support
from .dispatch import _ARCH_OF_BACKEND


def _support_lines() -> list[str]:
    lines = []
    for k in manifest.M["kernels"]:
        fam, direction = k["family"], k["direction"]
        built = build_info.KERNELS.get(direction, {}).get(fam) or []
        have = ", ".join(f"{d}" if d == dv else f"{d}x{dv}" for d, dv in built) or "none"
        every = ", ".join(k["head_dims"])
        lines.append(f"  {fam} {direction}: built for head dims {have} (manifest: {every})")
    return lines


def _device_line(device: torch.device) -> str:
    if device.type == "cpu":
        return "device: CPU (no CUDA device): fa4.attention runs the fp32 reference"
    cc = torch.cuda.get_device_capability(device)
    fams = [f for f, a in _ARCH_OF_BACKEND.items() if a == cc]
    name = torch.cuda.get_device_name(device)
    which = f"the {fams[0]} kernels" if fams else "no fa4 kernel family (the reference)"
    return f"device: {name} (compute capability {cc[0]}.{cc[1]}): {which}"


def _time_ms(fn, device: torch.device, reps: int, rounds: int = 5) -> float:
    """The median over `rounds` of the mean ms of `reps` back-to-back calls, after 3 warm-up
    calls: one round read an H100's eager decode step at 0.187 and 0.417 ms in two runs of
    2026-12-07 (64ce36f, a2ae92a)."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(rounds):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append((time.perf_counter() - start) * 1e3 / reps)
    return statistics.median(times)


def _graph_ms(fn, reps: int) -> float:
    """fn captured once in a CUDA graph (after a warm-up call on a side stream), then the mean
    time of a replay: the kernels' time without the host's launch cost."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return _time_ms(graph.replay, torch.device("cuda"), reps)


def _verdict(out, ref, naive, dtype) -> tuple[float, float, bool]:
    """max |out - ref| and DESIGN.md §5's bound, 2 max |naive - ref| + 2 rounding noise."""
    ref64 = ref.double()
    err = (out.double() - ref64).abs().max().item()
    base = (naive.double() - ref64).abs().max().item()
    noise = (ref64.to(dtype).double() - ref64).abs().max().item()
    bound = 2 * base + 2 * noise
    return err, bound, err <= bound


def _check(device: torch.device, seqlen: int, heads: int, hdim: int) -> bool:
    gen = torch.Generator().manual_seed(0)
    dtype = torch.bfloat16
    b, h_kv = 2, max(1, heads // 4)

    def rnd(h):
        return torch.randn(b, seqlen, h, hdim, generator=gen).to(dtype).to(device)

    q, k, v = rnd(heads), rnd(h_kv), rnd(h_kv)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = attention(q, k, v, causal=True)
    used = "the fp32 reference" if device.type == "cpu" or caught else "the compiled kernel"
    ref, _ = reference.attention_ref(q, k, v, causal=True)
    naive, _ = reference.attention_ref(q, k, v, causal=True, upcast=False)
    err, bound, ok = _verdict(out, ref, naive, dtype)
    shape = f"bf16, batch {b}, seqlen {seqlen}, heads {heads} (kv {h_kv}), head dim {hdim}, causal"
    print(f"attention ({shape}) ran {used}")
    verdict = "ok" if ok else "FAILED"
    print(f"  max |out - fp32 reference| = {err:.2e}, bound {bound:.2e}: {verdict}")
    for w in caught:
        print(f"  note: {w.message}")

    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    kt = kt.repeat_interleave(heads // h_kv, dim=1)
    vt = vt.repeat_interleave(heads // h_kv, dim=1)

    def sdpa():
        return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=True)

    reps = 20 if device.type == "cuda" else 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = _time_ms(lambda: attention(q, k, v, causal=True), device, reps)
    theirs = _time_ms(sdpa, device, reps)
    speed = theirs / ours
    print(f"  time: fa4 {ours:.3f} ms, torch SDPA {theirs:.3f} ms ({speed:.2f}x SDPA's speed)")
    return ok


def _check_decode(device: torch.device, cache_len: int, heads: int, hdim: int) -> bool:
    gen = torch.Generator().manual_seed(1)
    dtype, b, page = torch.bfloat16, 4, 64
    h_kv = max(1, heads // 4)
    per = -(-(cache_len + 1) // page)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen).to(dtype).to(device)

    q, k_new, v_new = rnd(b, 1, heads, hdim), rnd(b, 1, h_kv, hdim), rnd(b, 1, h_kv, hdim)
    k_pool, v_pool = rnd(b * per, page, h_kv, hdim), rnd(b * per, page, h_kv, hdim)
    table = torch.randperm(b * per, generator=gen).to(torch.int32).view(b, per).to(device)
    lens = torch.full((b,), cache_len, dtype=torch.int32, device=device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = attention_with_kvcache(
            q, k_pool, v_pool, lens, k_new=k_new, v_new=v_new, page_table=table
        )
    used = "the fp32 reference" if device.type == "cpu" or caught else "the compiled kernels"
    kw = {"page_table": table}
    ref, _ = reference.attention_kvcache_ref(q, k_pool, v_pool, lens + 1, **kw)
    naive, _ = reference.attention_kvcache_ref(q, k_pool, v_pool, lens + 1, upcast=False, **kw)
    err, bound, ok = _verdict(out, ref, naive, dtype)
    shape = f"bf16, batch {b}, cache {cache_len} + 1 tokens, heads {heads} (kv {h_kv}), page {page}"
    print(f"decode step ({shape}) ran {used}")
    print(
        f"  max |out - fp32 reference| = {err:.2e}, bound {bound:.2e}: {'ok' if ok else 'FAILED'}"
    )
    for w in caught:
        print(f"  note: {w.message}")
    if device.type != "cuda":
        return ok
    # Timing: the attention alone (no append) against SDPA on the same keys, gathered dense.
    rows = table.long().flatten()
    k_dense = k_pool[rows].view(b, per * page, h_kv, hdim)[:, : cache_len + 1].transpose(1, 2)
    v_dense = v_pool[rows].view(b, per * page, h_kv, hdim)[:, : cache_len + 1].transpose(1, 2)
    k_dense = k_dense.repeat_interleave(heads // h_kv, dim=1)
    v_dense = v_dense.repeat_interleave(heads // h_kv, dim=1)
    qt = q.transpose(1, 2)

    def sdpa():
        return torch.nn.functional.scaled_dot_product_attention(qt, k_dense, v_dense)

    used_lens = lens + 1

    def ours():
        return attention_with_kvcache(q, k_pool, v_pool, used_lens, page_table=table)

    # Eager, each call reads cache_seqlens and the page table on the host for the value checks
    # (one device sync): at this size the host's time, not the kernel's. A serving engine
    # replays its decode step as a CUDA graph (the checks are skipped while capturing), which
    # times the kernels.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        eager = _time_ms(ours, device, 20)
        graph = _graph_ms(ours, 50)
    theirs_eager = _time_ms(sdpa, device, 20)
    theirs = _graph_ms(sdpa, 50)
    print(
        f"  time as CUDA-graph replays: fa4 {graph:.3f} ms, torch SDPA {theirs:.3f} ms "
        f"({theirs / graph:.2f}x SDPA's speed)"
    )
    print(
        f"  eager calls: fa4 {eager:.3f} ms (with the value checks' host sync), torch SDPA "
        f"{theirs_eager:.3f} ms"
    )
    return ok


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fa4", description=__doc__.split("\n")[0])
    ap.add_argument("--seqlen", type=int, default=None, help="default 4096 on a GPU, 256 on CPU")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--hdim", type=int, default=128)
    a = ap.parse_args(argv)
    print(build_info.summary())
    print("kernels (fa4/kernels.json):")
    print("\n".join(_support_lines()))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    print(_device_line(device))
    # The matrix's column for this device (fa4/support.py: a build of the default archs).
    print("\n".join(support.local_lines(support.local_arch(device))))
    seqlen = a.seqlen or (4096 if device.type == "cuda" else 256)
    ok = _check(device, seqlen, a.heads, a.hdim)
    cache_len = 8191 if device.type == "cuda" else 255
    ok = _check_decode(device, cache_len, a.heads, a.hdim) and ok
    return 0 if ok else 1


sys.exit(main())

"""Small decode-kernel problems for compute-sanitizer (memcheck / racecheck) on the GPU:

    compute-sanitizer --tool memcheck python3 tools/sanitize_decode.py
    compute-sanitizer --tool racecheck python3 tools/sanitize_decode.py

Each tile shape (16, 32 and 64 packed rows), key splits with the combine, paged K/V with page
sizes 1 and 16 (a key count ending inside a page), the sink, leftpad, kv_batch_idx and varlen
queries with seqused_q, an FP8 cache, rings that wrap, each small enough that the instrumented
run takes seconds. Exits non-zero if a result is not finite.
"""

import torch

import fa4


def check(name, out):
    torch.cuda.synchronize()
    assert torch.isfinite(out.float()).all(), name
    print(f"ok {name}")


def main():
    dev, bf = "cuda", torch.bfloat16
    d = 128
    for s_q in (1, 8, 40):  # 4, 32 and 160 packed rows at GQA 4:1
        q = torch.randn(2, s_q, 8, d, device=dev, dtype=bf)
        k = torch.randn(2, 300, 2, d, device=dev, dtype=bf)
        v = torch.randn_like(k)
        lens = torch.tensor([300, 77], dtype=torch.int32, device=dev)
        for splits in (1, 3):
            out = fa4.attention_with_kvcache(
                q, k, v, lens, causal=True, num_splits=splits, backend="sm90"
            )
            check(f"s_q={s_q} splits={splits}", out)
    q = torch.randn(3, 2, 8, d, device=dev, dtype=bf)
    for page in (1, 16):
        pool = torch.randn(64 * 16 // page, page, 2, d, device=dev, dtype=bf)
        table = torch.randperm(pool.shape[0], device=dev, dtype=torch.int32)[: 3 * (200 // page)]
        table = table.view(3, -1).contiguous()
        lens = torch.tensor([0, 199 // page * page - 3, 17], dtype=torch.int32, device=dev)
        sink = torch.randn(8, device=dev)
        out = fa4.attention_with_kvcache(
            q, pool, pool, lens, page_table=table, learnable_sink=sink, num_splits=2,
            backend="sm90",
        )  # fmt: skip
        check(f"paged page={page} sink", out)
    k = torch.randn(5, 100, 2, d, device=dev, dtype=bf)
    idx = torch.tensor([4, 0, 2], dtype=torch.int32, device=dev)
    pad = torch.tensor([3, 0, 50], dtype=torch.int32, device=dev)
    lens = torch.tensor([90, 10, 100], dtype=torch.int32, device=dev)
    out = fa4.attention_with_kvcache(
        q, k, k, lens, cache_batch_idx=idx, cache_leftpad=pad, causal=True, backend="sm90"
    )
    check("kv_batch_idx leftpad", out)
    cu = torch.tensor([0, 3, 3, 8], dtype=torch.int32, device=dev)
    qv = torch.randn(8, 8, d, device=dev, dtype=bf)
    kv = torch.randn(8 + 150, 2, d, device=dev, dtype=bf)
    cu_k = torch.tensor([0, 50, 50, 158], dtype=torch.int32, device=dev)
    used = torch.tensor([2, 0, 4], dtype=torch.int32, device=dev)
    out = fa4.attention_varlen(
        qv, kv, kv, cu, cu_k, 5, 108, seqused_q=used, causal=True, num_splits=2, backend="sm90"
    )
    check("varlen seqused_q", out)
    # An FP8 cache (Note [fp8 cache]): each tile shape, splits, paged with a partial page.
    for s_q in (1, 8, 40):
        q = torch.randn(2, s_q, 8, d, device=dev, dtype=bf)
        k8 = torch.randn(2, 300, 2, d, device=dev).to(torch.float8_e4m3fn)
        scale = torch.rand(2, 2, device=dev) + 0.5
        lens = torch.tensor([300, 77], dtype=torch.int32, device=dev)
        out = fa4.attention_with_kvcache(
            q, k8, k8, lens, k_descale=scale, v_descale=scale, num_splits=3, backend="sm90"
        )
        check(f"fp8 s_q={s_q}", out)
    pool8 = torch.randn(64, 16, 2, d, device=dev).to(torch.float8_e4m3fn)
    table = torch.randperm(64, device=dev, dtype=torch.int32)[:36].view(3, 12).contiguous()
    lens = torch.tensor([0, 181, 17], dtype=torch.int32, device=dev)
    q = torch.randn(3, 1, 8, d, device=dev, dtype=bf)
    out = fa4.attention_with_kvcache(q, pool8, pool8, lens, page_table=table, backend="sm90")
    check("fp8 paged", out)
    # Rings that wrap several times (2-4 stages, decode/plan.h num_stages), at both head dims:
    # 2000 keys are 32 blocks, unsplit, both producers (dense: TMA; paged 8: the gather).
    for dh in (64, 128):
        q = torch.randn(2, 1, 8, dh, device=dev, dtype=bf)
        k = torch.randn(2, 2000, 2, dh, device=dev, dtype=bf)
        lens = torch.tensor([2000, 1999], dtype=torch.int32, device=dev)
        for cache in (k, k.to(torch.float8_e4m3fn)):
            out = fa4.attention_with_kvcache(q, cache, cache, lens, num_splits=1, backend="sm90")
            check(f"wrap d={dh} {cache.dtype}", out)
        pool = k.reshape(500, 8, 2, dh)
        table = torch.randperm(500, device=dev, dtype=torch.int32).view(2, 250).contiguous()
        out = fa4.attention_with_kvcache(
            q, pool, pool, lens, page_table=table, num_splits=1, backend="sm90"
        )
        check(f"wrap d={dh} paged 8", out)


if __name__ == "__main__":
    main()

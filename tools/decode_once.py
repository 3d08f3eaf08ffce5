"""One decode step of one implementation, bracketed by the CUDA profiler API, for ncu to profile
every kernel of the step and nothing else (tools/ncu_decode.sh):

    ncu --profile-from-start off --clock-control none --metrics gpu__time_duration.sum \\
        python3 tools/decode_once.py fa4 16 8192 4 64 2

Arguments: implementation (fa4, sdpa-cudnn or sdpa-flash), batch, seqlen_k, kv heads, head dim,
and for fa4 num_splits (0 = the heuristic). 32 q heads, one query token, bf16, a dense cache of
full length (bench/bench.py --decode's decode cases); fresh N(0, 1) inputs. Three warm-up steps
run before the profiled one. fa4's value checks are skipped, as in the bench's timed calls.
"""

import sys

import torch
import torch.nn.functional as F


def step_fn(impl, q, k, v, splits):
    if impl == "fa4":
        import fa4

        used = torch.full((q.shape[0],), k.shape[1], dtype=torch.int32, device="cuda")

        def step():
            # as a serving engine's graph replays it: the index checks (a cast, a copy to the
            # host) made once, not in the step
            with fa4.value_checks.values_checked():
                return fa4.attention_with_kvcache(q, k, v, used, num_splits=splits, backend="sm90")

        return step
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {"sdpa-cudnn": SDPBackend.CUDNN_ATTENTION, "sdpa-flash": SDPBackend.FLASH_ATTENTION}
    if impl not in backend:
        raise SystemExit(f"{impl!r}: not fa4, sdpa-cudnn or sdpa-flash")
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))

    def fn():
        with sdpa_kernel(backend[impl]):
            return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)

    return fn


def main():
    impl = sys.argv[1]
    b, sk, hkv, d = map(int, sys.argv[2:6])
    splits = int(sys.argv[6]) if len(sys.argv) > 6 else 0
    q = torch.randn(b, 1, 32, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    fn = step_fn(impl, q, k, v, splits)
    with torch.inference_mode():
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        fn()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()

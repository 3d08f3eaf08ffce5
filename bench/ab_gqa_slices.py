"""fwd+bwd A/B of Note [GQA head slices] (csrc/sm90/bwd/kernel.cuh) at GQA model shapes: the
built-in BwdGrid::slice_heads against FA4_BWD_TILE_ORDER=heads<n> (n q heads per backward item;
heads64: whole groups), optionally flash-attn-4 (PEER=1). One training step through autograd,
CUDA-graph replays (the variable is read at capture), rounds in rotated order, median ms; also
each variant's max |diff| of dq, dk, dv against whole groups, and its peak extra MiB.

  VARIANTS=whole,auto,s1,s2 ROUNDS=3 PEER=1 python3 bench/ab_gqa_slices.py
  CASES=qwen-8k-causal,llama-b8x1k-causal python3 bench/ab_gqa_slices.py

bench/env_sweep.py times the backward alone under the same variable with the bench's peers.
"""

import os
import statistics

import bench_impls as bi  # bench/ is sys.path[0] when run as a script
import torch

import fa4

CASES = [  # name, batch, seqlen, heads, heads_kv, head dim, causal
    ("llama-8k-causal", 1, 8192, 32, 8, 128, True),
    ("qwen-8k-causal", 1, 8192, 28, 4, 128, True),
    ("gptoss-8k-causal", 1, 8192, 64, 8, 64, True),
    ("llama-8k-noncausal", 1, 8192, 32, 8, 128, False),
    ("llama-b4x4k-causal", 4, 4096, 32, 8, 128, True),
    ("llama-b8x1k-causal", 8, 1024, 32, 8, 128, True),
    ("qwen-16k-causal", 1, 16384, 28, 4, 128, True),
]
ALL = {"whole": "heads64", "auto": "", "s1": "heads1", "s2": "heads2", "s3": "heads3"}
PEER_NAME = "flash-attn-4"


def variants() -> dict:
    want = os.environ.get("VARIANTS", "whole,auto,s1,s2").split(",")
    bad = [v for v in want if v not in ALL]
    if bad or "whole" not in want:
        raise SystemExit(f"VARIANTS: {bad or 'whole missing'}; choose from {', '.join(ALL)}")
    chosen = {v: ALL[v] for v in want}
    if os.environ.get("PEER"):
        chosen[PEER_NAME] = None
    return chosen


def training_step(fn, inputs, causal):
    q, k, v, do = inputs

    def run():
        out = fn(q, k, v, causal=causal)
        out = out[0] if isinstance(out, tuple) else out
        return torch.autograd.grad(out, (q, k, v), do)

    return run


def capture(step, setting):
    """The step's graph (or the step itself, eagerly, if it cannot be captured), its gradients
    and its peak extra MiB under FA4_BWD_TILE_ORDER=setting (None: the peer)."""
    if setting is not None:
        os.environ["FA4_BWD_TILE_ORDER"] = setting
    try:
        step()
        mib = bi.peak_extra_mib(step)
        try:
            g = bi.graph_replay(step)
        except Exception as e:  # the peer's capture may fail in its own ways
            print(f"# not capturable ({type(e).__name__}: {e}): timed eagerly", flush=True)
            g = step
        return g, [t.float().clone() for t in g()], mib
    finally:
        os.environ.pop("FA4_BWD_TILE_ORDER", None)


def main():
    chosen = variants()
    names = list(chosen)
    rounds = int(os.environ.get("ROUNDS", "3"))
    only = os.environ.get("CASES")
    peer = None
    if PEER_NAME in chosen:
        from flash_attn.cute import flash_attn_func as peer
    print(f"{torch.cuda.get_device_name()}; FA4_BWD_TILE_ORDER per variant: {chosen}")
    print(
        "case "
        + " ".join(f"{n}_ms" for n in names)
        + " "
        + " ".join(f"whole/{n}" for n in names[1:])
        + " maxdiff(dq/dk/dv) vs whole"
    )
    for name, b, s, h, h_kv, d, causal in CASES:
        if only and name not in only.split(","):
            continue
        inputs = bi.make_inputs(b, s, h, d, 0, True, heads_kv=h_kv)
        runs, grads, mib = {}, {}, {}
        for vn, setting in chosen.items():
            fn = peer if setting is None else fa4.attention
            runs[vn], grads[vn], mib[vn] = capture(training_step(fn, inputs, causal), setting)
        torch.cuda.synchronize()
        diff = {
            vn: [(a - w).abs().max().item() for a, w in zip(grads[vn], grads["whole"], strict=True)]
            for vn in names
        }
        t = {vn: [] for vn in names}
        for r in range(rounds):
            for vn in names[r % len(names) :] + names[: r % len(names)]:
                t[vn].append(bi.time_ms(runs[vn]))
        ms = {vn: statistics.median(t[vn]) for vn in names}
        print(
            f"{name} "
            + " ".join(f"{ms[vn]:.3f}" for vn in names)
            + " "
            + " ".join(f"{ms['whole'] / ms[vn]:.3f}" for vn in names[1:])
            + " "
            + " ".join("/".join(f"{x:.1e}" for x in diff[vn]) for vn in names[1:])
            + " peakMiB "
            + " ".join(f"{mib[vn]:.0f}" for vn in names),
            flush=True,
        )


if __name__ == "__main__":
    main()

"""Summary of an ncu source page exported as CSV (tools/ncu_fwd_source.sh writes one): the warp
stall reasons over the whole kernel and the instructions with the most samples, each with its
offset from the kernel's first instruction (the offsets of `cuobjdump -sass` of the same build).

    python3 tools/ncu_source_summary.py fwd_src_hd128_16384_0.csv [--top 30]

A sample is one warp's state at one sampling tick, so shares are of warp time (producer and
consumer warps alike), not of the tensor pipe's.
"""

from __future__ import annotations

import argparse
import collections
import csv


def summarize(path: str, top: int) -> str:
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    # Row 0 names the kernel; row 1 is the header.
    header, data = rows[1], rows[2:]
    col = {name: i for i, name in enumerate(header)}
    stall_cols = [
        (name[len("stall_") :], i)
        for name, i in col.items()
        if name.startswith("stall_") and "Not Issued" not in name
    ]
    samples_col = col["Warp Stall Sampling (All Samples)"]
    base = None
    total = 0
    reasons: collections.Counter[str] = collections.Counter()
    instrs = []
    for r in data:
        if len(r) <= samples_col or not r[samples_col].isdigit():
            continue
        addr = int(r[col["Address"]], 16)
        base = addr if base is None else base
        n = int(r[samples_col])
        total += n
        per = {name: int(r[i]) for name, i in stall_cols if r[i].isdigit() and r[i] != "0"}
        reasons.update(per)
        instrs.append((n, addr - base, r[col["Source"]].strip(), per))
    lines = [f"{rows[0][1]}", f"samples {total}"]
    lines += [f"  {k:18s} {v:9d} {100 * v / total:5.1f} %" for k, v in reasons.most_common(10)]
    lines.append(f"top {top} instructions (offset, share of samples, main reasons):")
    for n, off, src, per in sorted(instrs, key=lambda x: -x[0])[:top]:
        why = ", ".join(f"{k} {v}" for k, v in sorted(per.items(), key=lambda x: -x[1])[:2])
        lines.append(f"  {off:#07x} {100 * n / total:5.2f} %  {src[:58]:58s} [{why}]")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=20)
    args = ap.parse_args()
    print(summarize(args.csv, args.top))


if __name__ == "__main__":
    main()

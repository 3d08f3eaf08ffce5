"""Summary of an ncu source page exported as CSV (tools/ncu_fwd_source.sh writes one): the warp
stall reasons over the whole kernel and the instructions with the most samples, each with its
offset from the kernel's first instruction (the offsets of `cuobjdump -sass` of the same build).

    python3 tools/ncu_source_summary.py fwd_src_hd128_16384_0.csv [--top 30]
    python3 tools/ncu_source_summary.py bwd_src_fa4_hd128_2048_1.csv --opcodes [--range 0x0-0x80a0]

A sample is one warp's state at one sampling tick, so shares are of warp time (producer and
consumer warps alike), not of the tensor pipe's. --opcodes instead counts the warp instructions
executed per opcode (the "Instructions Executed" column; predicate and modifiers dropped, e.g.
`@!P1 UIADD3.X` counts as UIADD3), optionally only at offsets within --range.
"""

from __future__ import annotations

import argparse
import collections
import csv


def _page(path: str):
    """A source page's kernel row, its columns by name and its instruction rows."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    return rows[0], {name: i for i, name in enumerate(rows[1])}, rows[2:]


def summarize(path: str, top: int) -> str:
    title, col, data = _page(path)
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
    lines = [f"{title[1]}", f"samples {total}"]
    lines += [f"  {k:18s} {v:9d} {100 * v / total:5.1f} %" for k, v in reasons.most_common(10)]
    lines.append(f"top {top} instructions (offset, share of samples, main reasons):")
    for n, off, src, per in sorted(instrs, key=lambda x: -x[0])[:top]:
        why = ", ".join(f"{k} {v}" for k, v in sorted(per.items(), key=lambda x: -x[1])[:2])
        lines.append(f"  {off:#07x} {100 * n / total:5.2f} %  {src[:58]:58s} [{why}]")
    return "\n".join(lines)


def opcode_census(path: str, lo: int = 0, hi: int | None = None):
    """(kernel name, Counter of executed warp instructions per opcode) over offsets [lo, hi]."""
    title, col, data = _page(path)
    ex, addr_col, src_col = col["Instructions Executed"], col["Address"], col["Source"]
    counts: collections.Counter[str] = collections.Counter()
    base = None
    for r in data:
        if len(r) <= ex or not r[ex].isdigit():
            continue
        addr = int(r[addr_col], 16)
        base = addr if base is None else base
        off = addr - base
        if off < lo or (hi is not None and off > hi):
            continue
        words = r[src_col].split()
        if words and words[0].startswith("@"):
            words = words[1:]
        if words:
            counts[words[0].split(".")[0]] += int(r[ex])
    return title[1] if len(title) > 1 else "", counts


def format_census(name: str, counts, top: int) -> str:
    total = sum(counts.values())
    uniform = sum(v for k, v in counts.items() if k.startswith("U") and not k.startswith("UTMA"))
    lines = [name, f"executed {total}  uniform datapath {uniform}"]
    for op, v in counts.most_common(top):
        lines.append(f"  {op:14s} {v:12d} {100 * v / max(total, 1):5.1f} %")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--opcodes", action="store_true", help="executed instructions per opcode")
    ap.add_argument("--range", help="offsets lo-hi (hex) for --opcodes, e.g. 0x23d0-0x80a0")
    args = ap.parse_args()
    if args.opcodes:
        lo, hi = (int(x, 16) for x in args.range.split("-")) if args.range else (0, None)
        print(format_census(*opcode_census(args.csv, lo, hi), args.top))
    else:
        print(summarize(args.csv, args.top))


if __name__ == "__main__":
    main()

"""Run-time settings of one build side by side, in one device call: each variant is a set of
environment assignments under which bench/bench.py times fa4 alone (or the --impls given, e.g.
fa4,fa4-det for the deterministic backward too); the variants run in rounds whose order rotates
(round r starts with variant r), the peers once after the first round. Writes
sweep.csv (every row, with its variant and round) and table.md (per point: each variant's mean
TFLOP/s over the rounds, its ratio to the first variant, and the peers; a model point of
bench.py --model-points is a line of its own, named by its label), and prints the table.

  python3 bench/env_sweep.py --out $OUT/orders --rounds 2 \\
      --variants - FA4_TILE_ORDER=first FA4_TILE_ORDER=first,wave \\
      -- --dirs fwd --causal yes --hdims 64,128 --seqlens 512,1k,2k,16k

"-" is the unchanged environment; a variant of several settings joins them with "+" (commas
belong to the values), e.g. FA4_TILE_ORDER=first,wave+FA4_NUM_SMS=64.
Written for Note [tile order options] (csrc/common/tile_scheduler.cuh): switches read at each
launch need no rebuild, so a call measures several of them where ab_sm90_fwd.sh measures two
builds.
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent / "bench.py"


def parse_variant(text: str) -> dict[str, str]:
    """'-' -> {}; 'A=1+B=x,y' -> {'A': '1', 'B': 'x,y'}."""
    if text == "-":
        return {}
    env = {}
    for part in text.split("+"):
        name, eq, value = part.partition("=")
        if not eq or not name or not name.replace("_", "").isalnum():
            raise ValueError(f"variant {text!r}: {part!r} is not NAME=value")
        env[name] = value
    return env


def rotated(n: int, r: int) -> list[int]:
    """The variants' order in round r: r first, then on around."""
    return [(r + i) % n for i in range(n)]


def column(variant: str, impl: str, impls: list[str]) -> str:
    """A variant's column: its text for the first of the swept impls, "text [impl]" for the
    others (e.g. fa4-det, the deterministic backward)."""
    return variant if impl == impls[0] else f"{variant} [{impl}]"


def point_key(row: dict, labels: list[str]) -> tuple:
    """A row's line in the table: per direction, the standard points by (hdim, causal, seqlen),
    then the model points (bench.py --model-points) by label in run order (labels, extended
    here): a GQA point apart from the MHA point of its hdim, causal and seqlen. A row without a
    label (or from a bench.py before the column) is a standard point."""
    label = row.get("label") or ""
    if not label:
        return (row["direction"], 0, int(row["hdim"]), int(row["causal"]), int(row["seqlen"]))
    if label not in labels:
        labels.append(label)
    return (row["direction"], 1, labels.index(label), label)


def table(rows: list[dict], variants: list[str], impls: list[str] | None = None) -> str:
    """Markdown: per direction and point (point_key), each variant's mean TFLOP/s over its ok
    rows for each swept impl (ratio to that impl's first variant in brackets) and each peer's.
    A model point's label stands in the hd cell."""
    impls = impls or ["fa4"]
    by_key: dict[tuple, dict[str, list[float]]] = {}
    shown: dict[tuple, str] = {}  # key -> the line's first four cells
    labels: list[str] = []
    peers: list[str] = []
    for row in rows:
        key = point_key(row, labels)
        hd = row.get("label") or row["hdim"]
        shown[key] = f"| {row['direction']} | {hd} | {row['causal']} | {row['seqlen']} |"
        swept = row["impl"] in impls
        name = column(row["variant"], row["impl"], impls) if swept else row["impl"]
        if not swept and name not in peers:
            peers.append(name)
        if row["status"].startswith("ok"):
            by_key.setdefault(key, {}).setdefault(name, []).append(float(row["tflops"]))
    cols = [column(v, i, impls) for i in impls for v in variants] + peers
    # each swept column's ratio base: the same impl's first variant
    base_of = {
        column(v, i, impls): column(variants[0], i, impls) for i in impls for v in variants[1:]
    }
    lines = ["| dir | hd | causal | seqlen | " + " | ".join(cols) + " |"]
    lines.append("|" + "---|" * (4 + len(cols)))
    for key in sorted(by_key):
        vals = by_key[key]
        mean = {c: sum(v) / len(v) for c, v in vals.items() if v}
        cells = []
        for c in cols:
            base = mean.get(base_of.get(c))
            if c not in mean:
                cells.append("")
            elif base:
                cells.append(f"{mean[c]:.1f} ({mean[c] / base:.3f})")
            else:
                cells.append(f"{mean[c]:.1f}")
        lines.append(f"{shown[key]} " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def run_bench(out: Path, env: dict[str, str], impls: str, bench_args: list[str]) -> list[dict]:
    """One bench.py run; the rows it wrote (results.csv is flushed as measured), also when it
    failed part way, so that one call's other variants still count."""
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(BENCH), "--impls", impls, "--out", str(out), *bench_args]
    proc = subprocess.run(cmd, env={**os.environ, **env})
    if proc.returncode != 0:
        print(f"env_sweep: {env or 'default'} exited with {proc.returncode}", file=sys.stderr)
    if not (out / "results.csv").exists():
        return []
    with open(out / "results.csv") as fh:
        return list(csv.DictReader(fh))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", nargs="+", required=True, help="'-' or NAME=value[+NAME=value]")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--peers", default="sdpa-cudnn", help="impls run once ('' for none)")
    ap.add_argument("--impls", default="fa4", help="impls timed under every variant (fa4,fa4-det)")
    ap.add_argument("--out", default="/tmp/env_sweep")
    ap.add_argument("bench_args", nargs=argparse.REMAINDER, help="after --: bench.py's arguments")
    args = ap.parse_args(argv)
    bench_args = args.bench_args[1:] if args.bench_args[:1] == ["--"] else args.bench_args
    envs = [parse_variant(v) for v in args.variants]
    out = Path(args.out)
    rows: list[dict] = []
    for r in range(args.rounds):
        for i in rotated(len(envs), r):
            got = run_bench(out / f"r{r}_v{i}", envs[i], args.impls, bench_args)
            rows += [{**row, "variant": args.variants[i], "round": r} for row in got]
        if r == 0 and args.peers:
            got = run_bench(out / "peers", {}, args.peers, bench_args)
            rows += [{**row, "variant": "-", "round": r} for row in got]
    if rows:
        with open(out / "sweep.csv", "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0].keys()))
            w.writeheader()
            w.writerows(rows)
    text = table(rows, args.variants, args.impls.split(","))
    (out / "table.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

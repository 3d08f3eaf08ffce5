#!/bin/bash
# A/B of two builds of the SM90 forward (or, with DIR=bwd, backward) in one device call: two
# trees (BASE_TREE) or two sets of nvcc flags; docs/decisions.md records what each A/B decided.
# Builds "base" and "var" (sm_90a; forward only unless DIR=bwd), runs tests/gpu/test_<DIR>_sm90.py
# on var, then benches base, var with the peers at the peer head dims, base and var again (the
# spread of the same build within the call), and both twice at the other head dims (base, var,
# var, base).
# Run from the repo root on the device machine, with the nvidia-cutlass wheel on PYTHONPATH and,
# for the peers, flash-attn-4 installed (.peer-b/install.sh); the arguments are FA4_NVCC_EXTRA
# of base and var (any nvcc flags, "" for none), e.g.
#
#   BASE_TREE=.base bash bench/ab_sm90_fwd.sh "" ""       # another commit against this tree
#   bash bench/ab_sm90_fwd.sh "" "-Xptxas=-O2"            # one tree, two flag sets
#
# The kernels have no compile-time switches: a change still on trial is a template Variant of
# its traits (both sides compiled), or a commit of its own measured through BASE_TREE.
# Prints a table of every run last.
# Environment: HDIMS (built and benched, default 64,128,256), BUILD_HDIMS (built, default HDIMS:
# e.g. every head dim, for the tests or a standing run after the A/B), PEER_HDIMS (default 128),
# SEQLENS (default 1k,2k,16k), OUT (default /tmp/ab: ab.csv, every run's rows with a "run"
# column, and ab_table.md, the table printed last; one file each, since a device call brings back
# at most eight), DIR (fwd, or bwd: builds the backward too, benches it and tests
# tests/gpu/test_bwd_sm90.py), BENCH_DIRS (the directions benched, default DIR; "fwd,bwd" with
# DIR=bwd measures a forward change and a backward one in one call), TESTS (0 skips the tests),
# BASE_TREE (a directory holding another tree of this repository to build base from, e.g. a
# branch's parent: `git archive main | tar -x -C .base` in the repo root, `/.base/` in
# .git/info/exclude, carried to the device; var is built from the current tree; both with their
# FA4_NVCC_EXTRA), BUILD (0: no builds, the ones an earlier call left in /tmp/ab_so_* on the same
# warm machine), BENCH (0: build and test only, for a call of its own before the benches).
set -o pipefail
base_flags=$1
var_flags=$2
hdims=${HDIMS:-64,128,256}
peer_hdims=${PEER_HDIMS:-128}
seqlens=${SEQLENS:-1k,2k,16k}
out=${OUT:-/tmp/ab}
dir=${DIR:-fwd}
[ "$dir" = bwd ] && disable_bwd=0 || disable_bwd=1
runs=/tmp/ab_runs  # one CSV per run, combined into $out/ab.csv at the end
mkdir -p "$out" && rm -rf "$runs" && mkdir -p "$runs"
export PYTHONUNBUFFERED=1

build() {  # name, flags, tree (default .): builds it in place (editable install), keeps a copy
  # of the extension and its build config in /tmp/ab_so_<name>
  local t0=$SECONDS tree=${3:-.}
  (cd "$tree" && FA4_CUDA_ARCHS=90a FA4_HDIMS=${BUILD_HDIMS:-$hdims} FA4_DISABLE_BWD=$disable_bwd \
    FA4_NVCC_EXTRA="$2" MAX_JOBS=16 \
    python3 -m pip install --no-build-isolation --no-deps --no-index -e .) >"/tmp/ab_build_$1.log" 2>&1 ||
    { tail -40 "/tmp/ab_build_$1.log"; return 1; }
  local so
  so=$(cd "$tree" && python3 -c "import fa4._C as c; print(c.__file__)") || return 1
  mkdir -p "/tmp/ab_so_$1" && cp "$so" "$tree/fa4/_build_config.py" "/tmp/ab_so_$1/" || return 1
  echo "built $1 ($2) from $tree in $((SECONDS - t0)) s: $so"
}

use() {  # name: puts that build's extension in place
  cp /tmp/ab_so_"$1"/_C*.so "$(dirname "$(python3 -c 'import fa4; print(fa4.__file__)')")/" &&
    cp /tmp/ab_so_"$1"/_build_config.py fa4/
}

bench() {  # name, csv name, hdims, impls
  use "$1" || return 1
  local t0=$SECONDS
  python3 bench/bench.py --dirs "${BENCH_DIRS:-$dir}" --hdims "$3" --seqlens "$seqlens" --impls "$4" \
    --out "/tmp/ab_bench_$2" || return 1
  cp "/tmp/ab_bench_$2/results.csv" "$runs/$2.csv"
  echo "bench $2 ($1, hd $3, $4) in $((SECONDS - t0)) s"
}

other=$(python3 -c "import sys; a, b = sys.argv[1:]; print(','.join(h for h in a.split(',') if h not in b.split(',')))" "$hdims" "$peer_hdims")
if [ "${BUILD:-1}" != 0 ]; then
  build base "$base_flags" "${BASE_TREE:-.}" || exit 1
  build var "$var_flags" || exit 1  # last, so that fa4 imports from this tree
fi
# The variant's correctness; the timings run either way (a failure is in the log).
[ "${TESTS:-1}" = 0 ] || { use var && python3 -m pytest "tests/gpu/test_${dir}_sm90.py" -q -rs 2>&1 | tail -15; }
[ "${BENCH:-1}" = 0 ] && exit 0
bench base base "$peer_hdims" fa4 || exit 1
bench var var_peers "$peer_hdims" fa4,sdpa-cudnn,flash-attn-4 || exit 1
bench base base2 "$peer_hdims" fa4 || exit 1
bench var var2 "$peer_hdims" fa4 || exit 1
# The other head dims run base, var, var, base: a single base-then-var pair measured var 3-5 %
# low at 1k with identical code (hd 256).
if [ -n "$other" ]; then
  bench base base_other "$other" fa4 || exit 1
  bench var var_other "$other" fa4 || exit 1
  bench var var_other2 "$other" fa4 || exit 1
  bench base base_other2 "$other" fa4 || exit 1
fi
use var || exit 1  # the tree's extension is var's again, for whatever the call runs next
python3 - "$runs" "$out" <<'PY'
import csv, sys
from pathlib import Path
runs = ["base", "base2", "var", "var2", "var_peers", "base_other", "var_other", "base_other2",
        "var_other2"]
t = {}
every = []
for r in runs:
    f = Path(sys.argv[1]) / f"{r}.csv"
    for row in csv.DictReader(open(f)) if f.exists() else []:
        every.append({"run": r, **row})
        run = "var" if r == "var_peers" and row["impl"] == "fa4" else r
        run = {"base_other": "base", "var_other": "var", "base_other2": "base2",
               "var_other2": "var2"}.get(run, run)
        key = (row["direction"], int(row["hdim"]), int(row["causal"]), int(row["seqlen"]))
        name = run if row["impl"] == "fa4" else row["impl"]
        t.setdefault(key, {})[name] = row["tflops"] if row["status"].startswith("ok") else row["status"]
cols = ["base", "base2", "var", "var2", "sdpa-cudnn", "flash-attn-4"]
lines = ["| dir | hd | causal | seqlen | " + " | ".join(cols) + " |"]
for key in sorted(t):
    lines.append("| %s | %d | %d | %d | " % key + " | ".join(t[key].get(c, "") for c in cols) + " |")
print("\n".join(lines))
out = Path(sys.argv[2])
(out / "ab_table.md").write_text("\n".join(lines) + "\n")
if every:
    with open(out / "ab.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(every[0].keys()))
        w.writeheader()
        w.writerows(every)
PY

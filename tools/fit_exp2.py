#!/usr/bin/env python3
"""Fit the software-exp2 polynomials of csrc/exp2_poly.cuh and measure their fp32 error.

For each degree D in 2..5 this finds the polynomial p(f) = 1 + c1 f + ... + cD f^D with the
smallest maximum RELATIVE error |p(f) / 2^f - 1| on [0, 1] (Remez exchange in float64 on the
constrained form p = 1 + f q(f); c0 = 1 exactly so that 2^integer is exact), rounds c1..cD to
the nearest fp32, and then measures the error of the fp32 evaluation the kernels do: Horner with
fmaf, emulated exactly here (float64 product, which is exact, plus a round-to-odd float64 sum,
rounded once more to fp32: this equals one correctly rounded fmaf).

It writes three generated blocks (the one source of the coefficients and their error bounds):
  csrc/exp2_poly.cuh   the constexpr coefficient tables, between the GENERATED markers
  fa4/_exp2_coeffs.py  COEFFS = {degree: (c0, ..., cD)} as Python floats equal to the fp32 values
  docs/numerics.md     the error table, between the GENERATED markers
and prints the table. `--check` writes nothing and exits 1 when any of the three is stale.

Usage: python tools/fit_exp2.py [--check]
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
HEADER = ROOT / "csrc" / "exp2_poly.cuh"
PYFILE = ROOT / "fa4" / "_exp2_coeffs.py"
DOC = ROOT / "docs" / "numerics.md"

DEGREES = (2, 3, 4, 5)
CPP_BEGIN = "// BEGIN GENERATED: tools/fit_exp2.py"
CPP_END = "// END GENERATED"
DOC_BEGIN = "<!-- BEGIN GENERATED: tools/fit_exp2.py -->"
DOC_END = "<!-- END GENERATED -->"
DOC_ERR_COLUMN = "max rel. error (fp32)"

LN2 = math.log(2.0)
CHUNK = 1 << 20  # elements per numpy pass: 8 MiB float64 arrays stay cache/memory friendly


# ---------------------------------------------------------------------------------------------
# Remez exchange for min max |(1 + f q(f)) 2^-f - 1| on [0, 1], q of degree D - 1.
# ---------------------------------------------------------------------------------------------


def _rel_err64(a: np.ndarray, f: np.ndarray | float) -> np.ndarray:
    """Relative error of p(f) = 1 + sum_k a[k] f^(k+1), in float64."""
    q = np.polyval(a[::-1], f)
    return (1.0 + f * q) * np.exp2(-f) - 1.0


def _local_max_abs(a: np.ndarray, lo: float, hi: float) -> float:
    """Argmax of |error| on [lo, hi] (unimodal there) by golden-section search."""
    g = (math.sqrt(5.0) - 1.0) / 2.0
    for _ in range(100):
        m1 = hi - g * (hi - lo)
        m2 = lo + g * (hi - lo)
        if abs(_rel_err64(a, m1)) < abs(_rel_err64(a, m2)):
            lo = m1
        else:
            hi = m2
    return (lo + hi) / 2.0


def remez(degree: int) -> tuple[np.ndarray, float]:
    """Coefficients c0..cD (float64, c0 = 1) and the levelled error E of the exact polynomial."""
    n = degree + 1  # degree free coefficients + the level E: n alternation points in (0, 1]
    ref = (1.0 - np.cos(np.pi * (np.arange(n) + 1) / n)) / 2.0  # Chebyshev-like, ends at 1
    grid = np.linspace(0.0, 1.0, 1 << 15)
    signs = (-1.0) ** np.arange(n)
    for _ in range(100):
        # (1 + r q(r)) 2^-r - 1 = s E  <=>  sum_k a_k r^(k+1) 2^-r - s E = 1 - 2^-r
        mat = np.empty((n, n))
        for k in range(degree):
            mat[:, k] = ref ** (k + 1) * np.exp2(-ref)
        mat[:, degree] = -signs
        sol = np.linalg.solve(mat, 1.0 - np.exp2(-ref))
        a, level = sol[:degree], sol[degree]
        err = _rel_err64(a, grid)
        # One extremum per run of equal sign (f = 0, where the error is 0, starts no run).
        sgn = np.sign(err)
        idx = np.nonzero(sgn)[0]
        cuts = np.nonzero(np.diff(sgn[idx]))[0] + 1
        new_ref = []
        for run in np.split(idx, cuts):
            i = run[np.argmax(np.abs(err[run]))]
            lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, grid.size - 1)]
            new_ref.append(_local_max_abs(a, lo, hi))
        if len(new_ref) != n:
            raise RuntimeError(f"degree {degree}: {len(new_ref)} alternations, expected {n}")
        ref = np.array(new_ref)
        peak = np.abs(_rel_err64(a, ref)).max()
        # float64 evaluates the error to ~1e-16 absolute; E >= 8e-8, so 1e-7 relative is tight.
        if peak - abs(level) <= 1e-7 * peak:
            return np.concatenate(([1.0], a)), float(abs(level))
    raise RuntimeError(f"degree {degree}: Remez did not converge")


# ---------------------------------------------------------------------------------------------
# Exact emulation of the fp32 evaluation.
# ---------------------------------------------------------------------------------------------


def fma_f32(a: np.ndarray, b: np.ndarray, c: np.ndarray | np.float32) -> np.ndarray:
    """fmaf(a, b, c) for float32 inputs, correctly rounded (as the hardware FFMA / libm fmaf).

    a*b is exact in float64 (24 + 24 <= 53 bits). The float64 sum is made round-to-odd (TwoSum
    gives its exact error e; if e != 0 and the last bit is even, step one ulp towards the exact
    sum); a round-to-odd value with 53 >= 24 + 2 bits rounds to fp32 exactly like the exact sum
    (Boldo & Melquiond 2008). A plain float64 sum would double-round in rare cases.
    """
    prod = a.astype(np.float64) * b.astype(np.float64)
    c64 = np.asarray(c, dtype=np.float64)
    s = prod + c64
    bb = s - prod
    e = (prod - (s - bb)) + (c64 - bb)
    bits = s.view(np.int64)
    step = np.where((e > 0) == (s > 0), 1, -1)  # +1 ulp in magnitude when e has s's sign
    bits = bits + np.where((e != 0) & ((bits & 1) == 0), step, 0)
    return bits.view(np.float64).astype(np.float32)


def horner_f32(c32: tuple[np.float32, ...], f: np.ndarray) -> np.ndarray:
    """p = c[D]; p = fmaf(p, f, c[k]) for k = D-1 .. 0: the kernel's order."""
    p = np.full(f.shape, c32[-1], dtype=np.float32)
    for ck in c32[-2::-1]:
        p = fma_f32(p, f, np.float32(ck))
    return p


def _f_sweep():
    """Chunks of f: every float32 in [1/4, 1), then the 2^-26 grid on [0, 1/4)."""
    lo = int(np.float32(0.25).view(np.uint32))
    hi = int(np.float32(1.0).view(np.uint32))
    for b in range(lo, hi, CHUNK):
        yield np.arange(b, min(b + CHUNK, hi), dtype=np.uint32).view(np.float32)
    for k in range(0, 1 << 24, CHUNK):
        yield (np.arange(k, k + CHUNK, dtype=np.float64) * 2.0**-26).astype(np.float32)


def _extreme_x_rounding_to(f: np.ndarray) -> np.ndarray:
    """For f in [1/2, 1], the smallest and the largest float32 x < 0 with fl(x + 1) = f."""
    one = np.float32(1.0)
    xs = []
    for sign in (1.0, -1.0):
        # x + 1 = f +- 2^-25 (half an ulp of f) is exact in float32 for these x; that tie rounds
        # to f only when f's last bit is even, else the next float towards f is the extreme.
        x = (f.astype(np.float64) - 1.0 + sign * 2.0**-25).astype(np.float32)
        x = np.minimum(x, np.float32(-(2.0**-149)))  # for f = 1: x -> -0 from below
        toward = np.float32(-np.inf if sign > 0 else np.inf)
        xs.append(np.where((x + one) == f, x, np.nextafter(x, toward)))
    x = np.concatenate(xs)
    assert np.all((x < 0) & (x >= -0.5) & ((x + one) == np.concatenate([f, f])))
    return x


def measure(c32: tuple[np.float32, ...]) -> tuple[float, float]:
    """Max |relative error| of exp2_poly over x in [-126, 128), and the f where it occurs.

    The 2^j scaling is exact for j in [-126, 127] (it only moves the exponent of p in [1, 2)),
    so the result's error is p(f)'s error against 2^(x - j). Covered:
      * every float32 f in [1/4, 1), and f on the 2^-26 grid in [0, 1/4): this includes every
        f = x - floor(x) of |x| >= 1 (a 2^-23 grid) and of x in [-1, -1/2] (exact, 2^-24 grid);
        for x in (0, 1/4), f = x is sampled on that 2^-26 grid;
      * x in (-1/2, 0): f = fl(x + 1) is rounded (by at most 2^-25), the one inexact step of the
        range reduction; for each f whose error is within ln2 2^-25 of the maximum, the two
        extreme x that round to it (the error is monotonic in x for a fixed f), and f = 1.
    """
    slack = LN2 * 2.0**-25 * 1.001  # the most the rounding of x + 1 can add
    worst, worst_f = 0.0, 0.0
    near = [np.float32([1.0])]  # f whose error, with the rounding of x + 1, may be the maximum
    for f in _f_sweep():
        err = np.abs(horner_f32(c32, f).astype(np.float64) * np.exp2(-f.astype(np.float64)) - 1)
        k = int(np.argmax(err))
        if err[k] > worst:
            worst, worst_f = float(err[k]), float(f[k])
        near.append(f[(f >= 0.5) & (err + slack >= worst)])
    f = np.concatenate(near)
    x = _extreme_x_rounding_to(f)
    p = horner_f32(c32, x + np.float32(1.0)).astype(np.float64) * 0.5  # j = -1
    err = np.abs(p * np.exp2(-x.astype(np.float64)) - 1.0)
    k = int(np.argmax(err))
    if err[k] > worst:
        worst, worst_f = float(err[k]), float(x[k] + np.float32(1.0))
    return worst, worst_f


def check_range_assumptions(degree: int, c32: tuple[np.float32, ...]) -> None:
    """The bit-add 2^j needs p in [1, 2) wherever j could push the exponent out of range."""
    if not all(c > 0 for c in c32):
        # Positive coefficients and f >= 0 give p >= c0 = 1, so j = -126 stays normal.
        raise RuntimeError(f"degree {degree}: a coefficient is not positive: {c32}")
    # x in [127, 128) has j = 127 and f on the 2^-17 grid: p(f) >= 2 would give exponent 255
    # (inf or a NaN bit pattern). Checked for every such f, and for f = 1 (x in (-2^-25, 0)).
    f = (np.arange((1 << 17) + 1, dtype=np.float64) * 2.0**-17).astype(np.float32)
    if horner_f32(c32, f).max() >= 2.0:
        raise RuntimeError(f"degree {degree}: p(f) >= 2 for some x in [127, 128) or f = 1")


# ---------------------------------------------------------------------------------------------
# Output.
# ---------------------------------------------------------------------------------------------


def hexf(v: float) -> str:
    """C++ hex-float literal of a float32 value, e.g. 0x1.62e430p-1f."""
    mant, exp = float(v).hex().split("p")
    mant = mant.rstrip("0").rstrip(".") if "." in mant else mant
    return f"{mant}p{exp}f"


def ceil_sig3(v: float) -> str:
    """v rounded UP to 3 significant digits (so the recorded bound is >= the measured max)."""
    e = math.floor(math.log10(v))
    m = math.ceil(v / 10.0 ** (e - 2) - 1e-9)
    text = f"{m / 100:.2f}e{e:+03d}"
    while float(text) < v:
        m += 1
        text = f"{m / 100:.2f}e{e:+03d}" if m < 1000 else f"{m / 1000:.2f}e{e + 1:+03d}"
    return text


def render_cpp(results: dict) -> str:
    lines = [
        CPP_BEGIN,
        "// p(f) = c[0] + c[1] f + ... + c[D] f^D ~ 2^f on [0, 1): minimax relative error with",
        "// c[0] = 1, coefficients rounded to fp32. Max relative error of exp2_poly<D> (fp32",
        "// Horner with fmaf, x in [-126, 128)); docs/numerics.md has the table.",
    ]
    for d in DEGREES:
        r = results[d]
        lines.append(f"//   degree {d}: {r['bound']} (2^{r['log2']:.2f})")
    lines += ["template <int Degree>", "struct Exp2PolyCoeffs;"]
    for d in DEGREES:
        lits = [hexf(c) + "," for c in results[d]["c32"]]
        width = max(len(lit) for lit in lits)
        lines += ["template <>", f"struct Exp2PolyCoeffs<{d}> {{"]
        lines.append(f"  static constexpr float c[{d + 1}] = {{")
        for lit, c in zip(lits, results[d]["c32"], strict=True):
            lines.append(f"      {lit:<{width}}  // {float(c):.9g}")  # clang-format stable
        lines += ["  };", "};"]
    lines.append(CPP_END)
    return "\n".join(lines) + "\n"


def render_py(results: dict) -> str:
    lines = [
        "# generated by tools/fit_exp2.py, do not edit",
        '"""Coefficients c0..cD of the software exp2 polynomials (fp32 values as Python floats).',
        "",
        "The same numbers as the Exp2PolyCoeffs tables in csrc/exp2_poly.cuh.",
        '"""',
        "",
        "COEFFS = {",
    ]
    for d in DEGREES:
        lines.append(f"    {d}: (")
        for c in results[d]["c32"]:
            lines.append(f"        {float(c)!r},  # {hexf(c)[:-1]}")
        lines.append("    ),")
    lines.append("}")
    return "\n".join(lines) + "\n"


def render_table(results: dict) -> str:
    head = (
        f"| degree | c1 … cD (fp32; c0 = 1) | minimax error (exact arithmetic) "
        f"| {DOC_ERR_COLUMN} | log2 |"
    )
    lines = [head, "| ---: | --- | ---: | ---: | ---: |"]
    for d in DEGREES:
        r = results[d]
        coeffs = ", ".join(f"{float(c):.9g}" for c in r["c32"][1:])
        lines.append(f"| {d} | {coeffs} | {r['minimax']:.2e} | {r['bound']} | {r['log2']:.2f} |")
    return "\n".join(lines) + "\n"


def render_doc_block(results: dict) -> str:
    return f"{DOC_BEGIN}\n{render_table(results)}{DOC_END}\n"


def replace_block(text: str, begin: str, end: str, block: str, path: Path) -> str:
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end) + r"[^\n]*\n?", re.DOTALL)
    if len(pattern.findall(text)) != 1:
        raise SystemExit(f"{path}: expected exactly one '{begin}' ... '{end}' block")
    return pattern.sub(lambda _: block, text)


def fit_all() -> dict:
    results = {}
    for d in DEGREES:
        c64, level = remez(d)
        c32 = tuple(np.float32(c) for c in c64)
        assert c32[0] == 1.0
        check_range_assumptions(d, c32)
        worst, worst_f = measure(c32)
        results[d] = {
            "c32": c32,
            "minimax": level,
            "worst": worst,
            "worst_f": worst_f,
            "bound": ceil_sig3(worst),
            "log2": math.log2(worst),
        }
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if a generated file is stale")
    args = ap.parse_args(argv)

    results = fit_all()
    outputs = {
        HEADER: replace_block(HEADER.read_text(), CPP_BEGIN, CPP_END, render_cpp(results), HEADER),
        PYFILE: render_py(results),
        DOC: replace_block(DOC.read_text(), DOC_BEGIN, DOC_END, render_doc_block(results), DOC),
    }
    if args.check:
        stale = [p for p, text in outputs.items() if not p.exists() or p.read_text() != text]
        for p in stale:
            print(f"stale: {p.relative_to(ROOT)} (run python tools/fit_exp2.py)", file=sys.stderr)
        return 1 if stale else 0
    for p, text in outputs.items():
        if not p.exists() or p.read_text() != text:
            p.write_text(text)
            print(f"wrote {p.relative_to(ROOT)}", file=sys.stderr)
    print(render_table(results), end="")
    for d in DEGREES:
        print(f"degree {d}: max at f = {results[d]['worst_f']!r}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Proves that a refactor left the kernels' machine code alone: compiles every kernel translation
unit of two commits, disassembles the cubins and compares the normalized SASS kernel by kernel.

    python3 tools/sass_diff.py OLD NEW [--archs 90a,100a] [--hdims 64,96,128,192,256,192x128]
                                       [--jobs N] [--cache DIR] [--keep] [--no-cache]
                                       [--flags-from REV] [--diff-lines N]
    python3 tools/sass_diff.py dump COMMIT --out DIR [same options]

OLD and NEW are commits (anything `git rev-parse` takes) or directories written by `dump`. Exit
status: 0 when every kernel's normalized SASS is identical on both sides, 1 when any kernel
differs or exists on one side only, 2 when a build fails.

Sources: each commit is exported with `git archive` into a temporary folder (kept with --keep).
Its kernel translation units come from one of two layouts:
  manifest  fa4/manifest.py exists: generate_sources(out_dir, archs, hdims) writes the
            instantiation .cu files and returns (arch, path) per translation unit; nvcc_flags()
            gives the flags (include dirs: <tree>/csrc and out_dir).
  legacy    csrc/{fwd,bwd}_sm90_hd<h>[_fp16].cu for 90a (filtered by --hdims), csrc/fwd_sm100.cu
            and csrc/bwd_sm100.cu for 100a; flags LEGACY_FLAGS plus -DFA4_HDIM_<H> per head dim
            and the FA4_HAS_* defines.
Both commits are built with one base flag set: the NEW commit's nvcc_flags() when it has a
manifest, else LEGACY_FLAGS (legacy trees add their -D defines to it); --flags-from REV takes
another commit's. `dump` builds with the commit's own base flags unless --flags-from is given.

Normalization: `cuobjdump -sass` text is split at "Function : <mangled>"; each instruction line
loses its /*addr*/ comment and /* 0x... */ encoding words and has its whitespace collapsed;
branch targets stay as printed (offsets within the function). Kernels are matched by demangled
name with the namespace qualifiers fa4::sm90::, fa4::sm100::, fa4:: and sm90:: removed (moving a
type between those namespaces changes the mangled name, not the code); names that still find no
partner are paired with a kernel of identical body if there is one.

Cache: one gzipped JSON per (commit, archs, hdims, flags, nvcc version) under --cache (default
/tmp/fa4-sass-cache), so a baseline dumped once is reused by later comparisons built with the
same flags: `dump OLD --flags-from NEW` fills the entry that `OLD NEW` reads. A dump directory
may also stand for OLD or NEW (its recorded flags are then the ones it was built with).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import difflib
import gzip
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ALL_HDIMS = ["64", "96", "128", "192", "256", "192x128"]
ALL_ARCHS = ["90a", "100a"]
LEGACY_FLAGS = [
    "-O3",
    "--expt-relaxed-constexpr",
    "--use_fast_math",
    "-lineinfo",
    "-DNDEBUG",
    "-std=c++17",
]
HAS_DEFINES = [
    "-DFA4_HAS_SM90_FWD",
    "-DFA4_HAS_SM90_BWD",
    "-DFA4_HAS_SM100_FWD",
    "-DFA4_HAS_SM100_BWD",
]
DEFAULT_CACHE = "/tmp/fa4-sass-cache"
CACHE_VERSION = 1
# Qualifiers that a refactor may move types between without changing code (longest first).
QUALIFIERS_RE = re.compile(r"\b(?:fa4::sm90::|fa4::sm100::|fa4::|sm90::)")
FUNCTION_RE = re.compile(r"^\s*Function\s*:\s*(\S+)\s*$")
INSTRUCTION_RE = re.compile(r"^\s*/\*[0-9a-fA-F]+\*/\s*(.*?)\s*$")
ENCODING_RE = re.compile(r"/\*\s*0x[0-9a-fA-F]+\s*\*/")
SYMBOL_REF_RE = re.compile(r"`\((_Z[^)\s]+)\)")
LEGACY_SM90_RE = re.compile(r"^(?:fwd|bwd)_sm90_hd(\d+(?:x\d+)?)(?:_fp16)?\.cu$")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# SASS text: splitting, normalization, names (pure functions; tests/tools/test_sass_diff.py)


def split_functions(sass: str) -> dict[str, list[str]]:
    """Raw lines of each function of a `cuobjdump -sass` listing, keyed by mangled name, in order.

    A function runs from its "Function : name" line to the next one (or the end); the lines kept
    are everything after the header, unnormalized. Two sections with the same name (a cubin
    listed twice) are concatenated under that name.
    """
    out: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in sass.splitlines():
        m = FUNCTION_RE.match(line)
        if m:
            current = out.setdefault(m.group(1), [])
            continue
        if current is not None:
            current.append(line)
    return out


def normalize_line(line: str) -> str | None:
    """One instruction without its address and encodings, whitespace collapsed; None for lines
    that hold no instruction (encoding-only continuation lines, headers, separators)."""
    m = INSTRUCTION_RE.match(line)
    if not m:
        return None
    text = ENCODING_RE.sub(" ", m.group(1))
    text = " ".join(text.split())
    return text or None


def normalize_body(lines: list[str]) -> list[str]:
    return [n for n in (normalize_line(line) for line in lines) if n is not None]


def symbol_refs(body: list[str]) -> set[str]:
    """Mangled names that instructions refer to, as in CALL `(_Z...)."""
    return {m.group(1) for line in body for m in SYMBOL_REF_RE.finditer(line)}


def canonicalize_refs(body: list[str], names: dict[str, str]) -> list[str]:
    """Replaces `(mangled) references by the canonical name (names: mangled -> canonical)."""

    def sub(m: re.Match) -> str:
        return f"`({names.get(m.group(1), m.group(1))})"

    return [SYMBOL_REF_RE.sub(sub, line) if "`(" in line else line for line in body]


def canonical_name(demangled: str) -> str:
    """The name kernels are matched by: demangled, namespace qualifiers removed, spaces unified."""
    name = QUALIFIERS_RE.sub("", demangled)
    name = re.sub(r"\s*>\s*", ">", name)  # "Foo<A<1> >" and "Foo<A<1>>" alike
    return " ".join(name.split())


def _strip_params(name: str) -> str:
    """Drops the trailing parameter list "(...)" (balanced) of a demangled function name."""
    if not name.endswith(")"):
        return name
    depth = 0
    for i in range(len(name) - 1, -1, -1):
        c = name[i]
        if c == ")":
            depth += 1
        elif c == "(":
            depth -= 1
            if depth == 0:
                return name[:i]
    return name


def short_name(canonical: str, width: int = 100) -> str:
    """The name as the table prints it: no return type, no parameters, no cute::/cutlass::."""
    name = _strip_params(canonical)
    name = re.sub(r"^void\s+", "", name)
    name = re.sub(r"\b(?:cutlass|cute|std)::", "", name)
    if len(name) > width:
        keep = width - 1
        name = name[: keep - keep // 3] + "…" + name[len(name) - keep // 3 :]
    return name


def demangle(names: list[str]) -> dict[str, str]:
    """mangled -> demangled through cu++filt or c++filt (identity where neither is found)."""
    names = sorted(set(names))
    tool = shutil.which("cu++filt") or shutil.which("c++filt")
    if not names or tool is None:
        return {n: n for n in names}
    res = subprocess.run([tool], input="\n".join(names) + "\n", capture_output=True, text=True)
    out = res.stdout.splitlines()
    if res.returncode != 0 or len(out) != len(names):
        return {n: n for n in names}
    return dict(zip(names, out, strict=True))


def parse_ptxas(text: str) -> dict[str, dict[str, int]]:
    """Per function (mangled): registers, stack, spill_stores, spill_loads from -Xptxas=-v."""
    info: dict[str, dict[str, int]] = {}
    entry = props = None
    for line in text.splitlines():
        m = re.search(r"Compiling (?:entry )?function '([^']+)'", line)
        if m:
            entry = m.group(1)
            info.setdefault(entry, {})
            continue
        m = re.search(r"Function properties for (\S+)", line)
        if m:
            props = m.group(1)
            info.setdefault(props, {})
            continue
        m = re.search(
            r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line
        )
        if m and props is not None:
            stack, stores, loads = (int(g) for g in m.groups())
            info[props].update(stack=stack, spill_stores=stores, spill_loads=loads)
            continue
        m = re.search(r"Used (\d+) registers", line)
        if m and entry is not None:
            info[entry]["registers"] = int(m.group(1))
    return info


# ---------------------------------------------------------------------------------------------
# Matching and the report


@dataclass
class Row:
    arch: str
    name: str  # short display name
    old: dict | None
    new: dict | None
    status: str  # same / changed / only-old / only-new
    note: str = ""


def _keyed(kernels: list[dict]) -> dict[str, dict]:
    """canonical name -> kernel; a canonical name taken twice on one side gets a #n suffix."""
    out: dict[str, dict] = {}
    for k in sorted(kernels, key=lambda k: k["mangled"]):
        key, n = k["canonical"], 1
        while key in out:
            n += 1
            key = f"{k['canonical']}#{n}"
        out[key] = k
    return out


def match_kernels(old: list[dict], new: list[dict]) -> list[tuple[dict | None, dict | None, str]]:
    """Pairs the kernels of one arch: by canonical name, then unmatched ones by identical body.

    Kernels are dicts with at least "mangled", "canonical" and "body". Returns (old, new, note)
    with None on the side where a kernel has no partner.
    """
    o, n = _keyed(old), _keyed(new)
    pairs: list[tuple[dict | None, dict | None, str]] = [(o[k], n[k], "") for k in o if k in n]
    rest_old = [o[k] for k in o if k not in n]
    rest_new = [n[k] for k in n if k not in o]
    by_body: dict[tuple[str, ...], list[dict]] = {}
    for k in rest_new:
        by_body.setdefault(tuple(k["body"]), []).append(k)
    unmatched_old = []
    for k in rest_old:
        partners = by_body.get(tuple(k["body"]))
        if partners:
            pairs.append((k, partners.pop(0), "matched by body"))
        else:
            unmatched_old.append(k)
    paired_new = {id(p[1]) for p in pairs}
    pairs += [(k, None, "") for k in unmatched_old]
    pairs += [(None, k, "") for k in rest_new if id(k) not in paired_new]
    return pairs


def compare(old: dict[str, list[dict]], new: dict[str, list[dict]]) -> list[Row]:
    """Rows for every kernel of every arch in either side (old/new: arch -> kernels)."""
    rows = []
    for arch in sorted(set(old) | set(new)):
        for a, b, note in match_kernels(old.get(arch, []), new.get(arch, [])):
            if a is not None and b is not None:
                status = "same" if a["body"] == b["body"] else "changed"
            else:
                status = "only-old" if b is None else "only-new"
            shown = (b or a)["canonical"]
            rows.append(Row(arch, short_name(shown), a, b, status, note))
    order = {"changed": 0, "only-old": 1, "only-new": 2, "same": 3}
    rows.sort(key=lambda r: (r.arch, order[r.status], r.name))
    return rows


def body_diff(old: list[str], new: list[str], max_lines: int = 16) -> list[str]:
    """The first max_lines lines of the unified diff of two normalized bodies (no file header)."""
    diff = list(difflib.unified_diff(old, new, "old", "new", n=1, lineterm=""))[2:]
    if len(diff) > max_lines:
        more = len(diff) - max_lines
        diff = diff[:max_lines] + [f"... ({more} more diff lines)"]
    return diff


def _regs(k: dict | None) -> str:
    if k is None:
        return "-"
    regs = k.get("registers")
    text = "?" if regs is None else str(regs)
    stores, loads = k.get("spill_stores", 0), k.get("spill_loads", 0)
    if stores or loads:
        text += f" (spill {stores}/{loads})"
    return text


def format_table(rows: list[Row], diff_lines: int = 16) -> str:
    head = ("kernel", "arch", "insts old", "insts new", "regs old", "regs new", "status")
    cells = []
    for r in rows:
        status = r.status + (f" ({r.note})" if r.note else "")
        cells.append(
            (
                r.name,
                r.arch,
                "-" if r.old is None else str(len(r.old["body"])),
                "-" if r.new is None else str(len(r.new["body"])),
                _regs(r.old),
                _regs(r.new),
                status,
            )
        )
    widths = [max(len(c[i]) for c in [head, *cells]) for i in range(len(head))]

    def fmt(c):
        return "  ".join(
            x.ljust(w) if i in (0, 6) else x.rjust(w)
            for i, (x, w) in enumerate(zip(c, widths, strict=True))
        ).rstrip()

    lines = [fmt(head), fmt(tuple("-" * w for w in widths))]
    lines += [fmt(c) for c in cells]
    for r in rows:
        if r.status == "changed" and diff_lines > 0:
            lines += ["", f"--- {r.arch} {r.name}"]
            lines += ["    " + d for d in body_diff(r.old["body"], r.new["body"], diff_lines)]
    counts = {
        s: sum(r.status == s for r in rows) for s in ("same", "changed", "only-old", "only-new")
    }
    lines += ["", "summary: " + ", ".join(f"{v} {k}" for k, v in counts.items())]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Tools, git, layouts


def find_tool(name: str) -> str | None:
    """A CUDA tool (nvcc, cuobjdump, nvdisasm): on PATH, in an nvidia-* wheel's bin/ (the
    nvidia-cuda-cuobjdump / -nvdisasm wheels), or under CUDA_HOME / CUDA_PATH (default
    /usr/local/cuda); None where it is nowhere. tests/helpers.py uses this one too."""
    found = shutil.which(name)
    if found:
        return found
    try:
        import nvidia

        for base in nvidia.__path__:
            hits = sorted(Path(base).glob(f"*/bin/{name}"))
            if hits:
                return str(hits[0])
    except ImportError:
        pass
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    path = Path(home) / "bin" / name
    return str(path) if path.is_file() else None


def cutlass_include() -> str:
    import cutlass_library

    return str(Path(cutlass_library.source_path) / "include")


def git(*args: str, binary: bool = False):
    res = subprocess.run(["git", *args], capture_output=True, text=not binary)
    if res.returncode != 0:
        err = res.stderr if isinstance(res.stderr, str) else res.stderr.decode()
        raise SystemExit(f"git {' '.join(args)} failed: {err.strip()}")
    return res.stdout


def resolve(rev: str) -> str:
    return git("rev-parse", "--verify", f"{rev}^{{commit}}").strip()


def export_tree(sha: str, dest: Path) -> None:
    """The commit's files, without touching the index or the worktree list (git archive)."""
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.Popen(["git", "archive", sha], stdout=subprocess.PIPE)
    tar = subprocess.run(["tar", "-x", "-C", str(dest)], stdin=archive.stdout)
    archive.stdout.close()
    if archive.wait() != 0 or tar.returncode != 0:
        raise SystemExit(f"exporting {sha} into {dest} failed")


def load_manifest(tree: Path, tag: str):
    path = tree / "fa4" / "manifest.py"
    if not path.exists():
        return None
    name = f"fa4_manifest_{tag}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    return module


def legacy_defines(hdims: list[str]) -> list[str]:
    return [f"-DFA4_HDIM_{h.upper()}" for h in hdims] + HAS_DEFINES


def legacy_units(tree: Path, archs: list[str], hdims: list[str]) -> list[tuple[str, Path]]:
    csrc = tree / "csrc"
    units = []
    if "90a" in archs:
        for p in sorted(csrc.glob("*_sm90_hd*.cu")) or sorted(csrc.rglob("*_sm90_hd*.cu")):
            m = LEGACY_SM90_RE.match(p.name)
            if m and m.group(1) in hdims:
                units.append(("90a", p))
    if "100a" in archs:
        for stem in ("fwd_sm100.cu", "bwd_sm100.cu"):
            hits = [csrc / stem] if (csrc / stem).exists() else sorted(csrc.rglob(stem))
            units += [("100a", p) for p in hits[:1]]
    return units


@dataclass
class Unit:
    arch: str
    src: Path
    label: str  # path relative to the tree (or "gen/..." for generated files)


@dataclass
class Plan:
    sha: str
    layout: str  # manifest / legacy
    tree: Path
    units: list[Unit]
    flags: list[str]  # everything but -I, -gencode, -cubin, -o, -Xptxas=-v
    includes: list[str]
    base: list[str]  # the base flags (before the legacy defines)
    key: str = ""


def base_flags(tree: Path, tag: str) -> list[str]:
    """The commit's own base flags: its manifest's nvcc_flags() (no -gencode), else LEGACY_FLAGS."""
    manifest = load_manifest(tree, tag)
    if manifest is None:
        return list(LEGACY_FLAGS)
    return [f for f in manifest.nvcc_flags() if not f.startswith(("-gencode", "--generate-code"))]


def plan(sha: str, work: Path, archs: list[str], hdims: list[str], base: list[str] | None) -> Plan:
    """Exports the commit and lists its translation units and flags. base: the base flags to use
    (None: this commit's own, see base_flags); legacy trees add legacy_defines(hdims) to them."""
    tree, gen = work / "tree", work / "gen"
    if not tree.exists():
        export_tree(sha, tree)
    flags = list(base) if base is not None else base_flags(tree, sha[:12])
    used_base = list(flags)
    manifest = load_manifest(tree, sha[:12])
    if manifest is not None:
        gen.mkdir(parents=True, exist_ok=True)
        units = []
        for arch, path in manifest.generate_sources(gen, list(archs), list(hdims)):
            path = Path(path) if Path(path).is_absolute() else gen / path
            if arch in archs:
                units.append(Unit(arch, path, _label(path, tree, gen)))
        includes = [str(tree / "csrc"), str(gen)]
        layout = "manifest"
    else:
        units = [Unit(a, p, _label(p, tree, gen)) for a, p in legacy_units(tree, archs, hdims)]
        flags += legacy_defines(hdims)
        includes = [str(tree / "csrc")]
        layout = "legacy"
    if not any(f.startswith("-std") for f in flags):
        flags.append("-std=c++17")
    return Plan(sha, layout, tree, units, flags, includes, used_base)


def _label(path: Path, tree: Path, gen: Path) -> str:
    for root, prefix in ((tree, ""), (gen, "gen/")):
        try:
            return prefix + str(path.resolve().relative_to(root.resolve()))
        except ValueError:
            pass
    return str(path)


def nvcc_version(nvcc: str) -> str:
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    return out.strip().splitlines()[-1] if out.strip() else "?"


def cache_key(p: Plan, archs: list[str], hdims: list[str], nvcc_ver: str) -> str:
    blob = json.dumps(
        {
            "v": CACHE_VERSION,
            "commit": p.sha,
            "archs": sorted(archs),
            "hdims": sorted(hdims),
            "flags": sorted(p.flags),
            "nvcc": nvcc_ver,
        },
        sort_keys=True,
    )
    return f"{p.sha[:12]}-{hashlib.sha256(blob.encode()).hexdigest()[:16]}"


# ---------------------------------------------------------------------------------------------
# Building


@dataclass
class Tools:
    nvcc: str
    cuobjdump: str
    env: dict
    cutlass: str


def get_tools() -> Tools:
    found = {n: find_tool(n) for n in ("nvcc", "cuobjdump", "nvdisasm")}
    missing = [n for n, v in found.items() if v is None]
    if missing:
        raise SystemExit(f"not found: {', '.join(missing)} (PATH, nvidia wheels, $CUDA_HOME/bin)")
    env = {**os.environ, "NVDISASM_PATH": str(Path(found["nvdisasm"]).parent)}
    return Tools(found["nvcc"], found["cuobjdump"], env, cutlass_include())


def build_unit(tools: Tools, p: Plan, unit: Unit, out_dir: Path, index: int) -> dict:
    """Compiles one translation unit to a cubin; returns its kernels (normalized) and timing."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"{index:03d}_{unit.arch}_{unit.src.stem}"
    cubin = out_dir / f"{stem}.cubin"
    cmd = [
        tools.nvcc,
        "-cubin",
        "-o",
        str(cubin),
        str(unit.src),
        *p.flags,
        *[f"-I{d}" for d in p.includes],
        f"-I{tools.cutlass}",
        f"-gencode=arch=compute_{unit.arch},code=sm_{unit.arch}",
        "-Xptxas=-v",
    ]
    t0 = time.monotonic()
    build = subprocess.run(cmd, capture_output=True, text=True, env=tools.env)
    seconds = time.monotonic() - t0
    (out_dir / f"{stem}.ptxas.log").write_text(build.stderr)
    if build.returncode != 0:
        return {
            "unit": unit.label,
            "arch": unit.arch,
            "error": build.stderr[-6000:],
            "command": cmd,
            "seconds": seconds,
        }
    sass = subprocess.run(
        [tools.cuobjdump, "-sass", str(cubin)], capture_output=True, text=True, env=tools.env
    )
    if sass.returncode != 0:
        return {
            "unit": unit.label,
            "arch": unit.arch,
            "error": sass.stderr[-6000:],
            "command": [tools.cuobjdump, "-sass", str(cubin)],
            "seconds": seconds,
        }
    (out_dir / f"{stem}.sass").write_text(sass.stdout)
    usage = parse_ptxas(build.stderr)
    kernels = []
    for mangled, raw in split_functions(sass.stdout).items():
        k = {"mangled": mangled, "arch": unit.arch, "unit": unit.label, "body": normalize_body(raw)}
        k.update(usage.get(mangled, {}))
        kernels.append(k)
    return {"unit": unit.label, "arch": unit.arch, "seconds": seconds, "kernels": kernels}


def finish(p: Plan, results: list[dict], archs, hdims, nvcc_ver) -> dict:
    """Merges a commit's per-unit results into its record: arch -> kernels, names demangled."""
    by_arch: dict[str, dict[str, dict]] = {}
    duplicates = []
    for r in results:
        for k in r["kernels"]:
            seen = by_arch.setdefault(k["arch"], {})
            old = seen.get(k["mangled"])
            if old is None:
                seen[k["mangled"]] = k
            elif old["body"] != k["body"]:  # one name, two bodies: keep both, say where
                duplicates.append(f"{k['arch']} {k['mangled']}: {old['unit']} vs {k['unit']}")
                seen[f"{k['mangled']}@{k['unit']}"] = k
    kernels = [k for seen in by_arch.values() for k in seen.values()]
    refs = {r for k in kernels for r in symbol_refs(k["body"])}
    names = demangle([k["mangled"].split("@")[0] for k in kernels] + sorted(refs))
    canon = {m: canonical_name(d) for m, d in names.items()}
    for k in kernels:
        k["demangled"] = names.get(k["mangled"].split("@")[0], k["mangled"])
        k["canonical"] = canonical_name(k["demangled"])
        k["body"] = canonicalize_refs(k["body"], canon)
    return {
        "version": CACHE_VERSION,
        "commit": p.sha,
        "layout": p.layout,
        "archs": archs,
        "hdims": hdims,
        "flags": p.flags,
        "base_flags": p.base,
        "nvcc": nvcc_ver,
        "key": p.key,
        "units": [
            {"unit": r["unit"], "arch": r["arch"], "seconds": round(r["seconds"], 1)}
            for r in results
        ],
        "duplicates": duplicates,
        "kernels": {
            a: sorted(seen.values(), key=lambda k: k["mangled"]) for a, seen in by_arch.items()
        },
    }


def build_all(
    tools: Tools, plans: list[Plan], work: dict[str, Path], jobs: int, archs, hdims, nvcc_ver
) -> dict[str, dict]:
    """Compiles the units of every plan in one pool; returns sha -> record. Exits 2 on failure."""
    tasks = [(p, u, i) for p in plans for i, u in enumerate(p.units)]
    results: dict[str, list[dict]] = {p.sha: [] for p in plans}
    failed = []
    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {
            pool.submit(build_unit, tools, p, u, work[p.sha] / "out", i): (p, u)
            for p, u, i in tasks
        }
        for done, fut in enumerate(concurrent.futures.as_completed(futures), 1):
            p, u = futures[fut]
            r = fut.result()
            state = "FAILED" if "error" in r else f"{len(r['kernels'])} kernels"
            log(
                f"[{done}/{len(tasks)}] {p.sha[:10]} {u.arch} {u.label}: {r['seconds']:.1f} s, "
                f"{state} (elapsed {time.monotonic() - t0:.0f} s)"
            )
            if "error" in r:
                failed.append(r)
            results[p.sha].append(r)
    if failed:
        for r in failed:
            log(
                f"\nbuild of {r['unit']} ({r['arch']}) failed:\n  {' '.join(r['command'])}\n"
                f"{r['error']}"
            )
        raise SystemExit(2)
    for p in plans:
        results[p.sha].sort(key=lambda r: (r["arch"], r["unit"]))
    return {p.sha: finish(p, results[p.sha], archs, hdims, nvcc_ver) for p in plans}


def cache_path(cache: Path, key: str) -> Path:
    return cache / f"{key}.json.gz"


def load_record(path: Path) -> dict:
    with gzip.open(path, "rt") as f:
        return json.load(f)


def save_record(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    with gzip.open(tmp, "wt") as f:
        json.dump(record, f)
    tmp.replace(path)


def flags_of(rev: str, root: Path) -> list[str]:
    """The base flags of a commit (its manifest's nvcc_flags() or LEGACY_FLAGS) or of a dump."""
    d = Path(rev)
    if (d / "sass.json.gz").is_file():
        record = load_record(d / "sass.json.gz")
        return list(record.get("base_flags", record["flags"]))
    sha = resolve(rev)
    tree = root / sha[:12] / "tree"
    if not tree.exists():
        export_tree(sha, tree)
    return base_flags(tree, sha[:12])


def records_for(revs: list[str], args, flags_from: str | None) -> list[dict]:
    """The record of each rev (a commit or a dump directory), from the cache or built; every
    commit built with the base flags of flags_from (None: each commit its own)."""
    archs, hdims = args.archs, args.hdims
    tools = get_tools()
    nvcc_ver = nvcc_version(tools.nvcc)
    root = Path(tempfile.mkdtemp(prefix="fa4-sass-"))
    out: list[dict | None] = [None] * len(revs)
    shas: list[str | None] = [None] * len(revs)
    for i, rev in enumerate(revs):
        d = Path(rev)
        if (d / "sass.json.gz").is_file():
            out[i] = load_record(d / "sass.json.gz")
            if sorted(out[i]["archs"]) != sorted(archs) or sorted(out[i]["hdims"]) != sorted(hdims):
                print(
                    f"note: {rev} holds archs {','.join(out[i]['archs'])} hdims "
                    f"{','.join(out[i]['hdims'])}, not the ones asked for"
                )
            log(
                f"{rev}: dump of {out[i]['commit'][:12]} ({out[i]['layout']}), flags: "
                f"{' '.join(out[i]['flags'])}"
            )
        else:
            shas[i] = resolve(rev)
    work = {s: root / s[:12] for s in shas if s}
    try:
        base = None if flags_from is None else flags_of(flags_from, root)
        plans: list[Plan] = []
        for i, sha in enumerate(shas):
            if sha is None:
                continue
            p = plan(sha, work[sha], archs, hdims, base)
            p.key = cache_key(p, archs, hdims, nvcc_ver)
            cached = cache_path(Path(args.cache), p.key)
            log(f"{revs[i]} = {sha[:12]}: {p.layout} layout, {len(p.units)} units, cache {p.key}")
            print(f"flags {sha[:12]} ({p.layout}): {' '.join(p.flags)}", flush=True)
            if not args.no_cache and cached.is_file():
                out[i] = load_record(cached)
                log(f"  from cache {cached}")
            elif p.sha not in {q.sha for q in plans}:
                plans.append(p)
        if plans:
            built = build_all(tools, plans, work, args.jobs, archs, hdims, nvcc_ver)
            for p in plans:
                if not args.no_cache:
                    save_record(cache_path(Path(args.cache), p.key), built[p.sha])
            for i, sha in enumerate(shas):
                if sha in built and out[i] is None:
                    out[i] = built[sha]
        return out
    finally:
        if args.keep:
            log(f"kept sources, cubins, SASS and ptxas logs under {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# Commands


def _csv(text: str, known: list[str], what: str) -> list[str]:
    items = [x.strip().lower() for x in text.split(",") if x.strip()]
    bad = [x for x in items if x not in known]
    if bad or not items:
        raise argparse.ArgumentTypeError(f"{what}: {bad or text!r} not in {','.join(known)}")
    return items


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--archs",
        type=lambda s: _csv(s, ALL_ARCHS, "--archs"),
        default=list(ALL_ARCHS),
        help="default 90a,100a",
    )
    parser.add_argument(
        "--hdims",
        type=lambda s: _csv(s, ALL_HDIMS, "--hdims"),
        default=list(ALL_HDIMS),
        help="default " + ",".join(ALL_HDIMS),
    )
    parser.add_argument("--jobs", type=int, default=1, help="parallel compiles (default 1)")
    parser.add_argument("--cache", default=DEFAULT_CACHE, help=f"default {DEFAULT_CACHE}")
    parser.add_argument("--no-cache", action="store_true", help="neither read nor write the cache")
    parser.add_argument("--keep", action="store_true", help="keep the temporary build folder")
    parser.add_argument(
        "--flags-from",
        metavar="REV",
        help="build with this commit's (or dump's) base flags: its manifest's nvcc_flags() or "
        "the legacy set (default: NEW for a comparison, the commit itself for dump)",
    )


def _safe(name: str, limit: int = 80) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:limit].strip("_")


def write_dump(record: dict, out: Path) -> None:
    """out/sass.json.gz (the record), out/<arch>/<kernel>.sass (normalized), out/index.tsv."""
    out.mkdir(parents=True, exist_ok=True)
    save_record(out / "sass.json.gz", record)
    index = ["arch\tfile\tinsts\tregisters\tspill_stores\tspill_loads\tunit\tmangled\tdemangled"]
    for arch, kernels in sorted(record["kernels"].items()):
        (out / arch).mkdir(exist_ok=True)
        for k in kernels:
            digest = hashlib.sha1(k["mangled"].encode()).hexdigest()[:8]
            rel = f"{arch}/{_safe(short_name(k['canonical']))}_{digest}.sass"
            (out / rel).write_text("\n".join(k["body"]) + "\n")
            index.append(
                "\t".join(
                    str(x)
                    for x in (
                        arch,
                        rel,
                        len(k["body"]),
                        k.get("registers", ""),
                        k.get("spill_stores", ""),
                        k.get("spill_loads", ""),
                        k["unit"],
                        k["mangled"],
                        k["demangled"],
                    )
                )
            )
    (out / "index.tsv").write_text("\n".join(index) + "\n")


def _times(record: dict) -> str:
    lines = [f"  {u['arch']:>5}  {u['seconds']:7.1f} s  {u['unit']}" for u in record["units"]]
    return "\n".join(lines) if lines else "  (from cache: no compile times recorded here)"


def main_dump(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="sass_diff.py dump",
        description="Build one commit and save its normalized SASS (and fill the cache).",
    )
    ap.add_argument("commit")
    ap.add_argument("--out", required=True, type=Path)
    _options(ap)
    args = ap.parse_args(argv)
    (record,) = records_for([args.commit], args, args.flags_from)
    write_dump(record, args.out)
    total = sum(len(v) for v in record["kernels"].values())
    print(f"{record['commit'][:12]} ({record['layout']}): {total} kernels written to {args.out}")
    print("compile times per unit (when built in the run that made this record):")
    print(_times(record))
    return 0


def main_compare(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="sass_diff.py",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("old", help="commit or dump directory")
    ap.add_argument("new", help="commit or dump directory")
    ap.add_argument("--diff-lines", type=int, default=16, help="diff lines per changed kernel")
    _options(ap)
    args = ap.parse_args(argv)
    old, new = records_for([args.old, args.new], args, args.flags_from or args.new)
    ob, nb = old.get("base_flags", old["flags"]), new.get("base_flags", new["flags"])
    if sorted(ob) != sorted(nb):
        print(f"note: base flags differ\n  old: {' '.join(ob)}\n  new: {' '.join(nb)}")
    rows = compare(
        {a: ks for a, ks in old["kernels"].items() if a in args.archs},
        {a: ks for a, ks in new["kernels"].items() if a in args.archs},
    )
    print(
        f"old {old['commit'][:12]} ({old['layout']})  new {new['commit'][:12]} ({new['layout']})"
        f"  archs {','.join(args.archs)}  hdims {','.join(args.hdims)}"
    )
    print(format_table(rows, args.diff_lines))
    for rec, tag in ((old, "old"), (new, "new")):
        for d in rec.get("duplicates", []):
            print(f"warning ({tag}): one mangled name, two bodies: {d}")
    return 0 if all(r.status == "same" for r in rows) else 1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "dump":
        return main_dump(argv[1:])
    return main_compare(argv)


if __name__ == "__main__":
    sys.exit(main())

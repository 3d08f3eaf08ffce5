"""Where a kernel's local-memory instructions (STL / LDL: ptxas spills) sit: inside a role's
per-block loop (executed once per KV or Q block) or outside (once per tile or per kernel).

    python tools/spill_sites.py KERNEL.cubin [--root /work/main] [-v]

The cubin must carry line info (the build's -lineinfo). `nvdisasm -gi` annotates each
instruction with its inlining chain (file:line of every frame) and marks spill code
(SpillRefill). Loops come from the SASS control flow: basic blocks, dominators, and the natural
loop of every back edge; a subroutine (CALL.REL) called from a loop belongs to that loop. A
loop is a role's per-block loop when its latch (the back edge's branch) comes, in some frame of
its chain, from the source lines of a `for` whose body has FA4_SM100_DEBUG_BLOCK (the marker
every SM100 per-block loop carries, csrc/sm100/common.cuh); loops nested in it (barrier waits)
are part of it. tests/sass/test_sass_sm100_spills.py holds the per-block loops to zero.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKER = "FA4_SM100_DEBUG_BLOCK("
_FRAME = re.compile(r'File "([^"]+)", line (\d+)')
_INSTR = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;?\s*(?:\(\*(.*)\*\))?\s*;?\s*$")
_LABEL = re.compile(r"^(\.L_x_\d+|\$[\w$.]+):\s*$")
_TARGET = re.compile(r"`\(([^)]+)\)")


@dataclass
class Instr:
    addr: int
    pred: str  # "@P0", "@!UP1" or ""
    op: str  # opcode with modifiers: "BRA.U.ANY", "STL.64"
    args: str
    note: str  # nvdisasm's (*"..."*) annotation
    chain: tuple[tuple[str, int], ...]  # (file, line), innermost frame first
    labels: list[str] = field(default_factory=list)

    @property
    def local(self) -> bool:
        return self.op.split(".")[0] in ("STL", "LDL")


def disassemble(cubin: Path, nvdisasm: str | None = None) -> str:
    """`nvdisasm -gi -c` of a cubin (nvdisasm from PATH, NVDISASM or beside cuobjdump)."""
    tool = nvdisasm or os.environ.get("NVDISASM") or "nvdisasm"
    return subprocess.run([tool, "-gi", "-c", str(cubin)], capture_output=True, text=True,
                          check=True).stdout  # fmt: skip


def functions(text: str) -> dict[str, list[Instr]]:
    """The instructions of each function (mangled name) of `nvdisasm -gi` output."""
    out: dict[str, list[Instr]] = {}
    cur: list[Instr] | None = None
    chain: list[tuple[str, int]] = []
    fresh = False  # the //## lines since the last instruction start a new chain
    labels: list[str] = []
    for line in text.splitlines():
        if line.startswith("//----") and ".text." in line:
            name = line.split(".text.", 1)[1].split()[0]
            cur = out.setdefault(name, [])
            chain, labels = [], []
            continue
        if cur is None:
            continue
        s = line.strip()
        if s.startswith("//##"):
            m = _FRAME.search(s)
            if m:
                if not fresh:
                    chain, fresh = [], True
                chain.append((m.group(1), int(m.group(2))))
            continue
        m = _LABEL.match(s)
        if m:
            labels.append(m.group(1))
            continue
        m = _INSTR.match(line)
        if not m:
            continue
        body = m.group(2).strip().rstrip(";").strip()
        pred = ""
        if body.startswith("@"):
            pred, body = body.split(None, 1)
        op, _, args = body.partition(" ")
        cur.append(Instr(int(m.group(1), 16), pred, op, args.strip(), m.group(3) or "",
                         tuple(chain), labels))  # fmt: skip
        labels, fresh = [], False
    return out


# ---- Control flow --------------------------------------------------------------------------


def _successors(code: list[Instr]) -> tuple[list[int], dict[int, list[int]], dict[int, str]]:
    """Basic-block leaders (instruction indices), successor leaders per leader, and the callee
    label of blocks ending in a CALL."""
    at = {lab: i for i, ins in enumerate(code) for lab in ins.labels}
    leaders = {0}
    for i, ins in enumerate(code):
        if ins.labels:
            leaders.add(i)
        if _ends_block(ins) and i + 1 < len(code):
            leaders.add(i + 1)
    order = sorted(leaders)
    succ: dict[int, list[int]] = {}
    calls: dict[int, str] = {}
    for k, lead in enumerate(order):
        end = (order[k + 1] if k + 1 < len(order) else len(code)) - 1
        ins = code[end]
        nxt = [end + 1] if end + 1 < len(code) else []
        base = ins.op.split(".")[0]
        targets = [at[t] for t in _TARGET.findall(ins.args) if t in at]
        if base == "BRX":
            targets = [at[t] for t in re.findall(r"\.L_x_\d+", ins.note) if t in at]
        conditional = bool(ins.pred) or re.match(r"!?U?P\d", ins.args) is not None
        if base in ("BRA", "JMP"):
            s = targets + (nxt if conditional else [])
        elif base == "BRX":
            s = targets
        elif base in ("EXIT", "RET", "BPT") or (base == "JMX"):
            s = nxt if (ins.pred and base != "RET") else []
        elif base == "CALL":
            s = nxt
            if targets:
                calls[lead] = code[targets[0]].labels[0]
        else:
            s = nxt
        succ[lead] = s
    return order, succ, calls


def _ends_block(ins: Instr) -> bool:
    return ins.op.split(".")[0] in ("BRA", "BRX", "JMP", "JMX", "EXIT", "RET", "CALL", "BPT")


def _dominators(order: list[int], succ: dict[int, list[int]], entry: int) -> dict[int, set[int]]:
    preds: dict[int, list[int]] = {b: [] for b in order}
    for b, ss in succ.items():
        for s in ss:
            preds[s].append(b)
    reach, stack = {entry}, [entry]
    while stack:
        for s in succ[stack.pop()]:
            if s not in reach:
                reach.add(s)
                stack.append(s)
    nodes = [b for b in order if b in reach]
    dom = {b: set(nodes) for b in nodes}
    dom[entry] = {entry}
    changed = True
    while changed:
        changed = False
        for b in nodes:
            if b == entry:
                continue
            ps = [dom[p] for p in preds[b] if p in reach]
            new = set.intersection(*ps) | {b} if ps else {b}
            if new != dom[b]:
                dom[b], changed = new, True
    return dom


@dataclass
class Loop:
    header: int  # leader index
    latch: int  # index of the back edge's branch instruction
    blocks: set[int]


def loops(code: list[Instr]) -> tuple[list[Loop], dict[int, int], dict[int, str]]:
    """Natural loops of the function (subroutines: their own entries), the block (leader) of
    every instruction, and the callee label of CALL blocks."""
    order, succ, calls = _successors(code)
    block_of, k = {}, 0
    for i in range(len(code)):
        if k + 1 < len(order) and order[k + 1] == i:
            k += 1
        block_of[i] = order[k]
    ends = {lead: (order[j + 1] if j + 1 < len(order) else len(code)) - 1
            for j, lead in enumerate(order)}  # fmt: skip
    entries = [0] + [i for i in order if any(lab.startswith("$") for lab in code[i].labels)]
    preds: dict[int, list[int]] = {b: [] for b in order}
    for b, ss in succ.items():
        for s in ss:
            preds[s].append(b)
    found = []
    for entry in entries:
        dom = _dominators(order, succ, entry)
        for b in dom:
            for h in succ[b]:
                if h in dom and h in dom[b]:  # back edge b -> h
                    body = {h, b}
                    stack = [b] if b != h else []
                    while stack:
                        for p in preds[stack.pop()]:
                            if p not in body:
                                body.add(p)
                                stack.append(p)
                    found.append(Loop(h, ends[b], body))
    return found, block_of, calls


def _subroutine(code, order_calls, label) -> set[int]:
    """Leaders of a subroutine's blocks (from its label to its RETs)."""
    order, succ, _ = order_calls
    at = {lab: i for i, ins in enumerate(code) for lab in ins.labels}
    start = at[label]
    seen, stack = {start}, [start]
    while stack:
        for s in succ.get(stack.pop(), []):
            if s not in seen:
                seen.add(s)
                stack.append(s)
    return seen


# ---- Source: the per-block loops -----------------------------------------------------------


@dataclass(frozen=True)
class SourceLoop:
    file: str  # path relative to the root
    first: int  # the `for` line
    last: int  # its closing brace
    function: str

    def __str__(self) -> str:
        return f"{self.function} ({self.file}:{self.first}-{self.last})"


def source_loops(root: Path = ROOT) -> list[SourceLoop]:
    """The `for` statements enclosing an FA4_SM100_DEBUG_BLOCK marker in csrc/sm100."""
    out = []
    for path in sorted((root / "csrc/sm100").rglob("*.cuh")):
        lines = path.read_text().splitlines()
        for n, text in enumerate(lines):
            if MARKER not in text or text.lstrip().startswith("#define"):
                continue
            indent = len(text) - len(text.lstrip())
            f = next(j for j in range(n - 1, -1, -1)
                     if re.match(r"\s*for\s*\(", lines[j])
                     and len(lines[j]) - len(lines[j].lstrip()) < indent)  # fmt: skip
            depth, last = 0, f
            for j in range(f, len(lines)):
                depth += lines[j].count("{") - lines[j].count("}")
                if depth == 0 and "{" in "".join(lines[f : j + 1]):
                    last = j
                    break
            fn = next((m.group(1) for j in range(f, -1, -1)
                       if (m := re.match(r"__device__\s+(?:__forceinline__\s+)?\w[\w:<>]*\s+"
                                         r"(\w+)\(", lines[j]))), "?")  # fmt: skip
            out.append(SourceLoop(str(path.relative_to(root)), f + 1, last + 1, fn))
    return out


def source_functions(root: Path = ROOT) -> list[SourceLoop]:
    """Every function of csrc/sm100 declared at column 0 (`__device__ ... name(` or
    `__global__ ...`), as (file, first line, closing brace line, name)."""
    out = []
    for path in sorted((root / "csrc/sm100").rglob("*.cuh")):
        lines = path.read_text().splitlines()
        for n, text in enumerate(lines):
            m = re.match(r"(?:__device__|__global__)\b[^;(]*?\b(\w+)\(", text)
            if not m:
                continue
            depth, opened = 0, False
            for j in range(n, len(lines)):
                depth += lines[j].count("{") - lines[j].count("}")
                opened = opened or "{" in lines[j]
                if opened and depth == 0:
                    break
                if not opened and lines[j].rstrip().endswith(";"):
                    break
            if opened:
                out.append(SourceLoop(str(path.relative_to(root)), n + 1, j + 1, m.group(1)))
    return out


def role_of(ins: Instr, funcs: list[SourceLoop], root: Path = ROOT) -> str:
    """The outermost function of the chain below the kernel entry: the role whose code it is."""
    names = [f.function for _, f in sorted(
        ((k, f) for k, (file, line) in enumerate(ins.chain) for f in funcs
         if f.first <= line <= f.last and Path(file).resolve() == (root / f.file).resolve()),
        key=lambda kf: -kf[0])]  # fmt: skip
    names = [n for n in names if not n.startswith("__") and "kernel" not in n]
    return names[0] if names else "kernel"


def _in(chain, src: SourceLoop, root: Path) -> bool:
    return any(
        src.first <= line <= src.last and Path(f).resolve() == (root / src.file).resolve()
        for f, line in chain
    )


@dataclass
class Sites:
    """One function's local-memory instructions by place."""

    in_loops: dict[SourceLoop, list[Instr]]
    outside: list[Instr]

    @property
    def in_loop_count(self) -> int:
        return sum(len(v) for v in self.in_loops.values())


def spill_sites(code: list[Instr], root: Path = ROOT) -> Sites:
    srcs = source_loops(root)
    found, block_of, calls = loops(code)
    oc = _successors(code)
    member: dict[int, SourceLoop] = {}  # leader -> the per-block loop it belongs to
    for lp in found:
        latch = code[lp.latch].chain
        for src in srcs:
            if _in(latch, src, root):
                for b in lp.blocks:
                    member.setdefault(b, src)
                    if b in calls:
                        for s in _subroutine(code, oc, calls[b]):
                            member.setdefault(s, src)
                break
    in_loops: dict[SourceLoop, list[Instr]] = {}
    outside = []
    for i, ins in enumerate(code):
        if not ins.local:
            continue
        src = member.get(block_of[i])
        if src is None:
            outside.append(ins)
        else:
            in_loops.setdefault(src, []).append(ins)
    return Sites(in_loops, outside)


def where(ins: Instr, root: Path = ROOT) -> str:
    """The instruction's chain as file:line frames inside the repository, innermost first."""
    frames = []
    for f, line in ins.chain:
        p = Path(f)
        try:
            frames.append(f"{p.resolve().relative_to(root.resolve() / 'csrc')}:{line}")
        except ValueError:
            continue
    return " < ".join(frames) or "?"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cubin", type=Path)
    ap.add_argument("--root", type=Path, default=ROOT)
    ap.add_argument("--nvdisasm")
    ap.add_argument("-v", action="store_true", help="every site with its chain")
    a = ap.parse_args(argv)
    text = disassemble(a.cubin, a.nvdisasm)
    bad = 0
    for name, code in functions(text).items():
        if not any(ins.local for ins in code):
            print(f"{name}: no STL/LDL")
            continue
        s = spill_sites(code, a.root)
        print(f"{name}: {s.in_loop_count} in per-block loops, {len(s.outside)} outside")
        bad += s.in_loop_count
        for src, sites in s.in_loops.items():
            ops = Counter(i.op.split(".")[0] for i in sites)
            print(f"  loop {src}: {dict(ops)}")
            for ins in sites if a.v else ():
                print(f"    {ins.addr:06x} {ins.op} {ins.args}  {where(ins, a.root)}")
        funcs = source_functions(a.root)
        roles = Counter(role_of(i, funcs, a.root) for i in s.outside)
        print("  outside, by role: " + ", ".join(f"{r} {k}" for r, k in sorted(roles.items())))
        for ins in s.outside if a.v else ():
            print(f"    {ins.addr:06x} {ins.op} {ins.args}  {where(ins, a.root)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

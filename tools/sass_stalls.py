"""Static schedule of a SASS range from its control bits (no GPU needed):

    cuobjdump -sass x.cubin > x.sass
    python3 tools/sass_stalls.py x.sass --kernel fwd_kernel --dtype bfloat16 --from 0x6790 \\
        --to 0x81e0 [--skip 0x7b90:0x7fa0] [--list]

Since Volta each instruction carries its schedule in the top bits of its second 64-bit word: a
stall count (cycles before the warp's next instruction may issue), a yield bit, the scoreboard it
sets for a variable-latency result (write barrier, 7 = none), one read barrier and the mask of
scoreboards it waits for. Summing the stall counts over a straight-line range gives the cycles one
warp needs to issue it when nothing else delays it (scoreboard waits come on top), and the
instructions that wait on a scoreboard show where variable latencies (MUFU, SHFL, loads) enter.
Read this way, one warp of the SM90 forward's softmax needs ~830–900 cycles, its exponentials
paced at one per 8 cycles (docs/decisions.md, 2026-12-01).
"""

from __future__ import annotations

import argparse
import collections
import re
from dataclasses import dataclass

_LINE = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;\s*/\* (0x[0-9a-f]+) \*/")
_HIGH = re.compile(r"\s*/\* (0x[0-9a-f]+) \*/")


@dataclass(frozen=True)
class Instr:
    addr: int
    text: str
    stall: int
    yield_: int
    write_barrier: int  # 7: none
    read_barrier: int  # 7: none
    wait_mask: int  # bit b: waits for scoreboard b
    reuse: int

    @property
    def opcode(self) -> str:
        words = self.text.split()
        op = words[1] if words[0].startswith("@") else words[0]
        return op.split(".")[0]


def decode_control(high: int) -> dict:
    """The control fields of an instruction's second 64-bit word (bits 105-125 of the 128)."""
    c = high >> 41
    return {
        "stall": c & 0xF,
        "yield_": (c >> 4) & 1,
        "write_barrier": (c >> 5) & 7,
        "read_barrier": (c >> 8) & 7,
        "wait_mask": (c >> 11) & 0x3F,
        "reuse": (c >> 17) & 0xF,
    }


def functions(sass: str) -> dict[str, list[Instr]]:
    """Each function of a cuobjdump -sass listing: its name line -> its instructions."""
    out = {}
    for body in re.split(r"\n\s*Function : ", sass)[1:]:
        lines = body.split("\n")
        ins = []
        for i, line in enumerate(lines[:-1]):
            m = _LINE.match(line)
            h = _HIGH.match(lines[i + 1]) if m else None
            if m and h:
                ins.append(
                    Instr(int(m.group(1), 16), m.group(2), **decode_control(int(h.group(1), 16)))
                )
        out[lines[0].strip()] = ins
    return out


def select(ins: list[Instr], lo: int, hi: int, skips: list[tuple[int, int]]) -> list[Instr]:
    """Instructions with lo <= addr <= hi, less those strictly inside a skipped (a, b) range."""
    return [x for x in ins if lo <= x.addr <= hi and not any(a < x.addr < b for a, b in skips)]


def summary(ins: list[Instr]) -> str:
    by_op = collections.defaultdict(lambda: [0, 0])
    for x in ins:
        by_op[x.opcode][0] += 1
        by_op[x.opcode][1] += x.stall
    waits = sum(1 for x in ins if x.wait_mask)
    lines = [
        f"{len(ins)} instructions, stall counts sum to {sum(x.stall for x in ins)} cycles, "
        f"{waits} wait on a scoreboard",
        "opcode       count  stall cycles",
    ]
    for op, (n, s) in sorted(by_op.items(), key=lambda kv: (-kv[1][1], kv[0])):
        lines.append(f"{op:12s} {n:5d}  {s:5d}")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sass", help="cuobjdump -sass output")
    ap.add_argument("--kernel", required=True, help="substring of the function's name")
    ap.add_argument("--dtype", default="", help="a further substring, e.g. bfloat16")
    ap.add_argument("--from", dest="lo", required=True, type=lambda s: int(s, 16))
    ap.add_argument("--to", dest="hi", required=True, type=lambda s: int(s, 16))
    ap.add_argument("--skip", action="append", default=[], help="a:b, hex, e.g. a rare branch")
    ap.add_argument("--list", action="store_true", help="also print each instruction")
    a = ap.parse_args()
    fns = {
        n: i for n, i in functions(open(a.sass).read()).items() if a.kernel in n and a.dtype in n
    }
    if len(fns) != 1:
        raise SystemExit(f"{len(fns)} functions match: {list(fns)}")
    ((name, ins),) = fns.items()
    skips = [tuple(int(v, 16) for v in s.split(":")) for s in a.skip]
    rng = select(ins, a.lo, a.hi, skips)
    print(name)
    if a.list:
        for x in rng:
            print(
                f"{x.addr:#06x} {x.text[:60]:60s} s{x.stall} wb{x.write_barrier} w{x.wait_mask:06b}"
            )
    print(summary(rng))


if __name__ == "__main__":
    main()

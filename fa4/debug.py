"""Reading what a bring-up build's kernels left behind (csrc/common/debug_wait.cuh).

In a build with FA4_SM100_DEBUG=1 every mbarrier wait of the SM100 kernels is bounded: a wait
that does not complete within ~2 s writes a record (kernel, CTA, warp, role, barrier row and
copy, expected parity, the tile and block its role registered) into a host-mapped area and
traps. The trap ends the CUDA context, but the area is host memory: this module reads it through
the extension's exported `fa4_debug_area` and turns it into a HangError naming the barrier, e.g.

    correction warpgroup waited on kSFull[1] phase 0 at KV block 3 of tile (b 0, h 2, m 1)

The op layer calls the kernels through guard(), which in a debug build synchronizes after each
call (so a hang surfaces at the call that hung) and converts the failure. Other code can call
raise_if_hung() after any CUDA error. The same area holds per-warp event rings (FA4_DEBUG_TRACE=1;
tools/trace_sm100.py draws them). The names below must follow the kernels' enums
(tests/api/test_debug_record.py checks them against the sources).
"""

from __future__ import annotations

import ctypes
import functools
import struct
from dataclasses import dataclass, field

AREA_MAGIC = 0xFA4DA7A0
RECORD_MAGIC = 0xFA4DEADF
VERSION = 1
# struct Record, 32-bit words in order (debug_wait.cuh); "i" fields are signed
RECORD_FIELDS = (
    ("magic", "I"), ("kernel", "I"), ("timed_out", "I"), ("block_x", "I"), ("block_y", "I"),
    ("block_z", "I"), ("cluster_rank", "I"), ("smid", "I"), ("warp", "I"), ("lane", "I"),
    ("role", "i"), ("bar_row", "i"), ("bar_copy", "i"), ("bar_addr", "I"), ("parity", "I"),
    ("site_b", "i"), ("site_h", "i"), ("site_tile", "i"), ("site_block", "i"),
    ("waited_lo", "I"), ("waited_hi", "I"), ("reserved0", "I"), ("reserved1", "I"),
    ("reserved2", "I"),
)  # fmt: skip
RECORD = struct.Struct("<" + "".join(f for _, f in RECORD_FIELDS))
HEADER = struct.Struct("<8I")  # magic, version, records, capacity, ctas, warps, events, bytes
RING_HEADER = struct.Struct("<IIiIIIII")  # written, kernel, role, smid, clock lo/hi, ns lo/hi
EVENT = struct.Struct("<IIIi")  # clock lo/hi, code, block
EVENT_KINDS = {1: "wait", 2: "done", 3: "arrive", 4: "commit"}


@dataclass(frozen=True)
class Kernel:
    """Names of a kernel's roles and barriers, in the order of its enums Role and Bar."""

    name: str
    roles: tuple[tuple[str, str], ...]  # (enumerator, description)
    bars: tuple[str, ...]
    tile: str  # the third tile coordinate: "m" (a Q tile) or "n" (a kv tile)
    block: str  # what the block index counts


_FWD_ROLES = (
    ("kSoftmax0", "softmax0 warpgroup"), ("kSoftmax1", "softmax1 warpgroup"),
    ("kCorrection", "correction warpgroup"), ("kMma", "MMA warp"), ("kLoad", "load warp"),
    ("kEpilogue", "epilogue warp"), ("kIdle", "idle warp"),
)  # fmt: skip
# enum Bar of csrc/sm100/fwd/kernel.cuh, shared by the 2-CTA forward (each kernel's table gives
# the rows it does not use no copies)
_FWD_BARS = (
    "kQFull", "kQEmpty", "kKFull", "kKEmpty", "kVFull", "kVEmpty", "kSFull", "kPFull",
    "kStatsFull", "kStatsEmpty", "kOFull", "kORescaled", "kOEmpty", "kOStageFull",
    "kOStageEmpty", "kTileFull", "kTileEmpty", "kPeerQFull", "kPeerKFull", "kPeerVFull",
)  # fmt: skip
_BWD_ROLES = (
    ("kCompute0", "compute0 warpgroup"), ("kCompute1", "compute1 warpgroup"),
    ("kReduce", "reduce warpgroup"), ("kMma", "MMA warp"), ("kLoad", "load warp"),
)  # fmt: skip
KERNELS: dict[int, Kernel] = {
    1: Kernel("fwd_sm100 (csrc/sm100/fwd/kernel.cuh)", _FWD_ROLES, _FWD_BARS, "m", "KV block"),
    4: Kernel(
        "fwd_sm100 2-CTA (csrc/sm100/fwd/kernel_2cta.cuh)",
        _FWD_ROLES[:5] + (("kEpilogue", "relay (epilogue) warp"), ("kIdle", "idle warp")),
        _FWD_BARS,
        "m",
        "KV block",
    ),
    2: Kernel(
        "bwd_sm100 (csrc/sm100/bwd/kernel.cuh)",
        _BWD_ROLES + (("kIdle", "idle warp"),),
        (
            "kKVFull",
            "kQFull",
            "kQEmpty",
            "kDoFull",
            "kDoEmpty",
            "kSFull",
            "kPFull",
            "kDpFull",
            "kDsFull",
            "kDsEmpty",
            "kDqFull",
            "kDqEmpty",
            "kDkvFull",
        ),
        "n",
        "Q block",
    ),  # fmt: skip
    3: Kernel(
        "bwd_sm100 2-CTA (csrc/sm100/bwd/kernel_2cta.cuh)",
        _BWD_ROLES + (("kRelay", "relay warp"), ("kIdle", "idle warp")),
        (
            "kKVFull",
            "kPeerKVFull",
            "kQFull",
            "kPeerQFull",
            "kQEmpty",
            "kDoFull",
            "kPeerDoFull",
            "kDoEmpty",
            "kSFull",
            "kPFull",
            "kDpFull",
            "kDsFull",
            "kDsEmpty",
            "kDqFull",
            "kDqEmpty",
            "kDkvFull",
        ),
        "n",
        "Q block",
    ),  # fmt: skip
    90: Kernel(
        "debug probe (tests/gpu/test_debug_wait.py)",
        (("kProducer", "producer warp"), ("kConsumer", "consumer warp")),
        ("kFull", "kEmpty"),
        "m",
        "block",
    ),
}


@dataclass
class Record:
    magic: int
    kernel: int
    timed_out: int
    block_x: int
    block_y: int
    block_z: int
    cluster_rank: int
    smid: int
    warp: int
    lane: int
    role: int
    bar_row: int
    bar_copy: int
    bar_addr: int
    parity: int
    site_b: int
    site_h: int
    site_tile: int
    site_block: int
    waited_lo: int
    waited_hi: int
    reserved0: int = 0
    reserved1: int = 0
    reserved2: int = 0

    @property
    def waited(self) -> int:
        return self.waited_lo | self.waited_hi << 32


@dataclass
class Event:
    clock: int
    kind: str
    parity: int
    copy: int
    row: int  # -1: not a barrier of the table
    block: int


@dataclass
class Ring:
    index: int  # CTA * warps + warp
    kernel: int
    role: int
    smid: int
    start_clock: int
    start_ns: int
    events: list[Event] = field(default_factory=list)


@dataclass
class Area:
    claimed: int  # records claimed (more than len(records) when the area overflowed)
    records: list[Record]
    rings: list[Ring]
    warps: int


class HangError(RuntimeError):
    """A bounded wait of a debug build expired: the message names the barrier and the role."""


def decode(buf: bytes) -> Area:
    """The records and trace rings of a debug area (its bytes)."""
    magic, version, claimed, capacity, ctas, warps, events, rec_bytes = HEADER.unpack_from(buf)
    if magic != AREA_MAGIC:
        raise ValueError(f"not a debug area (magic {magic:#x})")
    if version != VERSION or rec_bytes != RECORD.size:
        raise ValueError(f"debug area version {version}, records of {rec_bytes} bytes: "
                         f"this fa4/debug.py reads version {VERSION}, {RECORD.size}")  # fmt: skip
    off = HEADER.size
    records = []
    for i in range(capacity):
        r = Record(*RECORD.unpack_from(buf, off + i * RECORD.size))
        if r.magic == RECORD_MAGIC:
            records.append(r)
    off += capacity * RECORD.size
    rings = []
    ring_bytes = RING_HEADER.size + events * EVENT.size
    for i in range(ctas * warps):
        base = off + i * ring_bytes
        written, kernel, role, smid, c_lo, c_hi, ns_lo, ns_hi = RING_HEADER.unpack_from(buf, base)
        if written == 0:
            continue
        ring = Ring(i, kernel, role, smid, c_lo | c_hi << 32, ns_lo | ns_hi << 32)
        for j in range(max(0, written - events), written):
            lo, hi, code, block = EVENT.unpack_from(
                buf, base + RING_HEADER.size + (j % events) * 16
            )
            ring.events.append(
                Event(lo | hi << 32, EVENT_KINDS.get(code & 0xF, f"kind {code & 0xF}"),
                      (code >> 4) & 1, (code >> 8) & 0xFF, ((code >> 16) & 0xFF) - 1, block)
            )  # fmt: skip
        rings.append(ring)
    return Area(claimed, records, rings, warps)


def role_name(kernel: int, role: int) -> str:
    k = KERNELS.get(kernel)
    if k is not None and 0 <= role < len(k.roles):
        return k.roles[role][1]
    return f"role {role}" if role >= 0 else "an unregistered role"


def bar_name(kernel: int, row: int, copy: int) -> str:
    k = KERNELS.get(kernel)
    if k is not None and 0 <= row < len(k.bars):
        return f"{k.bars[row]}[{copy}]"
    return f"barrier row {row}[{copy}]"


def describe(r: Record) -> str:
    """One line: who waited on what, where; then the CTA, warp and time."""
    k = KERNELS.get(r.kernel)
    bar = (
        bar_name(r.kernel, r.bar_row, r.bar_copy)
        if r.bar_row >= 0
        else f"the barrier at shared address {r.bar_addr:#x} (not in the table)"
    )
    text = f"{role_name(r.kernel, r.role)} waited on {bar} phase {r.parity}"
    if r.site_block >= 0:
        text += f" at {k.block if k else 'block'} {r.site_block}"
    if r.site_b >= 0:
        text += " of" if r.site_block >= 0 else " in"
        text += f" tile (b {r.site_b}, h {r.site_h}, {k.tile if k else 't'} {r.site_tile})"
    cta = f"CTA ({r.block_x}, {r.block_y}, {r.block_z}) rank {r.cluster_rank}"
    how = "timed out after" if r.timed_out else "still waiting after"
    return f"{text} [{cta}, warp {r.warp}, SM {r.smid}; {how} {r.waited} cycles]"


def message(area: Area) -> str | None:
    """The HangError text for an area, None when it holds no record."""
    if not area.records:
        return None
    first = next((r for r in area.records if r.timed_out), area.records[0])
    kernel = KERNELS.get(first.kernel)
    lines = [f"{kernel.name if kernel else f'kernel {first.kernel}'} hung: {describe(first)}"]
    others = [r for r in area.records if r is not first]
    if others:
        lines.append("waiting at the same time:")
        lines += [f"  {describe(r)}" for r in others]
    if area.claimed > len(area.records):
        lines.append(f"  ({area.claimed - len(area.records)} more waits not recorded)")
    return "\n".join(lines)


def read_library(path: str) -> bytes | None:
    """The debug area of the library at `path` (its exported fa4_debug_area), None when the
    library has none (not a debug build) or it was never allocated."""
    try:
        fn = ctypes.CDLL(path).fa4_debug_area
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_void_p
    fn.argtypes = [ctypes.POINTER(ctypes.c_size_t)]
    size = ctypes.c_size_t(0)
    ptr = fn(ctypes.byref(size))
    return ctypes.string_at(ptr, size.value) if ptr else None


@functools.cache
@functools.cache
def is_debug_build() -> bool:
    """Asked on every op call (guard): cached, the build does not change in a process."""
    from .build_info import CONFIG

    return bool(CONFIG.get("built") and CONFIG.get("sm100_debug"))


def read() -> Area | None:
    """The area of fa4's own extension, None in a normal build."""
    if not is_debug_build():
        return None
    from . import _C

    buf = read_library(_C.__file__)
    return decode(buf) if buf is not None else None


def raise_if_hung(cause: BaseException | None = None, area: Area | None = None) -> None:
    """Raises HangError (from `cause`) when the area (default: fa4's own) holds a record."""
    area = area if area is not None else read()
    text = message(area) if area is not None else None
    if text is not None:
        raise HangError(text) from cause


def guard(fn):
    """fn itself in a normal build; in a debug build fn followed by a device synchronize (outside
    stream capture), whose failure becomes a HangError when a wait expired."""
    if not is_debug_build():
        return fn

    @functools.wraps(fn)
    def run(*args, **kwargs):
        import torch

        try:
            out = fn(*args, **kwargs)
            if not torch.cuda.is_current_stream_capturing():
                torch.cuda.synchronize()
            return out
        except Exception as e:  # torch's CUDA errors: RuntimeError, torch.AcceleratorError
            raise_if_hung(e)
            raise

    return run

"""fa4/debug.py, the reader of a bring-up build's debug area (csrc/common/debug_wait.cuh), on the
CPU: the layout it decodes is the header's (g++ prints the offsets), the names it gives follow
the kernels' Role and Bar enums, and a synthetic area (records, trace events) decodes into the
message and events it encodes. The device side runs in tests/gpu/test_debug_wait.py.
"""

from __future__ import annotations

import re
import struct
import subprocess
from pathlib import Path

import pytest
from helpers import build_gxx, header_constant

from fa4 import debug

ROOT = Path(__file__).resolve().parents[2]
HEADER = ROOT / "csrc" / "common" / "debug_wait.cuh"
SOURCES = {
    1: ROOT / "csrc" / "sm100" / "fwd" / "kernel.cuh",
    2: ROOT / "csrc" / "sm100" / "bwd" / "kernel.cuh",
    3: ROOT / "csrc" / "sm100" / "bwd" / "kernel_2cta.cuh",
    4: ROOT / "csrc" / "sm100" / "fwd" / "kernel.cuh",  # the 2-CTA forward shares its enums
}
CAPACITY, CTAS, WARPS, EVENTS = 64, 2, 16, 1024


def _enum(text: str, name: str) -> list[str]:
    body = re.search(rf"enum class {name} : int \{{(.*?)\}};", text, re.S).group(1)
    body = re.sub(r"//[^\n]*", "", body)
    return [e.strip() for e in body.split(",") if e.strip() and e.strip() != "kCount"]


@pytest.mark.parametrize("kernel", sorted(SOURCES))
def test_names_follow_the_kernels_enums(kernel):
    text = SOURCES[kernel].read_text()
    k = debug.KERNELS[kernel]
    assert [e for e, _ in k.roles] == _enum(text, "Role")
    assert list(k.bars) == _enum(text, "Bar")


def test_kernel_ids_match_the_header():
    body = re.search(r"enum class KernelId : uint32_t \{(.*?)\};", HEADER.read_text(), re.S)
    ids = {int(v): n for n, v in re.findall(r"\b(k\w+) = (\d+),", body.group(1))}
    assert ids == {
        0: "kNone",
        1: "kFwdSm100",
        2: "kBwdSm100",
        3: "kBwdSm100Pair",
        4: "kFwdSm100Pair",
        90: "kProbe",
    }
    assert set(debug.KERNELS) == set(ids) - {0}


def test_constants_match_the_header():
    assert header_constant(HEADER, "kAreaMagic") == debug.AREA_MAGIC
    assert header_constant(HEADER, "kRecordMagic") == debug.RECORD_MAGIC
    assert header_constant(HEADER, "kVersion") == debug.VERSION
    assert header_constant(HEADER, "kMaxRecords") == CAPACITY
    assert header_constant(HEADER, "kTraceCtas") == CTAS
    assert header_constant(HEADER, "kTraceWarps") == WARPS
    assert header_constant(HEADER, "kTraceEvents") == EVENTS
    body = re.search(r"enum class Event : uint32_t \{(.*?)\};", HEADER.read_text(), re.S)
    kinds = {int(v): n for n, v in re.findall(r"\b(k\w+) = (\d+)", body.group(1))}
    assert kinds == {1: "kWaitBegin", 2: "kWaitEnd", 3: "kArrive", 4: "kCommit"}
    assert debug.EVENT_KINDS == {1: "wait", 2: "done", 3: "arrive", 4: "commit"}


LAYOUT_HARNESS = r"""
#include <cstddef>
#include <cstdio>
#include "common/debug_wait.cuh"
using namespace fa4::debug;
#define F(x) std::printf(#x " %zu\n", offsetof(Record, x));
int main() {
  F(magic) F(kernel) F(timed_out) F(block_x) F(smid) F(warp) F(role) F(bar_row) F(bar_copy)
  F(bar_addr) F(parity) F(site) F(waited_lo) F(waited_hi)
  std::printf("record %zu\nring %zu\nevent %zu\narea %zu\nrecords_at %zu\nrings_at %zu\n",
              sizeof(Record), sizeof(TraceRing), sizeof(TraceEvent), sizeof(Area),
              offsetof(Area, record), offsetof(Area, ring));
}
"""


@pytest.mark.build
def test_layout_is_the_headers(tmp_path):
    src = tmp_path / "debug_layout.cpp"
    src.write_text(LAYOUT_HARNESS)
    exe = build_gxx(src, tmp_path / "debug_layout")
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    got = {k: int(v) for k, v in (line.split() for line in out.splitlines())}
    names = [n for n, _ in debug.RECORD_FIELDS]
    for name in ("magic", "kernel", "timed_out", "block_x", "smid", "warp", "role", "bar_row",
                 "bar_copy", "bar_addr", "parity", "waited_lo", "waited_hi"):  # fmt: skip
        assert got[name] == 4 * names.index(name), name
    assert got["site"] == 4 * names.index("site_b")
    assert got["record"] == debug.RECORD.size == 96
    assert got["records_at"] == debug.HEADER.size
    assert got["rings_at"] == debug.HEADER.size + CAPACITY * debug.RECORD.size
    assert got["event"] == debug.EVENT.size
    assert got["ring"] == debug.RING_HEADER.size + EVENTS * debug.EVENT.size
    assert got["area"] == got["rings_at"] + CTAS * WARPS * got["ring"]


# ---- a synthetic area ------------------------------------------------------------------------


def _record(**kw) -> bytes:
    values = dict.fromkeys((n for n, _ in debug.RECORD_FIELDS), 0)
    values.update(magic=debug.RECORD_MAGIC, site_b=-1, site_h=-1, site_tile=-1, site_block=-1)
    values.update(kw)
    return debug.RECORD.pack(*(values[n] for n, _ in debug.RECORD_FIELDS))


def _area(records: list[bytes], rings: dict[int, tuple] | None = None, claimed=None) -> bytes:
    claimed = len(records) if claimed is None else claimed
    head = debug.HEADER.pack(
        debug.AREA_MAGIC, debug.VERSION, claimed, CAPACITY, CTAS, WARPS, EVENTS, debug.RECORD.size
    )
    body = b"".join(records) + bytes(debug.RECORD.size * (CAPACITY - len(records)))
    ring_bytes = debug.RING_HEADER.size + EVENTS * debug.EVENT.size
    trace = bytearray(CTAS * WARPS * ring_bytes)
    for i, (header, events) in (rings or {}).items():
        at = i * ring_bytes
        trace[at : at + debug.RING_HEADER.size] = debug.RING_HEADER.pack(*header)
        for j, ev in enumerate(events):
            e = at + debug.RING_HEADER.size + (j % EVENTS) * debug.EVENT.size
            trace[e : e + debug.EVENT.size] = debug.EVENT.pack(*ev)
    return head + body + bytes(trace)


CORRECTION_STUCK = dict(
    kernel=1, timed_out=1, block_x=5, smid=17, warp=9, lane=0, role=2, bar_row=6, bar_copy=1,
    bar_addr=0x30040, parity=0, site_b=0, site_h=2, site_tile=1, site_block=3,
    waited_lo=0x00000010, waited_hi=1,
)  # fmt: skip


def test_message_names_barrier_role_phase_and_site():
    area = debug.decode(_area([_record(**CORRECTION_STUCK)]))
    assert len(area.records) == 1 and area.records[0].waited == (1 << 32) + 16
    text = debug.message(area)
    assert text.startswith(
        "fwd_sm100 (csrc/sm100/fwd/kernel.cuh) hung: correction warpgroup waited on kSFull[1] "
        "phase 0 at KV block 3 of tile (b 0, h 2, m 1) [CTA (5, 0, 0) rank 0, warp 9, SM 17; "
        "timed out after 4294967312 cycles]"
    ), text


def test_other_waiters_are_listed_and_incomplete_records_ignored():
    mma = _record(kernel=1, timed_out=0, warp=12, role=3, bar_row=7, bar_copy=1, parity=1,
                  site_b=0, site_h=2, site_tile=1, site_block=3)  # fmt: skip
    torn = _record(magic=0, kernel=1, role=4)  # claimed, not yet complete: no magic
    area = debug.decode(_area([mma, _record(**CORRECTION_STUCK), torn], claimed=70))
    assert [r.role for r in area.records] == [3, 2]
    lines = debug.message(area).splitlines()
    # the record that timed out leads, though the MMA warp's was written first
    assert "correction warpgroup waited on kSFull[1] phase 0" in lines[0]
    assert lines[1] == "waiting at the same time:"
    assert lines[2].startswith("  MMA warp waited on kPFull[1] phase 1 at KV block 3 of tile")
    assert "still waiting after" in lines[2]
    assert lines[3] == "  (68 more waits not recorded)"


def test_backward_and_unknown_barriers():
    bwd2 = _record(kernel=3, role=5, bar_row=1, bar_copy=0, parity=1, block_x=1,
                   cluster_rank=1, site_b=1, site_h=0, site_tile=3, site_block=-1)  # fmt: skip
    line = debug.describe(debug.decode(_area([bwd2])).records[0])
    assert line.startswith("relay warp waited on kPeerKVFull[0] phase 1 in tile (b 1, h 0, n 3)")
    assert "CTA (1, 0, 0) rank 1" in line
    off_table = _record(kernel=2, role=3, bar_row=-1, bar_addr=0x1F0, site_block=7)
    line = debug.describe(debug.decode(_area([off_table])).records[0])
    assert line.startswith("MMA warp waited on the barrier at shared address 0x1f0 (not in the "
                           "table) phase 0 at Q block 7")  # fmt: skip


def test_empty_area_raises_nothing_and_bad_area_is_refused():
    area = debug.decode(_area([]))
    assert area.records == [] and debug.message(area) is None
    debug.raise_if_hung(area=area)  # no record: returns
    with pytest.raises(ValueError, match="not a debug area"):
        debug.decode(bytes(4096))


def test_raise_if_hung_chains_the_cuda_error():
    area = debug.decode(_area([_record(**CORRECTION_STUCK)]))
    cause = RuntimeError("CUDA error: unspecified launch failure")
    with pytest.raises(debug.HangError, match=r"kSFull\[1\] phase 0") as info:
        debug.raise_if_hung(cause, area=area)
    assert info.value.__cause__ is cause


def test_trace_events_decode_in_order_after_wraparound():
    # ring 17 = CTA 1, warp 1; EVENTS + 3 events written: the ring keeps the last EVENTS
    n = EVENTS + 3
    events = [None] * EVENTS
    for j in range(n):
        kind = 1 + j % 4
        code = kind | (j & 1) << 4 | 1 << 8 | (6 + 1) << 16  # kSFull[1]
        events[j % EVENTS] = ((1000 + 10 * j) & 0xFFFFFFFF, 0, code, j // 4)
    header = (n, 1, 0, 33, 990, 0, 123456, 0)
    area = debug.decode(_area([], {17: (header, events)}))
    (ring,) = area.rings
    assert (ring.index, ring.role, ring.smid, ring.start_clock, ring.start_ns) == (
        17, 0, 33, 990, 123456
    )  # fmt: skip
    assert len(ring.events) == EVENTS
    first = ring.events[0]
    assert (first.clock, first.kind, first.parity, first.copy, first.row, first.block) == (
        1000 + 30, "commit", 1, 1, 6, 0
    )  # fmt: skip
    clocks = [e.clock for e in ring.events]
    assert clocks == sorted(clocks) and clocks[-1] == 1000 + 10 * (n - 1)


def test_guard_is_the_function_itself_in_a_normal_build(monkeypatch):
    def f(x):
        return x + 1

    monkeypatch.setattr(debug, "is_debug_build", lambda: False)
    assert debug.guard(f) is f


def test_guard_turns_a_failed_launch_into_a_hang_error(monkeypatch):
    cause = RuntimeError("CUDA error: unspecified launch failure")

    def launch(*args):
        raise cause

    monkeypatch.setattr(debug, "is_debug_build", lambda: True)
    hung = debug.decode(_area([_record(**CORRECTION_STUCK)]))
    monkeypatch.setattr(debug, "read", lambda: hung)
    with pytest.raises(debug.HangError, match="correction warpgroup waited on kSFull") as info:
        debug.guard(launch)(1, 2)
    assert info.value.__cause__ is cause
    # a failure without a record stays the CUDA error it was
    monkeypatch.setattr(debug, "read", lambda: debug.decode(_area([])))
    with pytest.raises(RuntimeError) as info:
        debug.guard(launch)()
    assert info.value is cause


def test_record_layout_struct_is_consistent():
    assert struct.calcsize("<" + "".join(f for _, f in debug.RECORD_FIELDS)) == 96

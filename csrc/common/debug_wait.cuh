// Bounded mbarrier waits for bring-up builds: a wait that does not complete within a timeout
// writes a record naming the kernel, CTA, warp, role, barrier (row and copy of the kernel's
// barrier table), expected parity and the loop position the role registered, into host-mapped
// memory, then traps. The SM100 kernels use it when compiled with -DFA4_SM100_DEBUG (setup.py:
// FA4_SM100_DEBUG=1; sm100/common.cuh's bar_wait); any kernel (the SM90 probe test included)
// may call debug::wait directly. fa4/debug.py decodes the area; docs/sm100.md, "Bring-up kit".
//
// Note [debug area]: how the device finds things.
//   Area    one per library, cudaHostAllocMapped, 0.5 MB: the records and the trace rings. The host
//           finds it through the exported C function fa4_debug_area (fa4/debug.py: ctypes on
//           the extension's library); it stays readable after the trap has ended the CUDA
//           context, which is the point.
//   Config  a `static __device__` struct per translation unit (the area's device address, the
//           timeout, the trace switch), copied once per device by attach(), which the launch
//           code of that unit calls before its kernel: kernel parameters stay as they are.
//   Cta     per SM (%smid; every SM100 kernel runs one CTA per SM: 512 threads of 128
//           registers), written by kernel_begin: the kernel id, the barriers' shared-memory
//           address and the table's row starts, so a wait derives (row, copy) from its
//           barrier's address alone.
//   Site    per SM and warp: the role and the loop position (tile, block) the role registered
//           with site_tile / site_block; device memory, plain stores, read only on expiry.
// A wait's fast path is one try_wait; the spin adds a clock64 read per try. Default timeout
// 2^32 cycles (2.2 s at 1.98 GHz), FA4_DEBUG_WAIT_CYCLES at attach time overrides it. The first
// wait to expire sets a flag that every other spinning wait checks: they record themselves too
// (flag `timed_out` 0), so the records show every role that was waiting, and the first traps
// after a grace of timeout / 16.
#pragma once

#include <stdint.h>

namespace fa4::debug {

// Kernel ids: fa4/debug.py KERNELS names the roles and barriers of each.
enum class KernelId : uint32_t {
  kNone = 0,
  kFwdSm100 = 1,      // sm100/fwd/kernel.cuh
  kBwdSm100 = 2,      // sm100/bwd/kernel.cuh
  kBwdSm100Pair = 3,  // sm100/bwd/kernel_2cta.cuh
  kFwdSm100Pair = 4,  // sm100/fwd/kernel_2cta.cuh
  kProbe = 90,        // tests/gpu/test_debug_wait.py's planted-bug kernel (runs on SM90)
};

constexpr uint32_t kAreaMagic = 0xFA4DA7A0u;
constexpr uint32_t kRecordMagic = 0xFA4DEADFu;
constexpr uint32_t kVersion = 1;
constexpr int kMaxRecords = 64;
constexpr int kSiteWords = 4;  // tile (b, h, m or n), block index
constexpr int kTraceCtas = 2;  // blockIdx.x 0 and 1 (a 2-CTA cluster)
constexpr int kTraceWarps = 16;
constexpr int kTraceEvents = 1024;
constexpr int kMaxRows = 31;  // barrier table rows a kernel may have
constexpr int kMaxSms = 256;
constexpr int kMaxWarps = 32;
constexpr uint64_t kDefaultWaitCycles = 1ull << 32;

// 32-bit words only, so that fa4/debug.py reads it with one struct format (RECORD_FIELDS).
struct Record {
  uint32_t magic;  // kRecordMagic once the record is complete
  uint32_t kernel;
  uint32_t timed_out;  // 1: this wait expired; 0: it was waiting when another one expired
  uint32_t block_x, block_y, block_z;
  uint32_t cluster_rank;
  uint32_t smid;
  uint32_t warp;
  uint32_t lane;
  int32_t role;       // the kernel's Role enumerator, -1: not registered
  int32_t bar_row;    // the barrier's row in kBarriers (its Bar enumerator), -1: unknown
  int32_t bar_copy;   // which copy of the row
  uint32_t bar_addr;  // shared-memory address of the barrier
  uint32_t parity;    // the phase parity waited for
  int32_t site[kSiteWords];
  uint32_t waited_lo, waited_hi;  // cycles spent in the wait
  uint32_t reserved[3];
};
static_assert(sizeof(Record) == 96, "fa4/debug.py RECORD_FIELDS");

enum class Event : uint32_t { kWaitBegin = 1, kWaitEnd = 2, kArrive = 3, kCommit = 4 };
// code: kind | parity << 4 | copy << 8 | (row + 1) << 16 (row + 1 = 0: unknown barrier)
struct TraceEvent {
  uint32_t clock_lo, clock_hi;  // clock64 of the SM
  uint32_t code;
  int32_t block;  // the site's block index at the event
};
struct TraceRing {
  uint32_t written;  // events written (the ring keeps the last kTraceEvents)
  uint32_t kernel;
  int32_t role;
  uint32_t smid;
  uint32_t start_clock_lo, start_clock_hi;  // clock64 at kernel_begin
  uint32_t start_ns_lo, start_ns_hi;        // %globaltimer at kernel_begin: aligns the SMs
  TraceEvent events[kTraceEvents];
};
struct Area {
  uint32_t magic, version, records, capacity;  // records: claimed (may exceed capacity)
  uint32_t trace_ctas, trace_warps, trace_events, record_bytes;
  Record record[kMaxRecords];
  TraceRing ring[kTraceCtas * kTraceWarps];
};
static_assert(sizeof(TraceEvent) == 16 && sizeof(TraceRing) == 32 + 16 * kTraceEvents,
              "fa4/debug.py trace layout");

// Device-side bookkeeping (Note [debug area]).
struct Config {
  Area* area;  // device address of the host-mapped area; null: trap without a record
  uint64_t timeout;
  uint32_t trace;
};
struct Cta {
  uint32_t kernel, bars_addr, rows, pad;
  uint16_t row_start[kMaxRows + 1];
};
struct Site {
  int32_t role;
  int32_t site[kSiteWords];
  uint32_t trace_head;
  int32_t ring;  // trace ring of this warp, -1: not traced
  uint32_t pad;
};

}  // namespace fa4::debug

#if defined(__CUDACC__)
#include <stdlib.h>
#include <string.h>

#include <utility>

#include <cuda_runtime.h>

namespace fa4::debug {

// Per translation unit (static): Note [debug area].
static __device__ Config g_config;
static __device__ Cta g_cta[kMaxSms];
static __device__ Site g_site[kMaxSms][kMaxWarps];
static __device__ uint32_t g_expired;  // set by the first wait to expire
static __device__ uint32_t g_claimed;  // records claimed

__device__ __forceinline__ uint32_t smid() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(r));
  return r % kMaxSms;
}
__device__ __forceinline__ uint32_t lane_id() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%laneid;" : "=r"(r));
  return r;
}
__device__ __forceinline__ uint32_t cluster_rank() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
#else
  return 0;
#endif
}
__device__ __forceinline__ uint64_t global_ns() {
  uint64_t r;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(r));
  return r;
}
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// The lowest active lane of the warp writes the warp's records and events.
__device__ __forceinline__ bool warp_leader() {
  return lane_id() == uint32_t(__ffs(__activemask()) - 1);
}
__device__ __forceinline__ Site& my_site() {
  return g_site[smid()][(threadIdx.x / 32) % kMaxWarps];
}

// (row, copy) of the barrier at shared-memory address addr, from this CTA's table.
__device__ __forceinline__ void locate(uint32_t addr, int& row, int& copy) {
  const Cta& c = g_cta[smid()];
  row = -1;
  copy = 0;
  if (c.rows == 0 || addr < c.bars_addr) return;
  const uint32_t flat = (addr - c.bars_addr) / 8;
  for (uint32_t r = 0; r < c.rows && r < uint32_t(kMaxRows); ++r) {
    if (flat >= c.row_start[r] && flat < c.row_start[r + 1]) {
      row = int(r);
      copy = int(flat - c.row_start[r]);
    }
  }
}

// Where row r of the table starts in the kernel's barrier array. A variable template, so that
// device code reads constants: the table itself is host data, and device code reading it at a
// run-time index is undefined (ptxas drops the whole thread-0 block that does).
template <class Table, int R>
constexpr uint16_t kRowStart = [] {
  int start = 0;
  for (int r = 0; r < R; ++r) start += Table::copies(r);
  return uint16_t(start);
}();
template <class Table, int... R>
__device__ __forceinline__ void write_row_starts(uint16_t* dst, std::integer_sequence<int, R...>) {
  ((dst[R] = kRowStart<Table, R>), ...);
}

// Called by every thread of the CTA before its first wait (thread 0 writes the CTA's entry,
// each warp's leader its site and trace ring header); the kernel's next __syncthreads orders
// these writes before any wait of another warp. Table: the kernel's BarrierTable.
template <class Table>
__device__ __forceinline__ void kernel_begin(KernelId kernel, const uint64_t* bars, int role) {
  static_assert(Table::kRows <= kMaxRows, "debug::kMaxRows");
  const uint32_t sm = smid();
  if (threadIdx.x == 0) {
    Cta& c = g_cta[sm];
    c.kernel = uint32_t(kernel);
    c.bars_addr = smem_addr(bars);
    c.rows = Table::kRows;
    write_row_starts<Table>(c.row_start, std::make_integer_sequence<int, Table::kRows + 1>{});
  }
  if (warp_leader()) {
    const int warp = int(threadIdx.x / 32);
    Site& s = g_site[sm][warp % kMaxWarps];
    s.role = role;
    for (int i = 0; i < kSiteWords; ++i) s.site[i] = -1;
    s.trace_head = 0;
    s.ring = -1;
    Area* a = g_config.area;
    if (g_config.trace && a != nullptr && blockIdx.y == 0 && blockIdx.z == 0 &&
        blockIdx.x < uint32_t(kTraceCtas) && warp < kTraceWarps) {
      s.ring = int(blockIdx.x) * kTraceWarps + warp;
      TraceRing& ring = a->ring[s.ring];
      const uint64_t clk = clock64(), ns = global_ns();
      ring.written = 0;
      ring.kernel = uint32_t(kernel);
      ring.role = role;
      ring.smid = sm;
      ring.start_clock_lo = uint32_t(clk);
      ring.start_clock_hi = uint32_t(clk >> 32);
      ring.start_ns_lo = uint32_t(ns);
      ring.start_ns_hi = uint32_t(ns >> 32);
    }
  }
}

// The loop position a role is at: a tile (three coordinates, the kernel's) and a block index.
__device__ __forceinline__ void site_tile(int b, int h, int t) {
  Site& s = my_site();
  s.site[0] = b;
  s.site[1] = h;
  s.site[2] = t;
  s.site[3] = -1;
}
__device__ __forceinline__ void site_block(int n) {
  my_site().site[3] = n;
}

__device__ __forceinline__ void trace(Event kind, uint32_t addr, uint32_t parity) {
  if (!g_config.trace) return;
  Site& s = my_site();
  if (s.ring < 0 || !warp_leader()) return;
  int row, copy;
  locate(addr, row, copy);
  TraceRing& ring = g_config.area->ring[s.ring];
  const uint32_t i = s.trace_head++;
  const uint64_t clk = clock64();
  TraceEvent& e = ring.events[i % kTraceEvents];
  e.clock_lo = uint32_t(clk);
  e.clock_hi = uint32_t(clk >> 32);
  e.code =
      uint32_t(kind) | (parity & 1u) << 4 | uint32_t(copy & 0xff) << 8 | uint32_t(row + 1) << 16;
  e.block = s.site[3];
  ring.written = i + 1;
}

// Writes this warp's record (its leader's) into the next free slot.
__device__ __forceinline__ void write_record(uint32_t addr, uint32_t parity, uint64_t waited,
                                             bool timed_out) {
  Area* a = g_config.area;
  if (a == nullptr || !warp_leader()) return;
  const uint32_t slot = atomicAdd(&g_claimed, 1u);
  a->records = slot + 1;
  if (slot >= uint32_t(kMaxRecords)) return;
  Record& r = a->record[slot];
  const uint32_t sm = smid();
  const Site& s = g_site[sm][(threadIdx.x / 32) % kMaxWarps];
  int row, copy;
  locate(addr, row, copy);
  r.kernel = g_cta[sm].kernel;
  r.timed_out = timed_out ? 1u : 0u;
  r.block_x = blockIdx.x;
  r.block_y = blockIdx.y;
  r.block_z = blockIdx.z;
  r.cluster_rank = cluster_rank();
  r.smid = sm;
  r.warp = threadIdx.x / 32;
  r.lane = lane_id();
  r.role = s.role;
  r.bar_row = row;
  r.bar_copy = copy;
  r.bar_addr = addr;
  r.parity = parity;
  for (int i = 0; i < kSiteWords; ++i) r.site[i] = s.site[i];
  r.waited_lo = uint32_t(waited);
  r.waited_hi = uint32_t(waited >> 32);
  __threadfence_system();
  r.magic = kRecordMagic;
  __threadfence_system();
}

template <bool kCluster>
__device__ __forceinline__ bool try_wait(uint32_t addr, uint32_t parity) {
  uint32_t done;
  if constexpr (kCluster) {
    asm volatile(
        "{\n\t.reg .pred p;\n\t"
        "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n\t"
        "selp.u32 %0, 1, 0, p;\n\t}"
        : "=r"(done)
        : "r"(addr), "r"(parity)
        : "memory");
  } else {
    asm volatile(
        "{\n\t.reg .pred p;\n\t"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
        "selp.u32 %0, 1, 0, p;\n\t}"
        : "=r"(done)
        : "r"(addr), "r"(parity)
        : "memory");
  }
  return done != 0;
}

// The bounded wait: try_wait until the phase with `parity` completes, or record and trap after
// the timeout. kCluster: acquire at cluster scope (the 2-CTA backward's waits).
template <bool kCluster = false>
__device__ __forceinline__ void wait(uint64_t* bar, uint32_t parity) {
  const uint32_t addr = smem_addr(bar);
  trace(Event::kWaitBegin, addr, parity);
  if (!try_wait<kCluster>(addr, parity)) {
    const uint64_t timeout = g_config.timeout ? g_config.timeout : kDefaultWaitCycles;
    const uint64_t t0 = clock64();
    bool noted = false;  // recorded as waiting when another wait expired: one record per warp
    while (!try_wait<kCluster>(addr, parity)) {
      const uint64_t waited = clock64() - t0;
      const bool expired = waited > timeout;
      if (!noted && (expired || *static_cast<volatile uint32_t*>(&g_expired) != 0u)) {
        if (expired) atomicExch(&g_expired, 1u);
        write_record(addr, parity, waited, expired);
        noted = true;
        if (expired) {
          const uint64_t grace = timeout / 16 > (1ull << 20) ? timeout / 16 : (1ull << 20);
          const uint64_t t1 = clock64();
          while (clock64() - t1 < grace) {
          }
          __threadfence_system();
          __trap();
        }
      }
    }
  }
  trace(Event::kWaitEnd, addr, parity);
}

}  // namespace fa4::debug

// The area of this library (Note [debug area]), allocated on first use; *bytes: its size.
// Weak, not inline: every unit that includes this emits it, the linker keeps one (one area per
// library), and the symbol stays in the library's dynamic table for ctypes.
extern "C" __attribute__((weak, used, visibility("default"))) void* fa4_debug_area(size_t* bytes) {
  static void* area = [] {
    void* p = nullptr;
    if (cudaHostAlloc(&p, sizeof(fa4::debug::Area), cudaHostAllocMapped | cudaHostAllocPortable) !=
        cudaSuccess) {
      return static_cast<void*>(nullptr);
    }
    memset(p, 0, sizeof(fa4::debug::Area));
    auto* a = static_cast<fa4::debug::Area*>(p);
    a->version = fa4::debug::kVersion;
    a->capacity = fa4::debug::kMaxRecords;
    a->trace_ctas = fa4::debug::kTraceCtas;
    a->trace_warps = fa4::debug::kTraceWarps;
    a->trace_events = fa4::debug::kTraceEvents;
    a->record_bytes = sizeof(fa4::debug::Record);
    a->magic = fa4::debug::kAreaMagic;
    return p;
  }();
  if (bytes != nullptr) *bytes = sizeof(fa4::debug::Area);
  return area;
}

namespace fa4::debug {

// Points this translation unit's Config at the area, once per device; the launch code calls it
// before each kernel. Skipped while `stream` is being captured (a synchronous copy would end the
// capture): a kernel launched before any uncaptured launch of its unit traps without a record.
// FA4_DEBUG_WAIT_CYCLES (cycles, decimal) and FA4_DEBUG_TRACE=1 are read here.
static inline void attach(cudaStream_t stream) {
  constexpr int kMaxDevices = 64;
  static bool attached[kMaxDevices] = {};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices || attached[dev]) {
    return;
  }
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess ||
      capture != cudaStreamCaptureStatusNone) {
    return;
  }
  Config c{};
  void* host = fa4_debug_area(nullptr);
  void* device = nullptr;
  if (host != nullptr && cudaHostGetDevicePointer(&device, host, 0) == cudaSuccess) {
    c.area = static_cast<Area*>(device);
  }
  const char* cycles = getenv("FA4_DEBUG_WAIT_CYCLES");
  c.timeout = cycles != nullptr ? strtoull(cycles, nullptr, 10) : kDefaultWaitCycles;
  const char* trace = getenv("FA4_DEBUG_TRACE");
  c.trace = trace != nullptr && trace[0] == '1' && c.area != nullptr ? 1u : 0u;
  if (cudaMemcpyToSymbol(g_config, &c, sizeof(c)) == cudaSuccess) attached[dev] = true;
}

}  // namespace fa4::debug
#endif  // __CUDACC__

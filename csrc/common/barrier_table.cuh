// One barrier table for every SM100 kernel (forward, backward, 2-CTA backward). A kernel lists its
// mbarriers as an `enum class Bar` of events (kKFull, kSFull, ...; the last enumerator kCount)
// and a table kBarriers of one BarSpec row per enumerator, in the enum's order:
//   {Bar::kKFull, BarCopies::kPerStage, 1}    barrier, how many copies, arrive count at init
// The copies column is a kind (per K/V stage, per Q tile, once, ...) that the kernel's copies
// policy turns into a number: a class with `static constexpr int copies(BarCopies)`. It is a class
// of its own rather than a member of the kernel's traits because the traits' SharedStorage sizes
// its barrier array while the traits are still incomplete. BarrierTable<kBarriers, Policy> then
// gives, all at compile time:
//   kCount          copies of all rows: SharedStorage's `uint64_t bars[kCount]`
//   offset(b)       where barrier b's copies start in bars (copies of a row are contiguous, rows in
//                   table order)
//   at<b>(bars, i)  copy i of barrier b
//   init(bars)      mbarrier.init of every copy of every row with the row's arrive count, row by
//                   row in table order (one thread; the caller then fences, fence_barrier_init)
// and bar_ptr<T, Bar::kKFull>(ss, i) names copy i in kernel T's SharedStorage (T::Barriers is
// its table). The protocol models (tools/protocol_model*.py) parse the enum and the rows from the
// kernels' sources: keep one row per line.
#pragma once

#include <stdint.h>

#include <type_traits>
#include <utility>

#include <cutlass/arch/barrier.h>

#include "common/host_device.cuh"

namespace fa4 {

template <class Bar, class Copies>
struct BarSpec {
  Bar bar;
  Copies copies;  // a kind, resolved by the kernel's copies policy
  int arrivals;   // arrive count at init; TMA ("tx") barriers also count bytes
};

// One row per enumerator of Bar (before kCount), in the enum's order: the order in which init
// runs and the protocol models read the rows.
template <class Bar, class Copies, int N>
constexpr bool rows_follow_enum(const BarSpec<Bar, Copies> (&rows)[N]) {
  if (N != int(Bar::kCount)) return false;
  for (int i = 0; i < N; ++i) {
    if (int(rows[i].bar) != i) return false;
  }
  return true;
}

// The copies policy of a kernel whose barriers all have one copy.
struct OneCopyEach {
  template <class Kind>
  static constexpr int copies(Kind) {
    return 1;
  }
};

template <const auto& kTable, class Policy>
struct BarrierTable {
  using Spec = std::remove_cv_t<std::remove_reference_t<decltype(kTable[0])>>;
  using Bar = decltype(Spec::bar);
  static constexpr int kRows = int(sizeof(kTable) / sizeof(kTable[0]));
  static_assert(rows_follow_enum(kTable), "one row per barrier, in the order of enum Bar");

  // (Policy::copies directly: a member function is not usable in the constant expressions of
  // its own class's definition.)
  static constexpr int copies(int row) { return Policy::copies(kTable[row].copies); }
  static constexpr int kCount = [] {
    int n = 0;
    for (const Spec& s : kTable) n += Policy::copies(s.copies);
    return n;
  }();
  // 0 copies: a row of the shared enum that this kernel does not use (the SM100 forward's
  // BarCopies::kNone: the 1-CTA kernel has no peer barriers, the 2-CTA kernel no tile ring).
  static_assert(
      [] {
        for (const Spec& s : kTable) {
          if (Policy::copies(s.copies) < 0 || s.arrivals < 1) return false;
        }
        return true;
      }(),
      "every barrier has a copy count >= 0 and at least one arrival");

  // Compile time only: the table is host data, which device code reads in constant expressions.
  static constexpr int row_of(Bar b) {
    for (int r = 0; r < kRows; ++r) {
      if (kTable[r].bar == b) return r;
    }
    return 0;
  }
  static constexpr int offset(Bar b) {
    int n = 0;
    for (int r = 0; r < kRows; ++r) {
      if (kTable[r].bar == b) return n;
      n += copies(r);
    }
    return -1;
  }

  template <Bar b>
  __device__ static __forceinline__ uint64_t* at(uint64_t* bars, int i = 0) {
    constexpr int kOffset = offset(b);
    static_assert(kOffset >= 0, "barrier missing from the table");
    static_assert(copies(row_of(b)) > 0, "barrier with no copies in this kernel (kNone)");
    return &bars[kOffset + i];
  }

  __device__ static __forceinline__ void init(uint64_t* bars) {
    init_rows(bars, std::make_integer_sequence<int, kRows>{});
  }

 private:
  template <int... R>
  __device__ static __forceinline__ void init_rows(uint64_t* bars,
                                                   std::integer_sequence<int, R...>) {
    (init_row<R>(bars), ...);
  }
  template <int R>
  __device__ static __forceinline__ void init_row(uint64_t* bars) {
    constexpr Spec kSpec = kTable[R];
    constexpr int kCopies = copies(R);
    if constexpr (kCopies > 0) {
      FA4_UNROLL
      for (int i = 0; i < kCopies; ++i) {
        cutlass::arch::ClusterBarrier::init(at<kSpec.bar>(bars, i), kSpec.arrivals);
      }
    }
  }
};

// Copy i of barrier b of kernel T: T::Barriers is its table, ss.bars the array it sizes.
template <class T, auto b>
__device__ __forceinline__ uint64_t* bar_ptr(typename T::SharedStorage& ss, int i = 0) {
  return T::Barriers::template at<b>(ss.bars, i);
}

}  // namespace fa4

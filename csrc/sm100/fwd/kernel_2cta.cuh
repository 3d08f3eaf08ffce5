// SM100 (Blackwell) forward, 2-CTA variant (Note [fwd 2-CTA]): a cluster of two CTAs owns 256
// query rows, and the even CTA's MMA thread issues tcgen05.mma.cta_group::2 over both. Compiled,
// not executed: no Blackwell GPU is available to this project (DESIGN §2); docs/sm100.md has the
// operands, the shared-memory budget and the barrier protocol.
//
// Note [fwd 2-CTA]: CTA r of the pair holds Q tile 2 m + r (128 rows, its TMEM lanes) and walks
// the KV blocks of both tiles' union (both CTAs the same blocks: their MMAs are one), 128 keys per
// block, in the one-tile order of Note [one-tile order] (S double-buffered, one O):
//   S = Q·Kᵀ   M 256 (each CTA its 128 rows), N 128 keys, K d
//              B: this CTA's 64 keys of the block (sK, 64 × d): the MMA's N is split by CTA
//   O += P·V   M 256, N d_v, K 128 keys; A: P from each CTA's TMEM (the TS form)
//              B: all 128 keys, this CTA's d_v / 2 columns (sV, 128 × d_v / 2)
// Each CTA stages half of K and half of V per block: the shared-memory reads per MMA FLOP of K and
// V halve against the 1-CTA kernel at hd 256 (kBlockN 64, its 192 KB hold no more), which the
// cycle model finds shared-memory-bound (docs/perfmodel.md: 1453 -> 1730 TFLOP/s at 16k).
// TMEM per CTA: S0 | S1 | O = 128 + 128 + d_v (512 at d_v 256).
//
// The roles are the 1-CTA kernel's (sm100/fwd/kernel.cuh) with T::kPair: the softmax and
// correction warpgroups of each CTA wait on their own barriers at cluster scope (the even CTA's
// commits reach both CTAs: tcgen05.commit multicast) and arrive on the even CTA's kPFull and
// kORescaled (256 arrivals: both CTAs' threads). The load thread of each CTA loads its Q tile and
// its halves; the odd CTA's loads reach the even CTA's MMA thread through a relay (the epilogue
// warp's lane 0, which has no TMA store here): it waits for its CTA's transactions and arrives on
// the even CTA's kPeer* barriers. One work item per cluster (the grid is twice the items, in the
// scheduler's order): no tile ring, and no next tile waits for Q or O (the kNone rows).
#pragma once

#include <cute/arch/tmem_allocator_sm100.hpp>

#include "sm100/fwd/kernel.cuh"

namespace fa4::sm100 {

// The barriers of the 2-CTA forward: kBarriers' rows (sm100/fwd/kernel.cuh, one enum Bar) with
// the arrivals of two CTAs where both arrive on the even CTA's copy, the relay's peer barriers,
// and kNone where the pair has no such connection (one work item per cluster, no TMA store).
// The protocol model reads this table too; keep one entry per line, in this format.
// clang-format off
inline constexpr BarSpec<Bar, BarCopies> kBarriersPair[] = {
    {Bar::kQFull,       BarCopies::kPerQTile,   1},
    {Bar::kQEmpty,      BarCopies::kNone,       1},
    {Bar::kKFull,       BarCopies::kPerStage,   1},
    {Bar::kKEmpty,      BarCopies::kPerStage,   1},
    {Bar::kVFull,       BarCopies::kPerStage,   1},
    {Bar::kVEmpty,      BarCopies::kPerStage,   1},
    {Bar::kSFull,       BarCopies::kPerSBuffer, 1},
    {Bar::kPFull,       BarCopies::kPerSBuffer, 256},
    {Bar::kStatsFull,   BarCopies::kPerQTile, 128},
    {Bar::kStatsEmpty,  BarCopies::kPerQTile, 128},
    {Bar::kOFull,       BarCopies::kPerQTile,   1},
    {Bar::kORescaled,   BarCopies::kPerQTile, 256},
    {Bar::kOEmpty,      BarCopies::kNone,     128},
    {Bar::kOStageFull,  BarCopies::kNone,     128},
    {Bar::kOStageEmpty, BarCopies::kNone,       1},
    {Bar::kTileFull,    BarCopies::kNone,       1},
    {Bar::kTileEmpty,   BarCopies::kNone,       1},
    {Bar::kPeerQFull,   BarCopies::kPerQTile,   1},
    {Bar::kPeerKFull,   BarCopies::kPerStage,   1},
    {Bar::kPeerVFull,   BarCopies::kPerStage,   1},
};
// clang-format on
static_assert(rows_follow_enum(kBarriersPair), "kBarriersPair: one row per barrier, enum order");

// ---- Traits ------------------------------------------------------------------------------
// The members the shared roles read, with the 1-CTA traits' meaning (FwdTraits), for a pair.
template <int kHeadDim_, int kHeadDimV_, class Element_>
struct FwdTraits2 {
  using Element = Element_;
  using OutElement = Element;
  static constexpr bool kFp8 = false;  // the FP8 forward is the 1-CTA kernel's
  static constexpr bool kPair = true;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kHeadDimV = kHeadDimV_;
  static constexpr int kBlockM = 128;  // this CTA's Q tile: its TMEM lanes
  static constexpr int kBlockN = 128;  // keys per KV block: the pair MMA's N of S
  static constexpr int kKRows = kBlockN / 2;
  static constexpr int kVCols = kHeadDimV / 2;
  using Plan = FwdTmemPlan<kHeadDimV, kBlockN>;
  static constexpr int kQTiles = 1;
  static_assert(Plan::kQTiles == kQTiles, "a pair CTA double-buffers S next to its one O");
  static constexpr int kItemTiles = 2;  // a work item: the pair's two Q tiles
  static constexpr int kCtaRows = kItemTiles * kBlockM;
  static constexpr int kStages = 2;
  static constexpr int kThreads = 32 * kWarps;
  // Note [exp2 column split]: the 1-CTA traits' shares (the row is 128 columns, as at hd 128).
  static constexpr int kEmuSixteenths = kHeadDim <= 192 ? 4 : 0;
  static constexpr float kTau = 8.0f;  // Note [conditional rescale]
  static constexpr int kMmaK = 16;

  // Descriptor atoms: 1-CTA shapes of this CTA's operands, whose shared-memory descriptors the
  // cta_group::2 MMA reads at the same offsets in both CTAs; the instruction descriptors carry
  // the pair's M (256) and N (kBlockN, d_v).
  using DescS = SM100_MMA_F16BF16_SS<Element, Element, float, kBlockM, kKRows, UMMA::Major::K,
                                     UMMA::Major::K>;
  using DescO = SM100_MMA_F16BF16_TS<Element, Element, float, kBlockM, kVCols, UMMA::Major::K,
                                     UMMA::Major::MN>;

  using SmemLayoutQ = decltype(tile_to_shape(smem_atom_k<Element, kHeadDim>(),
                                             Shape<Int<kBlockM>, Int<kHeadDim>, _1>{}));
  using SmemLayoutK = decltype(tile_to_shape(smem_atom_k<Element, kHeadDim>(),
                                             Shape<Int<kKRows>, Int<kHeadDim>, Int<kStages>>{}));
  using SmemLayoutV = decltype(tile_to_shape(smem_atom_k<Element, kVCols>(),
                                             Shape<Int<kBlockN>, Int<kVCols>, Int<kStages>>{}));
  using SmemLayoutVt = TransposedSmem<SmemLayoutV, kBlockN, kVCols, kStages>;
  using SmemLayoutO = decltype(tile_to_shape(smem_atom_k<Element, kHeadDimV>(),
                                             Shape<Int<kBlockM>, Int<kHeadDimV>>{}));
  static constexpr bool kTmaStoreO = false;  // no room at hd 256; the correction stores O

  using Barriers = BarrierTable<kBarriersPair, FwdBarCopies<kQTiles, kStages>>;
  // Shared memory per CTA (bf16/fp16, two stages):
  //   hd 256: Q 64 KB + K 2 × 32 KB + V 2 × 32 KB = 192 KB + 1 KB
  //   hd 192: Q 48 KB + K 2 × 24 KB + V 2 × 24 KB = 144 KB + 1 KB
  struct SharedStorage {
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutQ>> q;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutK>> k;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutV>> v;
    alignas(16) cute::array_aligned<Element, 8> o;  // (no staging buffer)
    alignas(16) float stat_a[kQTiles][kBlockM];
    float stat_b[kQTiles][kBlockM];
    alignas(8) uint64_t bars[Barriers::kCount];
    TileCoord tile_item[1];  // the cluster's work item (take_tile)
    uint32_t tmem_base;
  };
  static constexpr int kSmemBytes = sizeof(SharedStorage);
  static_assert(kSmemBytes <= 227 * 1024, "shared memory budget (227 KB per CTA on SM100)");

  static constexpr uint32_t kQBytes = kBlockM * kHeadDim * sizeof(Element);
  static constexpr uint32_t kKBytes = kKRows * kHeadDim * sizeof(Element);
  static constexpr uint32_t kVBytes = kBlockN * kVCols * sizeof(Element);
};

// ---- Load role (lane 0 of the load warp, each CTA) ------------------------------------------
template <class T>
__device__ void load_role_pair(const KernelParams<T>& kp, typename T::SharedStorage& ss) {
  const int rank = int(cute::block_rank_in_cluster());
  Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename T::SmemLayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename T::SmemLayoutK{});
  Tensor sV = make_tensor(make_smem_ptr(ss.v.data()), typename T::SmemLayoutV{});
  Tensor mQ = kp.tma_q.get_tma_tensor(kp.shape_q);
  Tensor mK = kp.tma_k.get_tma_tensor(kp.shape_k);
  Tensor mV = kp.tma_v.get_tma_tensor(kp.shape_v);
  const TileWork t = tile_work(kp, take_tile<T>(ss, 0));
  FA4_SM100_DEBUG_TILE(t.tile.batch, t.tile.head, t.tile.m_block);
  if (t.blocks() <= 0) return;  // correction writes zeros; nothing to load
  const int head_kv = t.tile.head / kp.group;
  Tensor gQ = local_tile(
      domain_offset(make_coord(t.seq.offset_q, _0{}), mQ(_, _, t.tile.head, t.bidb_gmem)),
      Shape<Int<T::kBlockM>, Int<T::kHeadDim>>{}, make_coord(_, _0{}));
  // K in half blocks of 64 rows (block n: half blocks 2 n and 2 n + 1, this CTA's 2 n + rank);
  // V in blocks of 128 rows, this CTA's column half.
  Tensor gK =
      local_tile(domain_offset(make_coord(t.seq.offset_k, _0{}), mK(_, _, head_kv, t.bidb_gmem)),
                 Shape<Int<T::kKRows>, Int<T::kHeadDim>>{}, make_coord(_, _0{}));
  Tensor gV =
      local_tile(domain_offset(make_coord(t.seq.offset_k, _0{}), mV(_, _, head_kv, t.bidb_gmem)),
                 Shape<Int<T::kBlockN>, Int<T::kVCols>>{}, make_coord(_, rank));
  auto [tQgQ, tQsQ] =
      tma_partition(kp.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ), group_modes<0, 2>(gQ));
  auto [tKgK, tKsK] =
      tma_partition(kp.tma_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK), group_modes<0, 2>(gK));
  auto [tVgV, tVsV] =
      tma_partition(kp.tma_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sV), group_modes<0, 2>(gV));
  uint64_t& qfull = *bar_ptr<T, Bar::kQFull>(ss, 0);
  cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&qfull, T::kQBytes);
  copy(kp.tma_q.with(qfull, 0), tQgQ(_, q_tile_of<T>(t.tile, 0)), tQsQ(_, 0));
  Ring k_free, v_free;
  for (int n = t.n_end - 1; n >= t.n_begin; --n) {
    FA4_SM100_DEBUG_BLOCK(n);
    const int ks = k_free.index(T::kStages);
    bar_wait_cluster(bar_ptr<T, Bar::kKEmpty>(ss, ks), k_free.parity(T::kStages) ^ 1u);
    uint64_t& kfull = *bar_ptr<T, Bar::kKFull>(ss, ks);
    cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&kfull, T::kKBytes);
    copy(kp.tma_k.with(kfull, 0), tKgK(_, 2 * n + rank), tKsK(_, ks));
    ++k_free.count;
    const int vs = v_free.index(T::kStages);
    bar_wait_cluster(bar_ptr<T, Bar::kVEmpty>(ss, vs), v_free.parity(T::kStages) ^ 1u);
    uint64_t& vfull = *bar_ptr<T, Bar::kVFull>(ss, vs);
    cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&vfull, T::kVBytes);
    copy(kp.tma_v.with(vfull, 0), tVgV(_, n), tVsV(_, vs));
    ++v_free.count;
  }
  // The tail: the even CTA's last multicast commits to this CTA's kKEmpty and kVEmpty have
  // arrived before the CTA may leave (the kernel's closing cluster_sync follows every role).
  // Every stage, used or not: with one block the loop above left the count at 1, so stage 0's
  // commit is the second wait (the protocol model's `exit` check found the tail skipping it).
  for (int s = 0; s < T::kStages; ++s) {
    bar_wait_cluster(bar_ptr<T, Bar::kKEmpty>(ss, k_free.index(T::kStages)),
                     k_free.parity(T::kStages) ^ 1u);
    ++k_free.count;
    bar_wait_cluster(bar_ptr<T, Bar::kVEmpty>(ss, v_free.index(T::kStages)),
                     v_free.parity(T::kStages) ^ 1u);
    ++v_free.count;
  }
}

// ---- Relay role (lane 0 of the epilogue warp, odd CTA) ----------------------------------------
// The even CTA's MMA thread cannot wait on the odd CTA's barriers: each completed transaction of
// the odd CTA's loads is passed on to the even CTA's kPeer* copy, in the load thread's order.
template <class T>
__device__ void relay_role_pair(const KernelParams<T>& kp, typename T::SharedStorage& ss) {
  const TileWork t = tile_work(kp, take_tile<T>(ss, 0));
  FA4_SM100_DEBUG_TILE(t.tile.batch, t.tile.head, t.tile.m_block);
  if (t.blocks() <= 0) return;
  bar_wait_cluster(bar_ptr<T, Bar::kQFull>(ss, 0), 0);
  bar_arrive_cta(bar_ptr<T, Bar::kPeerQFull>(ss, 0), 0);
  Ring k_seen, v_seen;
  for (int n = t.n_end - 1; n >= t.n_begin; --n) {
    FA4_SM100_DEBUG_BLOCK(n);
    const int ks = k_seen.index(T::kStages);
    bar_wait_cluster(bar_ptr<T, Bar::kKFull>(ss, ks), k_seen.parity(T::kStages));
    bar_arrive_cta(bar_ptr<T, Bar::kPeerKFull>(ss, ks), 0);
    ++k_seen.count;
    const int vs = v_seen.index(T::kStages);
    bar_wait_cluster(bar_ptr<T, Bar::kVFull>(ss, vs), v_seen.parity(T::kStages));
    bar_arrive_cta(bar_ptr<T, Bar::kPeerVFull>(ss, vs), 0);
    ++v_seen.count;
  }
}

// ---- MMA role (the whole MMA warp of the even CTA; Note [single-thread MMA issue]) -----------
// The one-tile order (Note [one-tile order]): S(0), S(1), then per block PV(i), S(i + 2) over
// P(i), with cta_group::2 MMAs and multicast commits. One elected lane issues, as in the 2-CTA
// backward: ptxas 13.0 crashed (SIGSEGV) on this role's cta_group::2 MMAs issued from lane 0
// alone, a branch divergent in the warp.
template <class T>
__device__ void mma_role_pair(const KernelParams<T>& kp, typename T::SharedStorage& ss,
                              uint32_t tmem) {
  using Plan = typename T::Plan;
  using Element = typename T::Element;
  Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename T::SmemLayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename T::SmemLayoutK{});
  Tensor sVt = make_tensor(make_smem_ptr(ss.v.data()), typename T::SmemLayoutVt{});
  auto thr_s = make_tiled_mma(typename T::DescS{}).get_slice(0);
  auto thr_o = make_tiled_mma(typename T::DescO{}).get_slice(0);
  Tensor dQ = thr_s.partition_fragment_A(sQ);
  Tensor dK = thr_s.partition_fragment_B(sK);
  Tensor dV = thr_o.partition_fragment_B(sVt);
  constexpr int kKQk = T::kHeadDim / T::kMmaK;
  constexpr int kKPv = T::kBlockN / T::kMmaK;
  static_assert(size<2>(decltype(dQ){}) == kKQk && size<2>(decltype(dV){}) == kKPv, "K slices");
  using namespace UMMA;
  const uint64_t idesc_s = make_runtime_instr_desc<>(
      make_instr_desc<Element, Element, float, 2 * T::kBlockM, T::kBlockN, Major::K, Major::K>());
  const uint64_t idesc_o =
      make_runtime_instr_desc<>(make_instr_desc<Element, Element, float, 2 * T::kBlockM,
                                                T::kHeadDimV, Major::K, Major::MN>());
  auto wait_both = [&](uint64_t* own, uint64_t* peer, uint32_t parity) {
    bar_wait_cluster(own, parity);
    bar_wait_cluster(peer, parity);
  };
  Ring k_ready, v_ready, o_ok, s_issued, p_ready;
  // S into the next S buffer; K's stage goes back to both load threads once read.
  auto issue_s = [&]() {
    const int b = s_issued.index(kSBuffers);
    ++s_issued.count;
    const int ks = k_ready.index(T::kStages);
    wait_both(bar_ptr<T, Bar::kKFull>(ss, ks), bar_ptr<T, Bar::kPeerKFull>(ss, ks),
              k_ready.parity(T::kStages));
    tmem_fence_after_sync();
    FA4_UNROLL
    for (int k = 0; k < kKQk; ++k) {
      elected_umma_ss<2>(dQ(_0{}, _0{}, k, 0), dK(_0{}, _0{}, k, ks),
                         tmem + Plan::kS0 + uint32_t(b) * T::kBlockN, k > 0 ? 1u : 0u, idesc_s);
    }
    elected_umma_commit_pair(bar_ptr<T, Bar::kSFull>(ss, b));
    elected_umma_commit_pair(bar_ptr<T, Bar::kKEmpty>(ss, ks));
    ++k_ready.count;
  };
  const TileWork t = tile_work(kp, take_tile<T>(ss, 0));
  FA4_SM100_DEBUG_TILE(t.tile.batch, t.tile.head, t.tile.m_block);
  const int nblk = t.blocks();
  if (nblk <= 0) return;
  wait_both(bar_ptr<T, Bar::kQFull>(ss, 0), bar_ptr<T, Bar::kPeerQFull>(ss, 0), 0);
  for (int blk = 0; blk < 2 && blk < nblk; ++blk) issue_s();
  for (int i = 0; i < nblk; ++i) {
    FA4_SM100_DEBUG_BLOCK(t.n_end - 1 - i);
    const int vs = v_ready.index(T::kStages);
    wait_both(bar_ptr<T, Bar::kVFull>(ss, vs), bar_ptr<T, Bar::kPeerVFull>(ss, vs),
              v_ready.parity(T::kStages));
    const int b = p_ready.index(kSBuffers);
    bar_wait_cluster(bar_ptr<T, Bar::kPFull>(ss, b), p_ready.parity(kSBuffers));
    ++p_ready.count;
    bar_wait_cluster(bar_ptr<T, Bar::kORescaled>(ss, 0), o_ok.parity(1));
    ++o_ok.count;
    tmem_fence_after_sync();
    FA4_UNROLL
    for (int k = 0; k < kKPv; ++k) {
      // P: 16-bit, two per column, so K slice k starts 8 columns further on.
      elected_umma_ts<2>(tmem + Plan::kS0 + uint32_t(b) * T::kBlockN + k * (T::kMmaK / 2),
                         dV(_0{}, _0{}, k, vs), tmem + Plan::kO0, (i > 0 || k > 0) ? 1u : 0u,
                         idesc_o);
    }
    elected_umma_commit_pair(bar_ptr<T, Bar::kOFull>(ss, 0));
    elected_umma_commit_pair(bar_ptr<T, Bar::kVEmpty>(ss, vs));
    ++v_ready.count;
    if (i + 2 < nblk) issue_s();  // over P(i): in issue order after PV(i), which reads it
  }
}

// ---- Kernel --------------------------------------------------------------------------------
template <class T>
__global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(T::kThreads, 1)
    fwd_kernel_2cta(const __grid_constant__ KernelParams<T> kp) {
#if defined(__CUDA_ARCH_FEAT_SM100_ALL)
  extern __shared__ char smem[];
  auto& ss = *reinterpret_cast<typename T::SharedStorage*>(smem);
  const int warp = warp_uniform(int(threadIdx.x / 32));
  const Role role = warp_role(warp);
  const int rank = int(cute::block_rank_in_cluster());
  FA4_SM100_DEBUG_BEGIN(kFwdSm100Pair, typename T::Barriers, ss.bars, role);
  if (threadIdx.x == 0) {
    cute::prefetch_tma_descriptor(kp.tma_q.get_tma_descriptor());
    cute::prefetch_tma_descriptor(kp.tma_k.get_tma_descriptor());
    cute::prefetch_tma_descriptor(kp.tma_v.get_tma_descriptor());
    T::Barriers::init(ss.bars);
    cutlass::arch::fence_barrier_init();
    ss.tile_item[0] = kp.sched.at(blockIdx.x / 2);
  }
  // The MMA warps of both CTAs allocate the same TMEM columns together (cta_group::2).
  if (role == Role::kMma) {
    cute::TMEM::Allocator2Sm alloc;
    alloc.allocate(T::Plan::kAllocColumns, &ss.tmem_base);
    alloc.release_allocation_lock();
  }
  tmem_fence_before_sync();
  // Both CTAs' barriers, work item and TMEM address are written before any remote arrival.
  cute::cluster_sync();
  tmem_fence_after_sync();
  const uint32_t tmem = ss.tmem_base;
  const int lane = threadIdx.x % 32;
  switch (role) {
    case Role::kSoftmax0:
      cutlass::arch::warpgroup_reg_alloc<kRegsSoftmax>();
      softmax_role(kp, ss, tmem, 0, threadIdx.x % 128);
      break;
    case Role::kSoftmax1:
      break;  // one Q tile per CTA: no work (its registers stay at the launch's 128)
    case Role::kCorrection:
      cutlass::arch::warpgroup_reg_dealloc<kRegsCorrection>();
      correction_role(kp, ss, tmem, threadIdx.x % 128);
      break;
    default:
      cutlass::arch::warpgroup_reg_dealloc<kRegsOther>();
      if (role == Role::kMma && rank == 0) mma_role_pair(kp, ss, tmem);
      if (role == Role::kLoad && lane == 0) load_role_pair(kp, ss);
      if (role == Role::kEpilogue && lane == 0 && rank == 1) relay_role_pair(kp, ss);
      break;
  }
  // No CTA leaves, or frees TMEM, while the other may still arrive on its barriers or run MMAs
  // on its TMEM and shared memory: the correction warpgroups waited for the last P·V.
  tmem_fence_before_sync();
  cute::cluster_sync();
  if (role == Role::kMma) {
    tmem_fence_after_sync();
    cute::TMEM::Allocator2Sm().free(ss.tmem_base, T::Plan::kAllocColumns);
  }
#endif
}

// ---- Launch --------------------------------------------------------------------------------
// One cluster per work item of 256 query rows (FwdTraits2::kCtaRows), in the scheduler's order.
template <class T>
Status launch_pair(const FwdParams& p, const DeviceInfo& dev, cudaStream_t stream) {
  using Element = typename T::Element;
  KernelParams<T> kp = load_params<T>(p);  // no TMA-store epilogue here
  kp.sched =
      TileScheduler::for_forward(p, T::kCtaRows, int(sizeof(Element)), dev.num_sms, dev.tile_order);
  const int64_t blocks = 2 * kp.sched.total();
  if (blocks == 0) return Status::kOk;
  FA4_SM100_DEBUG_ATTACH(stream);
  return launch_kernel("fwd_sm100 2-CTA", fwd_kernel_2cta<T>, dim3(unsigned(blocks)), T::kThreads,
                       T::kSmemBytes, stream, kp);
}

}  // namespace fa4::sm100

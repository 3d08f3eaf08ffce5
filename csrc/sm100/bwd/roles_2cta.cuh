// The roles, kernel and launch of the 2-CTA SM100 backward; sm100/bwd/kernel_2cta.cuh, which
// includes this file, has the algorithm (Note [bwd 2-CTA]), the operands and the barriers.
#pragma once

namespace fa4::sm100::bwd2 {

// ---- Load role (lane 0 of the load warp, each CTA) ------------------------------------------
template <class T>
__device__ void load_role(const KernelParams<T>& kp, typename T::SharedStorage& ss,
                          const TileWork& t) {
  using Coord2 = Shape<int, int>;
  const int bidb = kp.p.fwd.cu_seqlens_q != nullptr ? 0 : t.b;
  Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename T::SmemLayoutK{});
  Tensor sV = make_tensor(make_smem_ptr(ss.v.data()), typename T::SmemLayoutV{});
  Tensor sKd = make_tensor(make_smem_ptr(ss.kd.data()), typename T::SmemLayoutKd{});
  Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename T::SmemLayoutQ{});
  Tensor sQd = make_tensor(make_smem_ptr(ss.qd.data()), typename T::SmemLayoutQd{});
  Tensor sDO = make_tensor(make_smem_ptr(ss.dout.data()), typename T::SmemLayoutDO{});
  Tensor sDOd = make_tensor(make_smem_ptr(ss.doutd.data()), typename T::SmemLayoutDOd{});
  const auto k_rows = make_coord(t.seq.offset_k, _0{});
  const auto q_rows = make_coord(t.seq.offset_q, _0{});
  Tensor mK = domain_offset(k_rows, kp.tma_k.get_tma_tensor(kp.shape_k)(_, _, t.head_kv, bidb));
  Tensor mV = domain_offset(k_rows, kp.tma_v.get_tma_tensor(kp.shape_v)(_, _, t.head_kv, bidb));
  Tensor mKd = domain_offset(k_rows, kp.tma_kd.get_tma_tensor(kp.shape_k)(_, _, t.head_kv, bidb));
  auto tile = [](const auto& tma, const auto& s, const auto& g) {
    return tma_partition(tma, _0{}, Layout<_1>{}, group_modes<0, 2>(s), group_modes<0, 2>(g));
  };
  // This CTA's K and V tile, and the pair's 256 K rows of its half of d.
  auto [tKg, tKs] =
      tile(kp.tma_k, sK,
           local_tile(mK, Shape<Int<T::kBlockN>, Int<T::kHeadDim>>{}, make_coord(t.n, _0{})));
  auto [tVg, tVs] =
      tile(kp.tma_v, sV,
           local_tile(mV, Shape<Int<T::kBlockN>, Int<T::kHeadDim>>{}, make_coord(t.n, _0{})));
  auto [tKdg, tKds] =
      tile(kp.tma_kd, sKd,
           local_tile(mKd, Shape<Int<T::kPairN>, Int<T::kHalfD>>{}, make_coord(t.pair, t.rank)));
  uint64_t* kv_full = bar_ptr<T, Bar::kKVFull>(ss);
  cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(kv_full, T::kKVBytes);
  copy(kp.tma_k.with(*kv_full, 0), tKg, tKs(_, 0));
  copy(kp.tma_v.with(*kv_full, 0), tVg, tVs(_, 0));
  copy(kp.tma_kd.with(*kv_full, 0), tKdg, tKds(_, 0));

  Ring q_free, do_free;
  for (int i = 0; i < t.iters; ++i) {
    FA4_SM100_DEBUG_BLOCK(t.m_of(i));
    const int head = t.head_kv * kp.group + t.g_of(i);
    const int m = t.m_of(i);
    Tensor mQ = domain_offset(q_rows, kp.tma_q.get_tma_tensor(kp.shape_q)(_, _, head, bidb));
    Tensor mQd = domain_offset(q_rows, kp.tma_qd.get_tma_tensor(kp.shape_q)(_, _, head, bidb));
    Tensor mDO = domain_offset(q_rows, kp.tma_do.get_tma_tensor(kp.shape_do)(_, _, head, bidb));
    Tensor mDOd = domain_offset(q_rows, kp.tma_dod.get_tma_tensor(kp.shape_do)(_, _, head, bidb));
    // S's and dP's B: this CTA's 64 query rows; dK's and dV's B: all 128, its d/2 columns.
    const Coord2 rows_half = make_coord(2 * m + t.rank, 0), cols_half = make_coord(m, t.rank);
    auto [tQg, tQs] =
        tile(kp.tma_q, sQ, local_tile(mQ, Shape<Int<T::kHalfM>, Int<T::kHeadDim>>{}, rows_half));
    auto [tQdg, tQds] =
        tile(kp.tma_qd, sQd, local_tile(mQd, Shape<Int<T::kBlockM>, Int<T::kHalfD>>{}, cols_half));
    auto [tDg, tDs] =
        tile(kp.tma_do, sDO, local_tile(mDO, Shape<Int<T::kHalfM>, Int<T::kHeadDim>>{}, rows_half));
    auto [tDdg, tDds] = tile(kp.tma_dod, sDOd,
                             local_tile(mDOd, Shape<Int<T::kBlockM>, Int<T::kHalfD>>{}, cols_half));
    bar_wait_cluster(bar_ptr<T, Bar::kQEmpty>(ss), q_free.parity(1) ^ 1u);
    ++q_free.count;
    uint64_t* q_full = bar_ptr<T, Bar::kQFull>(ss);
    cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(q_full, T::kQBytes);
    copy(kp.tma_q.with(*q_full, 0), tQg, tQs(_, 0));
    copy(kp.tma_qd.with(*q_full, 0), tQdg, tQds(_, 0));
    // lse₂ and D of all 128 query rows: the compute threads of each CTA see every query column.
    const int64_t row = t.row0_ws + int64_t(m) * T::kBlockM;
    SM90_BULK_COPY_G2S::copy(kp.ws.lse2(head) + row, q_full, ss.lse2, T::kRowStatBytes);
    SM90_BULK_COPY_G2S::copy(kp.ws.dpsum(head) + row, q_full, ss.dpsum, T::kRowStatBytes);
    bar_wait_cluster(bar_ptr<T, Bar::kDoEmpty>(ss), do_free.parity(1) ^ 1u);
    ++do_free.count;
    uint64_t* do_full = bar_ptr<T, Bar::kDoFull>(ss);
    cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(do_full, T::kDoBytes);
    copy(kp.tma_do.with(*do_full, 0), tDg, tDs(_, 0));
    copy(kp.tma_dod.with(*do_full, 0), tDdg, tDds(_, 0));
  }
}

// ---- Relay role (lane 0 of warp 14, odd CTA) -------------------------------------------------
// The even CTA's MMA warp cannot wait on the odd CTA's barriers: each completed transaction of
// the odd CTA is passed on to the even CTA's kPeer* copy.
template <class T>
__device__ void relay_role(typename T::SharedStorage& ss, const TileWork& t) {
  bar_wait_cluster(bar_ptr<T, Bar::kKVFull>(ss), 0);
  bar_arrive_cta(bar_ptr<T, Bar::kPeerKVFull>(ss), 0);
  for (int i = 0; i < t.iters; ++i) {
    FA4_SM100_DEBUG_BLOCK(t.m_of(i));
    const uint32_t parity = uint32_t(i) & 1u;
    bar_wait_cluster(bar_ptr<T, Bar::kQFull>(ss), parity);
    bar_arrive_cta(bar_ptr<T, Bar::kPeerQFull>(ss), 0);
    bar_wait_cluster(bar_ptr<T, Bar::kDoFull>(ss), parity);
    bar_arrive_cta(bar_ptr<T, Bar::kPeerDoFull>(ss), 0);
  }
}

// ---- MMA role (the whole MMA warp of the even CTA; Note [single-thread MMA issue]) ----------
template <class T>
__device__ void mma_role(typename T::SharedStorage& ss, uint32_t tmem, const TileWork& t) {
  using Plan = typename T::Plan;
  using Element = typename T::Element;
  Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename T::SmemLayoutK{});
  Tensor sV = make_tensor(make_smem_ptr(ss.v.data()), typename T::SmemLayoutV{});
  Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename T::SmemLayoutQ{});
  Tensor sDO = make_tensor(make_smem_ptr(ss.dout.data()), typename T::SmemLayoutDO{});
  Tensor sQdT = make_tensor(make_smem_ptr(ss.qd.data()), typename T::SmemLayoutQdT{});
  Tensor sDOdT = make_tensor(make_smem_ptr(ss.doutd.data()), typename T::SmemLayoutDOdT{});
  Tensor sKdT = make_tensor(make_smem_ptr(ss.kd.data()), typename T::SmemLayoutKdT{});
  Tensor sDSt = make_tensor(make_smem_ptr(ss.ds.data()), typename T::SmemLayoutDSt{});
  auto thr_s = make_tiled_mma(typename T::DescS{}).get_slice(0);
  auto thr_kv = make_tiled_mma(typename T::DescDKV{}).get_slice(0);
  auto thr_dq = make_tiled_mma(typename T::DescDQ{}).get_slice(0);
  Tensor dK = thr_s.partition_fragment_A(sK);         // S:  A = K, this CTA's kv rows
  Tensor dQ = thr_s.partition_fragment_B(sQ);         // S:  B = Q, its 64 query rows
  Tensor dV = thr_s.partition_fragment_A(sV);         // dP: A = V
  Tensor dDO = thr_s.partition_fragment_B(sDO);       // dP: B = dO, its 64 query rows
  Tensor dDOdT = thr_kv.partition_fragment_B(sDOdT);  // dV: B = dO, its d/2 columns
  Tensor dQdT = thr_kv.partition_fragment_B(sQdT);    // dK: B = Q, its d/2 columns
  Tensor dDSt = thr_dq.partition_fragment_A(sDSt);    // dQ: A = dSᵀ, its query rows
  Tensor dKdT = thr_dq.partition_fragment_B(sKdT);    // dQ: B = K, its d/2 columns
  constexpr int kKd = T::kHeadDim / T::kMmaK;         // K slices of S and dP
  constexpr int kKq = T::kBlockM / T::kMmaK;          // of dV and dK (query rows)
  constexpr int kKkv = T::kPairN / T::kMmaK;          // of dQ (the pair's kv rows)
  static_assert(size<2>(decltype(dK){}) == kKd && size<2>(decltype(dQdT){}) == kKq &&
                    size<2>(decltype(dDSt){}) == kKkv && size<2>(decltype(dKdT){}) == kKkv,
                "K slices");
  using namespace UMMA;
  const uint64_t idesc_s = make_runtime_instr_desc<>(
      make_instr_desc<Element, Element, float, T::kPairN, T::kBlockM, Major::K, Major::K>());
  const uint64_t idesc_kv = make_runtime_instr_desc<>(
      make_instr_desc<Element, Element, float, T::kPairN, T::kHeadDim, Major::K, Major::MN>());
  const uint64_t idesc_dq = make_runtime_instr_desc<>(
      make_instr_desc<Element, Element, float, T::kBlockM, T::kHeadDim, Major::MN, Major::MN>());

  Ring p_ready, ds_ready, dq_free;
  auto wait_both = [&](uint64_t* own, uint64_t* peer, uint32_t parity) {
    bar_wait_cluster(own, parity);
    bar_wait_cluster(peer, parity);
  };
  auto issue_s = [&](int i) {
    wait_both(bar_ptr<T, Bar::kQFull>(ss), bar_ptr<T, Bar::kPeerQFull>(ss), uint32_t(i) & 1u);
    tmem_fence_after_sync();
    FA4_UNROLL
    for (int k = 0; k < kKd; ++k) {
      elected_umma_ss<2>(dK(_0{}, _0{}, k, 0), dQ(_0{}, _0{}, k, 0), tmem + Plan::kS,
                         k > 0 ? 1u : 0u, idesc_s);
    }
    elected_umma_commit_pair(bar_ptr<T, Bar::kSFull>(ss));
  };
  auto issue_dp = [&](int i) {
    wait_both(bar_ptr<T, Bar::kDoFull>(ss), bar_ptr<T, Bar::kPeerDoFull>(ss), uint32_t(i) & 1u);
    tmem_fence_after_sync();
    FA4_UNROLL
    for (int k = 0; k < kKd; ++k) {
      elected_umma_ss<2>(dV(_0{}, _0{}, k, 0), dDO(_0{}, _0{}, k, 0), tmem + Plan::kDP,
                         k > 0 ? 1u : 0u, idesc_s);
    }
    elected_umma_commit_pair(bar_ptr<T, Bar::kDpFull>(ss));
  };

  wait_both(bar_ptr<T, Bar::kKVFull>(ss), bar_ptr<T, Bar::kPeerKVFull>(ss), 0);
  if (t.iters == 0) return;
  issue_s(0);
  issue_dp(0);
  for (int i = 0; i < t.iters; ++i) {
    FA4_SM100_DEBUG_BLOCK(t.m_of(i));
    bar_wait_cluster(bar_ptr<T, Bar::kPFull>(ss), p_ready.parity(1));
    ++p_ready.count;
    tmem_fence_after_sync();
    FA4_UNROLL
    for (int k = 0; k < kKq; ++k) {
      elected_umma_ts<2>(tmem + Plan::slice_column(Plan::kS, k), dDOdT(_0{}, _0{}, k, 0),
                         tmem + Plan::kDV, (i > 0 || k > 0) ? 1u : 0u, idesc_kv);
    }
    elected_umma_commit_pair(bar_ptr<T, Bar::kDoEmpty>(ss));
    bar_wait_cluster(bar_ptr<T, Bar::kDsFull>(ss), ds_ready.parity(1));
    ++ds_ready.count;
    tmem_fence_after_sync();
    FA4_UNROLL
    for (int k = 0; k < kKq; ++k) {
      elected_umma_ts<2>(tmem + Plan::slice_column(Plan::kDP, k), dQdT(_0{}, _0{}, k, 0),
                         tmem + Plan::kDK, (i > 0 || k > 0) ? 1u : 0u, idesc_kv);
    }
    elected_umma_commit_pair(bar_ptr<T, Bar::kQEmpty>(ss));
    FA4_UNROLL
    for (int k = 0; k < kKkv; ++k) {
      // Over dS(i) in TMEM: in issue order after dK(i), which reads it (Note [bwd MMA order]).
      elected_umma_ss<2>(dDSt(_0{}, _0{}, k, 0), dKdT(_0{}, _0{}, k, 0), tmem + Plan::kDQ,
                         k > 0 ? 1u : 0u, idesc_dq);
    }
    elected_umma_commit_pair(bar_ptr<T, Bar::kDsEmpty>(ss));
    elected_umma_commit_pair(bar_ptr<T, Bar::kDqFull>(ss));
    if (i + 1 < t.iters) {
      issue_s(i + 1);  // over P(i), after dV(i) read it; Q(i + 1) once dK(i) freed the buffer
      bar_wait_cluster(bar_ptr<T, Bar::kDqEmpty>(ss), dq_free.parity(1));
      ++dq_free.count;
      issue_dp(i + 1);  // over dQ(i), which both reduce warpgroups have loaded
    }
  }
  elected_umma_commit_pair(bar_ptr<T, Bar::kDkvFull>(ss));
}

// ---- Compute roles (each CTA) ----------------------------------------------------------------
// Warpgroup w owns query columns [64 w, 64 w + 64); thread `row` holds kv row `row` of this
// CTA's tile. The per-element work is the 1-CTA kernel's (sm100/bwd/compute.cuh); dS goes to
// CTA w's sDS (Note [bwd 2-CTA]) and the arrivals to the even CTA.
template <class T>
__device__ void compute_role(const KernelParams<T>& kp, typename T::SharedStorage& ss,
                             uint32_t tmem, const TileWork& t, int w, int row) {
  constexpr int kCols = T::kHalfM;
  const uint32_t tmem_row = tmem + (uint32_t(row & ~31) << 16);
  const int c0 = w * kCols;
  Tensor sDS = make_tensor(make_smem_ptr(ss.ds.data()), typename T::SmemLayoutDS{});
  const int ds_row = t.rank * T::kBlockN + row;  // this kv row in the pair
  const int kv = t.n * T::kBlockN + row;
  const RowBounds seen = t.mask.col_bounds(kv);
  Ring q_ready, s_ready, dp_ready, ds_free;
  for (int i = 0; i < t.iters; ++i) {
    FA4_SM100_DEBUG_BLOCK(t.m_of(i));
    const int m = t.m_of(i);
    const bool masked = block_needs_mask<T::kBlockM, T::kBlockN>(t.mask, m, t.n);
    bar_wait_cluster(bar_ptr<T, Bar::kQFull>(ss), q_ready.parity(1));
    ++q_ready.count;
    bar_wait_cluster(bar_ptr<T, Bar::kSFull>(ss), s_ready.parity(1));
    ++s_ready.count;
    tmem_fence_after_sync();
    float dsf[kCols];
    bwd::compute_p<T>(kp.score, tmem_row, c0, m * T::kBlockM + c0, ss.lse2 + c0, seen, masked, dsf);
    tmem_wait_st();
    tmem_fence_before_sync();
    bar_arrive_cta(bar_ptr<T, Bar::kPFull>(ss), 0);

    bar_wait_cluster(bar_ptr<T, Bar::kDpFull>(ss), dp_ready.parity(1));
    ++dp_ready.count;
    tmem_fence_after_sync();
    // Both CTAs' sDS were read by dQ(i - 1), which one commit covers.
    if (i > 0) {
      bar_wait_cluster(bar_ptr<T, Bar::kDsEmpty>(ss), ds_free.parity(1));
      ++ds_free.count;
    }
    // Query column c0 + e is column e of CTA w's sDS: this CTA's or, through DSMEM, the peer's.
    bwd::compute_ds<T>(tmem_row, c0, ss.dpsum + c0, dsf, [&](int c, const uint32_t (&ds16)[16]) {
      FA4_UNROLL
      for (int v = 0; v < 4; ++v) {
        st_cluster_16(&sDS(ds_row, 32 * c + 8 * v, 0), uint32_t(w),
                      make_uint4(ds16[4 * v], ds16[4 * v + 1], ds16[4 * v + 2], ds16[4 * v + 3]));
      }
    });
    fence_async_smem_cluster();
    tmem_wait_st();
    tmem_fence_before_sync();
    bar_arrive_cta(bar_ptr<T, Bar::kDsFull>(ss), 0);
  }
  if (t.iters > 0) {
    bar_wait_cluster(bar_ptr<T, Bar::kDkvFull>(ss), 0);
    tmem_fence_after_sync();
  }
  bwd::store_dk_dv<T>(kp.p, t.seq, t.b, t.head_kv, kv, t.iters > 0, tmem_row, w);
}

// ---- Reduce role (each CTA) ------------------------------------------------------------------
// This CTA's 64 query rows of dQ(i) (the 2 × 2 TMEM layout of Note [bwd 2-CTA]: thread t holds
// query row t % 64, columns [64 (t / 64), 64 (t / 64) + 64)) go to the workspace as d / 32 TMA
// reduce-adds of 64 × 32 sub-tiles: 4 per CTA and block at d = 128, summed over the pair's 256
// kv rows (a per-element atomic scheme issues 64 · 128 = 8192 per CTA). Deterministic mode: the
// turn counter of these 64 rows, in the order of the pairs (Note [deterministic dQ]).
template <class T>
__device__ void reduce_role(const KernelParams<T>& kp, typename T::SharedStorage& ss, uint32_t tmem,
                            const TileWork& t, int thread) {
  using Plan = typename T::Plan;
  constexpr int kBarrierId = 1;  // named barrier of the 128 reduce threads
  constexpr int kHalfCols = T::kHeadDim / 2;
  const uint32_t lane_base = uint32_t(thread & ~31) << 16;
  const int q_row = thread % T::kHalfM, half = thread / T::kHalfM;
  const bool leader = thread == 0;
  Tensor mDQ = kp.tma_dq.get_tma_tensor(kp.shape_dq);
  auto tma = kp.tma_dq.get_slice(_0{});
  Ring dq_ready;
  for (int i = 0; i < t.iters; ++i) {
    FA4_SM100_DEBUG_BLOCK(t.m_of(i));
    const int head = t.head_kv * kp.group + t.g_of(i);
    const int m = t.m_of(i);
    const int64_t wrow = t.row0_ws + int64_t(m) * T::kBlockM + t.rank * T::kHalfM;
    bar_wait_cluster(bar_ptr<T, Bar::kDqFull>(ss), dq_ready.parity(1));
    ++dq_ready.count;
    tmem_fence_after_sync();
    uint32_t dq[kHalfCols];
    FA4_UNROLL
    for (int c = 0; c < kHalfCols / 32; ++c) {
      tmem_load_32(tmem + lane_base + Plan::kDQ + 32 * c,
                   *reinterpret_cast<uint32_t (*)[32]>(&dq[32 * c]));
    }
    tmem_wait_ld();
    tmem_fence_before_sync();
    bar_arrive_cta(bar_ptr<T, Bar::kDqEmpty>(ss), 0);
    int* sem = kp.p.fwd.deterministic ? kp.ws.sem(head, wrow) : nullptr;
    if (leader && sem != nullptr) {
      using P = typename T::PairTile;
      dq_turn_wait(sem, dq_turn(block_range<P::kBlockM, P::kBlockN>(t.mask, m), t.pair));
    }
    // The previous block's reduce-adds have read the staging buffers.
    if (leader) tma_store_wait<0>();
    cutlass::arch::NamedBarrier::sync(128, kBarrierId);
    FA4_UNROLL
    for (int c = 0; c < kHalfCols / T::kDqCols; ++c) {
      Tensor sDQ = make_tensor(make_smem_ptr(ss.dq[half * (kHalfCols / T::kDqCols) + c].data()),
                               typename T::SmemLayoutDQ{});
      FA4_UNROLL
      for (int v = 0; v < T::kDqCols / 4; ++v) {
        const int e = c * T::kDqCols + 4 * v;
        *reinterpret_cast<uint4*>(&sDQ(q_row, 4 * v)) =
            make_uint4(dq[e], dq[e + 1], dq[e + 2], dq[e + 3]);
      }
    }
    fence_async_smem();
    cutlass::arch::NamedBarrier::sync(128, kBarrierId);
    if (leader) {
      Tensor gDQ = local_tile(mDQ(_, _, head), Shape<Int<T::kHalfM>, Int<T::kDqCols>>{},
                              make_coord(int(wrow / T::kHalfM), _));
      FA4_UNROLL
      for (int c = 0; c < T::kDqChunks; ++c) {
        Tensor sDQ = make_tensor(make_smem_ptr(ss.dq[c].data()), typename T::SmemLayoutDQ{});
        copy(kp.tma_dq, tma.partition_S(sDQ), tma.partition_D(gDQ(_, _, c)));
      }
      tma_store_arrive();
      if (sem != nullptr) dq_turn_pass(sem);
    }
  }
  if (leader) tma_store_wait<0>();
}

// ---- Kernel ------------------------------------------------------------------------------------
template <class T>
__global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(T::kThreads, 1)
    bwd_kernel_2cta(const __grid_constant__ KernelParams<T> kp) {
#if defined(__CUDA_ARCH_FEAT_SM100_ALL)
  extern __shared__ char smem[];
  auto& ss = *reinterpret_cast<typename T::SharedStorage*>(smem);
  const int warp = threadIdx.x / 32;
  const Role role = warp_role(warp);
  FA4_SM100_DEBUG_BEGIN(kBwdSm100Pair, typename T::Barriers, ss.bars, role);
  if (threadIdx.x == 0) {
    cute::prefetch_tma_descriptor(kp.tma_q.get_tma_descriptor());
    cute::prefetch_tma_descriptor(kp.tma_qd.get_tma_descriptor());
    cute::prefetch_tma_descriptor(kp.tma_do.get_tma_descriptor());
    cute::prefetch_tma_descriptor(kp.tma_dod.get_tma_descriptor());
    cute::prefetch_tma_descriptor(kp.tma_k.get_tma_descriptor());
    cute::prefetch_tma_descriptor(kp.tma_v.get_tma_descriptor());
    cute::prefetch_tma_descriptor(kp.tma_kd.get_tma_descriptor());
    T::Barriers::init(ss.bars);
    cutlass::arch::fence_barrier_init();
  }
  // The MMA warps of both CTAs allocate the same TMEM columns together (cta_group::2).
  if (role == Role::kMma) {
    cute::TMEM::Allocator2Sm alloc;
    alloc.allocate(T::Plan::kAllocColumns, &ss.tmem_base);
    alloc.release_allocation_lock();
  }
  tmem_fence_before_sync();
  // Both CTAs' barriers are initialized and the TMEM address written before any remote arrival.
  cute::cluster_sync();
  tmem_fence_after_sync();
  const uint32_t tmem = ss.tmem_base;
  const TileWork t = tile_work(kp);
  FA4_SM100_DEBUG_TILE(t.b, t.head_kv, t.n);
  const int lane = threadIdx.x % 32;
  switch (role) {
    case Role::kCompute0:
    case Role::kCompute1:
      cutlass::arch::warpgroup_reg_alloc<kRegsCompute>();
      compute_role(kp, ss, tmem, t, role == Role::kCompute0 ? 0 : 1, threadIdx.x % 128);
      break;
    case Role::kReduce:
      static_assert(kRegsReduce <= 128, "the reduce warpgroup gives registers back (launch: 128)");
      cutlass::arch::warpgroup_reg_dealloc<kRegsReduce>();
      reduce_role(kp, ss, tmem, t, threadIdx.x % 128);
      break;
    default:
      cutlass::arch::warpgroup_reg_dealloc<kRegsOther>();
      if (role == Role::kMma && t.rank == 0) mma_role<T>(ss, tmem, t);
      if (role == Role::kLoad && lane == 0) load_role(kp, ss, t);
      if (role == Role::kRelay && lane == 0 && t.rank == 1) relay_role<T>(ss, t);
      break;
  }
  // No CTA leaves, or frees TMEM, while the other may still arrive on its barriers, write its
  // sDS, or run MMAs on its TMEM.
  tmem_fence_before_sync();
  cute::cluster_sync();
  if (role == Role::kMma) {
    tmem_fence_after_sync();
    cute::TMEM::Allocator2Sm().free(ss.tmem_base, T::Plan::kAllocColumns);
  }
#endif
}

// ---- Launch ------------------------------------------------------------------------------------
template <class T>
Status launch_bwd(const BwdParams& p, const DeviceInfo& dev, void* workspace, cudaStream_t stream) {
  using Element = typename T::Element;
  constexpr int D = T::kHeadDim;
  const FwdParams& f = p.fwd;
  KernelParams<T> kp;
  kp.p = p;
  kp.ws = workspace_of(f, workspace, D);
  kp.score = ScoreScale::make(f.softmax_scale, f.softcap);
  kp.group = f.heads_q / f.heads_kv;
  const auto [q, dout, k, v] = bwd_views(p);
  kp.shape_q = q.shape();
  kp.shape_do = dout.shape();
  kp.shape_k = k.shape();
  kp.shape_v = v.shape();
  kp.shape_dq = make_shape(int(kp.ws.rows), kp.ws.head_dim, kp.ws.heads);
  kp.tma_q = make_tma_tile<Element, typename T::SmemLayoutQ, T::kHalfM, D>(q);
  kp.tma_do = make_tma_tile<Element, typename T::SmemLayoutDO, T::kHalfM, D>(dout);
  kp.tma_qd = make_tma_cols<Element, typename T::SmemLayoutQd, T::kBlockM, T::kHalfD, D>(q);
  kp.tma_dod = make_tma_cols<Element, typename T::SmemLayoutDOd, T::kBlockM, T::kHalfD, D>(dout);
  kp.tma_k = make_tma_tile<Element, typename T::SmemLayoutK, T::kBlockN, D>(k);
  kp.tma_v = make_tma_tile<Element, typename T::SmemLayoutV, T::kBlockN, D>(v);
  kp.tma_kd = make_tma_cols<Element, typename T::SmemLayoutKd, T::kPairN, T::kHalfD, D>(k);
  const RowBlockGrid row_grid = RowBlockGrid::of(f);
  const int64_t pp_blocks = row_grid.blocks(f);
  if (pp_blocks > 0) {
    kp.tma_dq = make_tma_dq<T>(kp.ws);
    bwd_preprocess<Element><<<unsigned(pp_blocks), 256, 0, stream>>>(p, kp.ws, row_grid);
  }
  // Note [bwd tile order options]: a cluster of two SMs runs an item (a pair of kv tiles).
  kp.grid =
      BwdGrid::make((f.seqlen_k + T::kPairN - 1) / T::kPairN, f.heads_kv, f.batch, f.deterministic,
                    dev.num_sms / 2, dev.tile_order.backward_or_default(f.causal, f.deterministic),
                    BwdGrid::pair_bytes(f.seqlen_q, kp.group, D, D));
  const int64_t blocks = 2 * int64_t(kp.grid.n_tiles) * f.heads_kv * f.batch;
  if (blocks > 0) {
    FA4_SM100_DEBUG_ATTACH(stream);
    const Status s = launch_kernel("bwd_sm100 2-CTA", bwd_kernel_2cta<T>, dim3(unsigned(blocks)),
                                   T::kThreads, T::kSmemBytes, stream, kp);
    if (s != Status::kOk) return s;
  }
  if (pp_blocks > 0) {
    bwd_postprocess_rows<Element, D><<<unsigned(pp_blocks), 256, 0, stream>>>(p, kp.ws, row_grid);
  }
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    return kernel_fail(Status::kCudaError, "bwd_sm100 postprocess launch: %s",
                       cudaGetErrorString(e));
  }
  return Status::kOk;
}

}  // namespace fa4::sm100::bwd2

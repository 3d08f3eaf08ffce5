// The roles, kernel and launch of the SM100 backward; the algorithm, roles, barriers, TMEM plan
// and the MMA order are described in sm100/bwd/kernel.cuh, which includes this file.
#pragma once

namespace fa4::sm100::bwd {

// ---- Load role -----------------------------------------------------------------------------
template <class T>
__device__ void load_role(const KernelParams<T>& kp, typename T::SharedStorage& ss,
                          const TileWork& t) {
  const bool varlen = kp.p.fwd.cu_seqlens_q != nullptr;
  const int bidb = varlen ? 0 : t.b;
  Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename T::SmemLayoutK{});
  Tensor sV = make_tensor(make_smem_ptr(ss.v.data()), typename T::SmemLayoutV{});
  Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename T::SmemLayoutQ{});
  Tensor sDO = make_tensor(make_smem_ptr(ss.dout.data()), typename T::SmemLayoutDO{});
  Tensor mK = kp.tma_k.get_tma_tensor(kp.shape_k);
  Tensor mV = kp.tma_v.get_tma_tensor(kp.shape_v);
  Tensor mQ = kp.tma_q.get_tma_tensor(kp.shape_q);
  Tensor mDO = kp.tma_do.get_tma_tensor(kp.shape_do);
  Tensor gK = local_tile(domain_offset(make_coord(t.seq.offset_k, _0{}), mK(_, _, t.head_kv, bidb)),
                         Shape<Int<T::kBlockN>, Int<T::kHeadDim>>{}, make_coord(t.n, _0{}));
  Tensor gV = local_tile(domain_offset(make_coord(t.seq.offset_k, _0{}), mV(_, _, t.head_kv, bidb)),
                         Shape<Int<T::kBlockN>, Int<T::kHeadDimV>>{}, make_coord(t.n, _0{}));
  auto [tKgK, tKsK] =
      tma_partition(kp.tma_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK), group_modes<0, 2>(gK));
  auto [tVgV, tVsV] =
      tma_partition(kp.tma_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sV), group_modes<0, 2>(gV));
  uint64_t& kv_full = *bar_ptr<T, Bar::kKVFull>(ss);
  cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&kv_full, T::kKVBytes);
  copy(kp.tma_k.with(kv_full, 0), tKgK, tKsK(_, 0));
  copy(kp.tma_v.with(kv_full, 0), tVgV, tVsV(_, 0));

  Ring q_free, do_free;
  for (int i = 0; i < t.iters; ++i) {
    FA4_SM100_DEBUG_BLOCK(t.m_of(i));
    const int head = t.head_kv * kp.group + t.g_of(i);
    const int m = t.m_of(i);
    Tensor gQ = local_tile(domain_offset(make_coord(t.seq.offset_q, _0{}), mQ(_, _, head, bidb)),
                           Shape<Int<T::kBlockM>, Int<T::kHeadDim>>{}, make_coord(m, _0{}));
    Tensor gDO = local_tile(domain_offset(make_coord(t.seq.offset_q, _0{}), mDO(_, _, head, bidb)),
                            Shape<Int<T::kBlockM>, Int<T::kHeadDimV>>{}, make_coord(m, _0{}));
    auto [tQgQ, tQsQ] =
        tma_partition(kp.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ), group_modes<0, 2>(gQ));
    auto [tDgD, tDsD] = tma_partition(kp.tma_do, _0{}, Layout<_1>{}, group_modes<0, 2>(sDO),
                                      group_modes<0, 2>(gDO));
    // Q with its rows' lse₂ and D (the workspace pads every sequence to whole 128-row blocks).
    const int qs = q_free.index(T::kStagesQ);
    bar_wait(bar_ptr<T, Bar::kQEmpty>(ss, qs), q_free.parity(T::kStagesQ) ^ 1u);
    ++q_free.count;
    uint64_t* q_full = bar_ptr<T, Bar::kQFull>(ss, qs);
    cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(q_full, T::kQBytes);
    copy(kp.tma_q.with(*q_full, 0), tQgQ, tQsQ(_, qs));
    const int64_t row = t.row0_ws + int64_t(m) * T::kBlockM;
    SM90_BULK_COPY_G2S::copy(kp.ws.lse2(head) + row, q_full, ss.lse2[qs], T::kRowStatBytes);
    SM90_BULK_COPY_G2S::copy(kp.ws.dpsum(head) + row, q_full, ss.dpsum[qs], T::kRowStatBytes);
    const int ds = do_free.index(T::kStagesDo);
    bar_wait(bar_ptr<T, Bar::kDoEmpty>(ss, ds), do_free.parity(T::kStagesDo) ^ 1u);
    ++do_free.count;
    uint64_t* do_full = bar_ptr<T, Bar::kDoFull>(ss, ds);
    cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(do_full, T::kDoBytes);
    copy(kp.tma_do.with(*do_full, 0), tDgD, tDsD(_, ds));
  }
}

// ---- MMA role ------------------------------------------------------------------------------
// Run by the whole MMA warp: every value here is warp-uniform, so ptxas keeps the descriptors in
// uniform registers, and one elected lane issues each tcgen05 operation (Note [single-thread MMA
// issue]; issued from lane 0 alone, the MMA loop spilled 124 instead of 40 bytes).
template <class T>
__device__ void mma_role(typename T::SharedStorage& ss, uint32_t tmem, const TileWork& t) {
  using Plan = typename T::Plan;
  using Element = typename T::Element;
  Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename T::SmemLayoutK{});
  Tensor sV = make_tensor(make_smem_ptr(ss.v.data()), typename T::SmemLayoutV{});
  Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename T::SmemLayoutQ{});
  Tensor sDO = make_tensor(make_smem_ptr(ss.dout.data()), typename T::SmemLayoutDO{});
  Tensor sKt = make_tensor(make_smem_ptr(ss.k.data()), typename T::SmemLayoutKt{});
  Tensor sQt = make_tensor(make_smem_ptr(ss.q.data()), typename T::SmemLayoutQt{});
  Tensor sDOt = make_tensor(make_smem_ptr(ss.dout.data()), typename T::SmemLayoutDOt{});
  Tensor sDSt = make_tensor(make_smem_ptr(ss.ds.data()), typename T::SmemLayoutDSt{});
  // Shared-memory descriptors, (atom, 1, k, stage): one per 16-element K slice. The B operands
  // of dV, dK and dQ are this CTA's column slice (stage index s·kSplit + h).
  auto thr_s = make_tiled_mma(typename T::AtomS{}).get_slice(0);
  auto thr_dv = make_tiled_mma(typename T::AtomDV{}).get_slice(0);
  auto thr_dk = make_tiled_mma(typename T::AtomDK{}).get_slice(0);
  auto thr_dq = make_tiled_mma(typename T::AtomDQ{}).get_slice(0);
  Tensor dK = thr_s.partition_fragment_A(sK);       // S:  A = K
  Tensor dQ = thr_s.partition_fragment_B(sQ);       // S:  B = Q
  Tensor dV = thr_s.partition_fragment_A(sV);       // dP: A = V
  Tensor dDO = thr_s.partition_fragment_B(sDO);     // dP: B = dO
  Tensor dDOt = thr_dv.partition_fragment_B(sDOt);  // dV: B = dO slice, MN-major
  Tensor dQt = thr_dk.partition_fragment_B(sQt);    // dK: B = Q slice, MN-major
  Tensor dDSt = thr_dq.partition_fragment_A(sDSt);  // dQ: A = dSᵀ, MN-major
  Tensor dKt = thr_dq.partition_fragment_B(sKt);    // dQ: B = K slice, MN-major
  constexpr int kKd = T::kHeadDim / T::kMmaK;       // K slices of S
  constexpr int kKdv = T::kHeadDimV / T::kMmaK;     // of dP
  constexpr int kKq = T::kBlockM / T::kMmaK;        // of dV and dK (query rows)
  constexpr int kKkv = T::kBlockN / T::kMmaK;       // of dQ (kv rows)
  static_assert(size<2>(decltype(dK){}) == kKd && size<2>(decltype(dV){}) == kKdv &&
                    size<2>(decltype(dQt){}) == kKq && size<2>(decltype(dDSt){}) == kKkv,
                "K slices");
  constexpr int kSplit = T::kSplit;
  const int h = t.h;
  using namespace UMMA;
  const uint64_t idesc_s = make_runtime_instr_desc<>(
      make_instr_desc<Element, Element, float, T::kBlockN, T::kBlockM, Major::K, Major::K>());
  const uint64_t idesc_dv = make_runtime_instr_desc<>(
      make_instr_desc<Element, Element, float, T::kBlockN, T::kSliceDV, Major::K, Major::MN>());
  const uint64_t idesc_dk = make_runtime_instr_desc<>(
      make_instr_desc<Element, Element, float, T::kBlockN, T::kSliceD, Major::K, Major::MN>());
  const uint64_t idesc_dq = make_runtime_instr_desc<>(
      make_instr_desc<Element, Element, float, T::kBlockM, T::kSliceD, Major::MN, Major::MN>());

  Ring q_ready, do_ready, p_ready, ds_ready, dq_free;
  // S(i) and dP(i) of the Q / dO stage they read.
  auto issue_s = [&](int qs) {
    FA4_UNROLL
    for (int k = 0; k < kKd; ++k) {
      elected_umma_ss(dK(_0{}, _0{}, k, 0), dQ(_0{}, _0{}, k, qs), tmem + Plan::kS, k > 0 ? 1u : 0u,
                      idesc_s);
    }
    elected_umma_commit(bar_ptr<T, Bar::kSFull>(ss));
  };
  auto issue_dp = [&](int ds) {
    FA4_UNROLL
    for (int k = 0; k < kKdv; ++k) {
      elected_umma_ss(dV(_0{}, _0{}, k, 0), dDO(_0{}, _0{}, k, ds), tmem + Plan::kDP,
                      k > 0 ? 1u : 0u, idesc_s);
    }
    elected_umma_commit(bar_ptr<T, Bar::kDpFull>(ss));
  };
  auto wait_q = [&]() {
    const int qs = q_ready.index(T::kStagesQ);
    bar_wait(bar_ptr<T, Bar::kQFull>(ss, qs), q_ready.parity(T::kStagesQ));
    ++q_ready.count;
    return qs;
  };
  auto wait_do = [&]() {
    const int ds = do_ready.index(T::kStagesDo);
    bar_wait(bar_ptr<T, Bar::kDoFull>(ss, ds), do_ready.parity(T::kStagesDo));
    ++do_ready.count;
    return ds;
  };

  bar_wait(bar_ptr<T, Bar::kKVFull>(ss), 0);
  tmem_fence_after_sync();
  if (t.iters == 0) return;
  int qs = wait_q();
  issue_s(qs);
  int ds = wait_do();
  issue_dp(ds);
  for (int i = 0; i < t.iters; ++i) {
    FA4_SM100_DEBUG_BLOCK(t.m_of(i));
    const bool next = i + 1 < t.iters;
    bar_wait(bar_ptr<T, Bar::kPFull>(ss), p_ready.parity(1));
    ++p_ready.count;
    tmem_fence_after_sync();
    FA4_UNROLL
    for (int k = 0; k < kKq; ++k) {
      elected_umma_ts(tmem + Plan::slice_column(Plan::kS, k), dDOt(_0{}, _0{}, k, ds * kSplit + h),
                      tmem + Plan::kDV, (i > 0 || k > 0) ? 1u : 0u, idesc_dv);
    }
    elected_umma_commit(bar_ptr<T, Bar::kDoEmpty>(ss, ds));
    const int qs_i = qs;
    if (T::kStagesQ > 1 && next) {
      qs = wait_q();
      issue_s(qs);  // over P(i): in issue order after dV(i), which reads it
    }
    bar_wait(bar_ptr<T, Bar::kDsFull>(ss), ds_ready.parity(1));
    ++ds_ready.count;
    tmem_fence_after_sync();
    FA4_UNROLL
    for (int k = 0; k < kKq; ++k) {
      elected_umma_ts(tmem + Plan::slice_column(Plan::kDP, k),
                      dQt(_0{}, _0{}, k, qs_i * kSplit + h), tmem + Plan::kDK,
                      (i > 0 || k > 0) ? 1u : 0u, idesc_dk);
    }
    elected_umma_commit(bar_ptr<T, Bar::kQEmpty>(ss, qs_i));
    FA4_UNROLL
    for (int k = 0; k < kKkv; ++k) {
      // Over dS(i): in issue order after dK(i), which reads it (Note [bwd MMA order]).
      elected_umma_ss(dDSt(_0{}, _0{}, k, 0), dKt(_0{}, _0{}, k, h), tmem + Plan::kDQ,
                      k > 0 ? 1u : 0u, idesc_dq);
    }
    elected_umma_commit(bar_ptr<T, Bar::kDsEmpty>(ss));
    elected_umma_commit(bar_ptr<T, Bar::kDqFull>(ss));
    if (T::kStagesQ == 1 && next) {
      qs = wait_q();  // the load refilled the one stage once dK(i) had read it (kQEmpty)
      issue_s(qs);
    }
    if (next) {
      ds = wait_do();
      bar_wait(bar_ptr<T, Bar::kDqEmpty>(ss), dq_free.parity(1));
      ++dq_free.count;
      tmem_fence_after_sync();
      issue_dp(ds);  // over dQ(i), which the reduce warpgroup has loaded
    }
  }
  elected_umma_commit(bar_ptr<T, Bar::kDkvFull>(ss));
}

// ---- Compute roles -------------------------------------------------------------------------
// Warpgroup w owns query columns [64 w, 64 w + 64) of S and dP; thread `row` holds kv row `row`
// (the per-element work: sm100/bwd/compute.cuh).
template <class T>
__device__ void compute_role(const KernelParams<T>& kp, typename T::SharedStorage& ss,
                             uint32_t tmem, const TileWork& t, int w, int row) {
  constexpr int kCols = T::kBlockM / 2;  // query columns of this warpgroup
  const uint32_t tmem_row = tmem + (uint32_t(row & ~31) << 16);
  const int c0 = w * kCols;
  Tensor sDS = make_tensor(make_smem_ptr(ss.ds.data()), typename T::SmemLayoutDS{});
  const int kv = t.n * T::kBlockN + row;         // key index within the sequence
  const RowBounds seen = t.mask.col_bounds(kv);  // the query rows that see this key
  Ring q_ready, s_ready, dp_ready, ds_free;
  for (int i = 0; i < t.iters; ++i) {
    FA4_SM100_DEBUG_BLOCK(t.m_of(i));
    const int m = t.m_of(i);
    const bool masked = block_needs_mask<T::kBlockM, T::kBlockN>(t.mask, m, t.n);
    const int qs = q_ready.index(T::kStagesQ);
    bar_wait(bar_ptr<T, Bar::kQFull>(ss, qs), q_ready.parity(T::kStagesQ));
    ++q_ready.count;
    bar_wait(bar_ptr<T, Bar::kSFull>(ss), s_ready.parity(1));
    ++s_ready.count;
    tmem_fence_after_sync();
    float dsf[kCols];
    compute_p<T>(kp.score, tmem_row, c0, m * T::kBlockM + c0, ss.lse2[qs] + c0, seen, masked, dsf);
    tmem_wait_st();
    tmem_fence_before_sync();
    bar_arrive(bar_ptr<T, Bar::kPFull>(ss));

    bar_wait(bar_ptr<T, Bar::kDpFull>(ss), dp_ready.parity(1));
    ++dp_ready.count;
    tmem_fence_after_sync();
    // dS goes to shared memory too (for dQ), once dQ(i-1) has read the previous one.
    if (i > 0) {
      bar_wait(bar_ptr<T, Bar::kDsEmpty>(ss), ds_free.parity(1));
      ++ds_free.count;
    }
    compute_ds<T>(tmem_row, c0, ss.dpsum[qs] + c0, dsf, [&](int c, const uint32_t (&ds16)[16]) {
      FA4_UNROLL
      for (int v = 0; v < 4; ++v) {
        *reinterpret_cast<uint4*>(&sDS(row, c0 + 32 * c + 8 * v, 0)) =
            make_uint4(ds16[4 * v], ds16[4 * v + 1], ds16[4 * v + 2], ds16[4 * v + 3]);
      }
    });
    fence_async_smem();
    tmem_wait_st();
    tmem_fence_before_sync();
    bar_arrive(bar_ptr<T, Bar::kDsFull>(ss));
  }
  if (t.iters > 0) {
    bar_wait(bar_ptr<T, Bar::kDkvFull>(ss), 0);
    tmem_fence_after_sync();
  }
  store_dk_dv<T>(kp.p, t.seq, t.b, t.head_kv, kv, t.iters > 0, tmem_row, w, t.h);
}

// ---- Reduce role ---------------------------------------------------------------------------
// Note [sm100 dQ]: dQ(i) (kBlockM query rows × this CTA's kSliceD columns, fp32, summed over the
// tile's 128 kv rows by one MMA) goes to the workspace's row-major accumulator as kSliceD / 32
// TMA reduce-adds of kBlockM × 32 sub-tiles (cp.reduce.async.bulk.tensor .add, UTMAREDG): 4
// operations per 128-row block at d = 128, where a per-element atomic scheme issues 128·128 =
// 16384 (per 16-byte vector, 4096). The warpgroup loads the whole dQ before releasing TMEM
// (kDqEmpty), so the next dP starts while the sub-tiles go out through two staging buffers.
// Deterministic mode: the block's reduce-adds wait for its turn counter (Note [deterministic
// dQ]); the kSplit CTAs of a tile add to disjoint columns, so only the order between tiles
// matters: each CTA passes the counter once, and a tile's CTAs wait until every CTA of the tiles
// after it has passed (kSplit · turn), in either order among themselves.
//
// Note [M = 64 dQ]: with 64-row Q blocks (split kernels) dQ is an M = 64 MMA, whose row r lands
// in TMEM lane 32·(r / 16) + r % 16, lanes 0-15 of each warp's quarter (CuTe's 1-SM M = 64
// layout). A 32x32b load gives lane 32w + l to thread l of warp w, so threads l < 16 hold row
// 16w + l and threads l >= 16 load columns no MMA wrote and store nothing.
template <class T>
__device__ void reduce_role(const KernelParams<T>& kp, typename T::SharedStorage& ss, uint32_t tmem,
                            const TileWork& t, int row) {
  using Plan = typename T::Plan;
  constexpr int kChunks = T::kSliceD / T::kDqCols;
  constexpr int kBarrierId = 1;  // named barrier of the 128 reduce threads
  static_assert(T::kBlockM == 128 || T::kBlockM == 64, "dQ lanes: M = 128 or M = 64 layout");
  constexpr bool kHalfLanes = T::kBlockM == 64;
  const int q_row = kHalfLanes ? 16 * (row / 32) + row % 16 : row;
  const bool has_row = !kHalfLanes || row % 32 < 16;
  const uint32_t lane_base = uint32_t(row & ~31) << 16;
  const bool leader = row == 0;
  Tensor mDQ = kp.tma_dq.get_tma_tensor(kp.shape_dq);
  auto tma = kp.tma_dq.get_slice(_0{});
  Ring dq_ready;
  for (int i = 0; i < t.iters; ++i) {
    FA4_SM100_DEBUG_BLOCK(t.m_of(i));
    const int head = t.head_kv * kp.group + t.g_of(i);
    const int m = t.m_of(i);
    const int64_t wrow = t.row0_ws + int64_t(m) * T::kBlockM;
    bar_wait(bar_ptr<T, Bar::kDqFull>(ss), dq_ready.parity(1));
    ++dq_ready.count;
    tmem_fence_after_sync();
    uint32_t dq[T::kSliceD];
    FA4_UNROLL
    for (int c = 0; c < kChunks; ++c) {
      tmem_load_32(tmem + lane_base + Plan::kDQ + 32 * c,
                   *reinterpret_cast<uint32_t (*)[32]>(&dq[32 * c]));
    }
    tmem_wait_ld();
    tmem_fence_before_sync();
    bar_arrive(bar_ptr<T, Bar::kDqEmpty>(ss));
    int* sem = kp.p.fwd.deterministic ? kp.ws.sem(head, wrow) : nullptr;
    if (leader && sem != nullptr) {
      dq_turn_wait(sem, T::kSplit * dq_turn(block_range<T::kBlockM, T::kBlockN>(t.mask, m), t.n));
    }
    Tensor gDQ = local_tile(mDQ(_, _, head), Shape<Int<T::kBlockM>, Int<T::kDqCols>>{},
                            make_coord(int(wrow / T::kBlockM), _));
    FA4_UNROLL
    for (int c = 0; c < kChunks; ++c) {
      const int buf = c % T::kDqBuffers;
      Tensor sDQ = make_tensor(make_smem_ptr(ss.dq[buf].data()), typename T::SmemLayoutDQ{});
      // The buffer's previous reduce-add has read it: at most kDqBuffers - 1 in flight.
      if (leader) tma_store_wait<T::kDqBuffers - 1>();
      cutlass::arch::NamedBarrier::sync(128, kBarrierId);
      if (has_row) {
        FA4_UNROLL
        for (int v = 0; v < T::kDqCols / 4; ++v) {
          *reinterpret_cast<uint4*>(&sDQ(q_row, 4 * v)) =
              make_uint4(dq[32 * c + 4 * v], dq[32 * c + 4 * v + 1], dq[32 * c + 4 * v + 2],
                         dq[32 * c + 4 * v + 3]);
        }
      }
      fence_async_smem();
      cutlass::arch::NamedBarrier::sync(128, kBarrierId);
      if (leader) {
        copy(kp.tma_dq, tma.partition_S(sDQ), tma.partition_D(gDQ(_, _, t.h * kChunks + c)));
        tma_store_arrive();
      }
    }
    if (leader && sem != nullptr) dq_turn_pass(sem);
  }
  // The last reduce-adds must finish reading shared memory before the CTA goes away.
  if (leader) tma_store_wait<0>();
}

// ---- Kernel --------------------------------------------------------------------------------
template <class T>
__global__ void __launch_bounds__(T::kThreads, 1)
    bwd_kernel(const __grid_constant__ KernelParams<T> kp) {
#if defined(__CUDA_ARCH_FEAT_SM100_ALL)
  extern __shared__ char smem[];
  auto& ss = *reinterpret_cast<typename T::SharedStorage*>(smem);
  const int warp = threadIdx.x / 32;
  const Role role = warp_role(warp);
  FA4_SM100_DEBUG_BEGIN(kBwdSm100, typename T::Barriers, ss.bars, role);
  if (threadIdx.x == 0) {
    cute::prefetch_tma_descriptor(kp.tma_q.get_tma_descriptor());
    cute::prefetch_tma_descriptor(kp.tma_do.get_tma_descriptor());
    cute::prefetch_tma_descriptor(kp.tma_k.get_tma_descriptor());
    cute::prefetch_tma_descriptor(kp.tma_v.get_tma_descriptor());
    T::Barriers::init(ss.bars);
    cutlass::arch::fence_barrier_init();
  }
  // The MMA warp allocates TMEM and frees it at the end.
  const uint32_t tmem =
      tmem_allocate_for_cta(role == Role::kMma, &ss.tmem_base, T::Plan::kAllocColumns);
  const int lane = threadIdx.x % 32;
  // Each role derives its tile after its setmaxnreg: derived once before the switch, the TileWork
  // stayed live across it and hd 192 spilled 40 bytes of it once q_blocks_seeing became closed
  // form (tests/sass/test_sass_sm100_bwd_split.py bounds the spills).
  switch (role) {
    case Role::kCompute0:
    case Role::kCompute1: {
      cutlass::arch::warpgroup_reg_alloc<kRegsCompute>();
      const TileWork t = tile_work(kp);
      FA4_SM100_DEBUG_TILE(t.b, t.head_kv, t.n);
      compute_role(kp, ss, tmem, t, role == Role::kCompute0 ? 0 : 1, threadIdx.x % 128);
      break;
    }
    case Role::kReduce: {
      cutlass::arch::warpgroup_reg_alloc<kRegsReduce>();
      const TileWork t = tile_work(kp);
      FA4_SM100_DEBUG_TILE(t.b, t.head_kv, t.n);
      reduce_role(kp, ss, tmem, t, threadIdx.x % 128);
      break;
    }
    default: {
      cutlass::arch::warpgroup_reg_dealloc<kRegsOther>();
      const TileWork t = tile_work(kp);
      FA4_SM100_DEBUG_TILE(t.b, t.head_kv, t.n);
      if (role == Role::kMma) mma_role<T>(ss, tmem, t);
      if (role == Role::kLoad && lane == 0) load_role(kp, ss, t);
      break;
    }
  }
  // Every tcgen05 operation has completed: the compute warpgroups waited for kDkvFull (committed
  // after the last MMA) and the reduce warpgroup for its own loads.
  tmem_free_for_cta(role == Role::kMma, tmem, T::Plan::kAllocColumns);
#endif
}

// ---- Launch --------------------------------------------------------------------------------
template <class T>
Status launch_bwd(const BwdParams& p, const DeviceInfo& dev, void* workspace, cudaStream_t stream) {
  using Element = typename T::Element;
  const FwdParams& f = p.fwd;
  KernelParams<T> kp;
  kp.p = p;
  kp.ws = workspace_of(f, workspace, T::kHeadDim);
  kp.score = ScoreScale::make(f.softmax_scale, f.softcap);
  kp.group = f.heads_q / f.heads_kv;
  const auto [q, dout, k, v] = bwd_views(p);
  kp.shape_q = q.shape();
  kp.shape_do = dout.shape();
  kp.shape_k = k.shape();
  kp.shape_v = v.shape();
  kp.shape_dq = make_shape(int(kp.ws.rows), kp.ws.head_dim, kp.ws.heads);
  kp.tma_q = make_tma_tile<Element, typename T::SmemLayoutQ, T::kBlockM, T::kHeadDim>(q);
  kp.tma_do = make_tma_tile<Element, typename T::SmemLayoutDO, T::kBlockM, T::kHeadDimV>(dout);
  kp.tma_k = make_tma_tile<Element, typename T::SmemLayoutK, T::kBlockN, T::kHeadDim>(k);
  kp.tma_v = make_tma_tile<Element, typename T::SmemLayoutV, T::kBlockN, T::kHeadDimV>(v);
  const RowBlockGrid row_grid = RowBlockGrid::of(f);
  const int64_t pp_blocks = row_grid.blocks(f);
  if (pp_blocks > 0) {
    kp.tma_dq = make_tma_dq<T>(kp.ws);
    bwd_preprocess<Element><<<unsigned(pp_blocks), 256, 0, stream>>>(p, kp.ws, row_grid);
  }
  // Note [bwd tile order options]: an item takes kSplit CTAs, one SM each.
  kp.grid = BwdGrid::make((f.seqlen_k + T::kBlockN - 1) / T::kBlockN, f.heads_kv, f.batch,
                          f.deterministic, dev.num_sms / T::kSplit,
                          dev.tile_order.backward_or_default(f.causal, f.deterministic),
                          BwdGrid::pair_bytes(f.seqlen_q, kp.group, T::kHeadDim, T::kHeadDimV));
  const int64_t blocks = int64_t(kp.grid.n_tiles) * f.heads_kv * f.batch * T::kSplit;
  if (blocks > 0) {
    FA4_SM100_DEBUG_ATTACH(stream);
    const Status s = launch_kernel("bwd_sm100", bwd_kernel<T>, dim3(unsigned(blocks)), T::kThreads,
                                   T::kSmemBytes, stream, kp);
    if (s != Status::kOk) return s;
  }
  if (pp_blocks > 0) {
    bwd_postprocess_rows<Element, T::kHeadDim>
        <<<unsigned(pp_blocks), 256, 0, stream>>>(p, kp.ws, row_grid);
  }
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    return kernel_fail(Status::kCudaError, "bwd_sm100 postprocess launch: %s",
                       cudaGetErrorString(e));
  }
  return Status::kOk;
}

}  // namespace fa4::sm100::bwd

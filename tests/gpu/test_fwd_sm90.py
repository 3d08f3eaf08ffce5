"""SM90 forward kernel against the fp32 reference (tolerance rule of DESIGN.md §5), on an H100/H200.

Outputs are poisoned: before each call the caching allocator's free blocks are filled with NaN,
so an element the kernel fails to write shows up as NaN in the comparison (gpu_helpers.poison).
The *_case functions are gpu_helpers', shared with tests/gpu/test_fwd_sm100.py (same cases,
another backend).
"""

import pytest
import torch
from gpu_helpers import (
    FWD_CASES,
    check,
    compiled_hdims,
    cu_seqlens,
    fwd_dense_case,
    fwd_varlen_case,
    make,
    poison,
    repeatable_case,
    run,
    seqused_k_case,
    strided_many_tiles_case,
)
from helpers import assert_tolerance

import fa4
from fa4 import build_info, manifest, reference

pytestmark = pytest.mark.gpu


def _sm90_hdims():
    return compiled_hdims("fwd", "sm90")


@pytest.fixture(autouse=True)
def _needs_sm90_kernel():
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an SM90 (H100/H200) device")
    if not _sm90_hdims():
        pytest.skip(f"no SM90 forward kernel in this build: {build_info.CONFIG.get('reason')}")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", range(len(FWD_CASES)))
@pytest.mark.parametrize("hdims", manifest.head_dims_of("sm90", "fwd"))
def test_dense(hdims, case, dtype):
    if hdims not in _sm90_hdims():
        pytest.skip(f"head dims {hdims} not compiled (FA4_HDIMS)")
    fwd_dense_case("sm90", hdims, case, dtype)


@pytest.mark.parametrize("kw", [{}, {"causal": True}, {"window_size": (50, 10)}])
def test_varlen(kw):
    fwd_varlen_case("sm90", _sm90_hdims()[0], kw)


def test_varlen_seqused_k():
    seqused_k_case("sm90", _sm90_hdims()[0])


def test_non_contiguous_heads_and_large_batch_heads():
    d, d_v = _sm90_hdims()[0]
    if d != d_v:
        pytest.skip("packed qkv needs d == d_v")
    strided_many_tiles_case("sm90", d)


def test_repeatable():
    repeatable_case("sm90", _sm90_hdims()[0])


@pytest.mark.parametrize("kw", [{"causal": True}, {"window_size": (300, 0)}, {}])
def test_static_and_dynamic_schedules_agree(monkeypatch, kw):
    """Note [dynamic tiles]: which CTA computes a tile must not change its bits. Many more tiles
    than CTAs (8 x 16 heads x 24 Q tiles), once with the run-time tile counter (the default) and
    once with the static stride (FA4_STATIC_SCHEDULE=1), both against the reference."""
    d, d_v = _sm90_hdims()[0]
    q, k, v = make((8, 3000, 16, d), (8, 3000, 4, d), d_v, torch.bfloat16, seed=11)
    dynamic = run(q, k, v, **kw)
    monkeypatch.setenv("FA4_STATIC_SCHEDULE", "1")
    static = run(q, k, v, **kw)
    check(q, k, v, *static, **kw)
    assert torch.equal(dynamic[0], static[0]) and torch.equal(dynamic[1], static[1])


@pytest.mark.parametrize("shape", [(8, 3000, 16, 4), (40, 512, 16, 16)])
def test_tile_orders_agree(monkeypatch, shape):
    """Note [tile order options]: FA4_TILE_ORDER reorders the causal tiles (the partial section
    first, sections of one wave, of 3 pairs); every order computes every tile once, bit-equal to
    the default order and within tolerance of the reference. 512 rows: the short causal case,
    the three-CTA kernel at hd64. A token it does not know is refused before any launch."""
    d, d_v = _sm90_hdims()[0]
    b, s, h, h_kv = shape
    q, k, v = make((b, s, h, d), (b, s, h_kv, d), d_v, torch.bfloat16, seed=s)
    monkeypatch.delenv("FA4_TILE_ORDER", raising=False)
    default = run(q, k, v, causal=True)
    check(q, k, v, *default, causal=True)
    for order in ("plain", "first", "wave", "first,wave", "3", "first,4"):
        monkeypatch.setenv("FA4_TILE_ORDER", order)
        got = run(q, k, v, causal=True)
        assert torch.equal(got[0], default[0]) and torch.equal(got[1], default[1]), order
    monkeypatch.setenv("FA4_TILE_ORDER", "first,last")
    with pytest.raises(RuntimeError, match="FA4_TILE_ORDER=first,last"):
        run(q, k, v, causal=True)


def varlen_under_env(monkeypatch, name, value, lens, hdims, seed, **kw):
    """Varlen sequences of the given lengths (4 query heads, 2 K/V heads) run once as they are and
    once with the environment variable set: the second against the reference, bit-equal to the
    first (the variable changes which CTA runs a tile, never its arithmetic)."""
    d, d_v = hdims
    cu = cu_seqlens(lens)
    q, k, v = make((sum(lens), 4, d), (sum(lens), 2, d), d_v, torch.bfloat16, seed=seed)

    def call():
        poison()
        return fa4.attention_varlen(
            q, k, v, cu, cu, max(lens), max(lens), return_lse=True, backend="sm90", **kw
        )

    first = call()
    monkeypatch.setenv(name, value)
    second = call()
    ref, ref_lse = reference.attention_varlen_ref(q, k, v, cu, cu, **kw)
    pt, pt_lse = reference.attention_varlen_ref(q, k, v, cu, cu, upcast=False, **kw)
    assert_tolerance("out", second[0], ref, pt, q.dtype)
    assert_tolerance("lse", second[1], ref_lse, pt_lse, torch.float32)
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])


@pytest.mark.parametrize("kw", [{"causal": True}, {}])
@pytest.mark.parametrize("hdims", manifest.head_dims_of("sm90", "fwd"))
def test_tile_boundaries(monkeypatch, hdims, kw):
    """Consecutive tiles of one CTA share the Q buffer, the K/V pipelines' phases, the tile ring
    and the O staging buffer. Each CTA walks ~10 tiles: varlen sequences of 0 to 700 rows (empty
    tiles between full ones, one-block tiles, rows past the end), GQA, under the static stride
    (CTA c: items c, c + grid, ...) and the run-time counter; both against the reference and
    bit-equal to each other; then a dense problem under the static stride."""
    if hdims not in _sm90_hdims():
        pytest.skip(f"head dims {hdims} not compiled (FA4_HDIMS)")
    d, d_v = hdims
    g = torch.Generator().manual_seed(d + d_v)
    choices = torch.tensor([0, 1, 63, 64, 65, 128, 129, 200, 700])
    lens = choices[torch.randint(len(choices), (60,), generator=g)].tolist()
    varlen_under_env(monkeypatch, "FA4_STATIC_SCHEDULE", "1", lens, hdims, d, **kw)
    # Dense problems store O by TMA (Note [TMA-store epilogue]): 33 x 8 heads of 129 rows, one
    # 192-row tile each at hd64, two 128-row tiles (the second with one row) elsewhere.
    qd, kd, vd = make((33, 129, 8, d), (33, 129, 8, d), d_v, torch.bfloat16, seed=d + 1)
    check(qd, kd, vd, *run(qd, kd, vd, **kw), **kw)


@pytest.mark.parametrize("kw", [{}, {"causal": True}, {"window_size": (100, 30)}])
def test_hd64_idle_warpgroups(monkeypatch, kw):
    """Note [idle warpgroup]: the three-consumer kernel's 192-row tiles leave one or two of their
    warpgroups past the end of a sequence in its last tile; those skip the tile's GEMMs and
    softmax but keep every turn and every K/V stage's phase. Varlen sequences that end in each
    third of a tile, the longest over 1024 rows so that causal and local problems take that kernel
    too (Note [short causal hd64]), three CTAs (each walks dozens of tiles, idle and not, so a
    phase off by one would show), against the reference and bit-equal to the full grid."""
    if (64, 64) not in _sm90_hdims():
        pytest.skip("head dim 64 not compiled (FA4_HDIMS)")
    lens = [1100, 65, 129, 1, 193, 257, 320, 1345, 0, 700, 128, 383]
    varlen_under_env(monkeypatch, "FA4_NUM_SMS", "3", lens, (64, 64), 11, **kw)


@pytest.mark.parametrize("hd", [64, 96, 128, 192, 256])
@pytest.mark.parametrize(
    "s_q, s_k, kw",
    [
        (1500, 1500, {"causal": True}),
        (1300, 1700, {"causal": True}),  # the diagonal 400 keys right: off the block edges
        (1700, 1300, {"causal": True}),  # the first 400 rows see no key
        (1400, 1400, {"window_size": (300, 0)}),
        (1400, 1400, {"window_size": (-1, 70)}),
        (1400, 1400, {"window_size": (-300, None)}),  # rows 1100.. see no key (shifted left)
    ],
)
def test_slice_block_end(hd, s_q, s_k, kw):
    """Note [slice block end]: a consumer warpgroup skips the blocks masked off for its 64 rows
    (hd64's 192-row tiles, hd192's 64-key and hd256's 80-key blocks) while the others of its tile
    run them (hd96 / hd128 only off the diagonal's block edges); causal with the diagonal on and
    off the block edges, rows that see nothing, and right windows; more than 1024 rows so that
    hd64 takes the three-consumer kernel."""
    if (hd, hd) not in _sm90_hdims():
        pytest.skip(f"head dim {hd} not compiled (FA4_HDIMS)")
    q, k, v = make((1, s_q, 4, hd), (1, s_k, 2, hd), hd, torch.bfloat16, seed=s_q + hd)
    check(q, k, v, *run(q, k, v, **kw), **kw)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("s", [1024, 1025])
def test_hd64_short_causal_dispatch_boundary(s, dtype):
    """Note [short causal hd64] and Note [three CTAs at short causal hd64]: causal hd64 problems
    with at most 1024 query rows per sequence run the three-CTA kernel (bf16 and fp16),
    longer ones the three-warpgroup kernel; both sides of the
    boundary against the reference (the other tests reach them as well, by their sizes)."""
    if (64, 64) not in _sm90_hdims():
        pytest.skip("hd64 not compiled (FA4_HDIMS)")
    q, k, v = make((1, s, 4, 64), (1, s, 2, 64), 64, dtype, seed=s)
    check(q, k, v, *run(q, k, v, causal=True), causal=True)


@pytest.mark.parametrize(
    "s, causal, dtype",
    [
        (512, False, torch.bfloat16),  # 64-key blocks: 80 would compute 560 columns per tile
        (512, True, torch.float16),
        (1000, True, torch.bfloat16),
        (1024, False, torch.float16),  # 80-key blocks: 1040 columns, under the 4 % limit
        (2048, True, torch.bfloat16),
    ],
)
def test_hd256_block_width_dispatch(s, causal, dtype):
    """Note [hd256 narrow blocks]: both key-block widths at hd256 (the dispatch's choice on each
    side of its limit, by tests/api/test_shared_headers.py::test_keys_computed's counts), GQA, more
    tiles than a few CTAs walk at once; against the reference."""
    if (256, 256) not in _sm90_hdims():
        pytest.skip("hd256 not compiled (FA4_HDIMS)")
    q, k, v = make((2, s, 8, 256), (2, s, 2, 256), 256, dtype, seed=s + causal)
    check(q, k, v, *run(q, k, v, causal=causal), causal=causal)


def test_over_2_31_elements():
    """int64 offsets: q, k, v, out of 2^31 + 2^21 elements each (batch 8320 x 128 x 16 x 128,
    4 GB per tensor). Only the last batch entries, whose offsets are past 2^31 elements, are
    compared with the reference (computed on those slices)."""
    if torch.cuda.get_device_properties(0).total_memory < 40 << 30:
        pytest.skip("needs ~25 GB of device memory")
    d = 128
    if (d, d) not in _sm90_hdims():
        pytest.skip("hd128 not compiled (FA4_HDIMS)")
    b, s, h = 8320, 128, 16
    assert b * s * h * d > 2**31
    g = torch.Generator(device="cuda").manual_seed(31)
    q, k, v = (
        torch.randn(b, s, h, d, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(3)
    )
    out, lse = run(q, k, v, causal=True)
    tail = slice(b - 3, b)  # element offsets from (b - 3)·s·h·d > 2^31
    check(q[tail], k[tail], v[tail], out[tail], lse[tail], causal=True)

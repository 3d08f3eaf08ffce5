"""fa4.integrations.transformers on an H100/H200: `attn_implementation="fa4"` in tiny random
Transformers models, bf16 on CUDA, running fa4's SM90 kernels (the GPU counterpart of
tests/integrations/test_transformers.py; same five models and features).

Models: Llama, Qwen2 (layer 1 sliding window), Qwen3, Gemma-2 (softcap, scaling 48**-0.5,
alternating sliding layers) and gpt-oss (sinks, sliding layers, MoE), 2 layers, hidden 256,
4 query heads / 2 key-value heads of head dim 64, sequences of 120-270 tokens (several kernel
tiles; the window of 64 cuts through them). Each model is built once per module in fp32 on the
CPU (seeded), cast to bf16 on CUDA, and the fp32 baseline is a copy of the bf16 model cast back
to fp32 (the same, bf16-representable, weights: the comparison measures the computation only).
The baseline implementation is "sdpa", or "eager" for Gemma-2 and gpt-oss (sdpa takes no softcap
and no sinks).

Tolerance (DESIGN.md §5, tests/helpers.assert_tolerance): max|fa4-bf16 - fp32 baseline| <=
2 * max|baseline-bf16 - fp32 baseline| + 2 * bf16 rounding noise at the reference's scale, for
the logits and for the gradient of every parameter (one check per parameter). gpt-oss routes
every token to all of its experts (num_experts_per_tok = num_local_experts), so no discrete
expert choice can flip between the bf16 runs and make the errors incomparable.

No silent fallback: the module registers the integration with backend="sm90", so fa4's dispatch
raises (RuntimeError "'sm90' cannot run this ...") instead of running the reference when the
kernel cannot take a call, and every test counts the calls to the compiled ops
torch.ops.fa4._fwd_kernel / _bwd_kernel (a spy forwarding to the real namespace) and requires
one kernel call per fa4 call (and per backward of one).

Greedy generation compares the first 4 new tokens of fa4-bf16 with baseline-bf16 (bf16 runs may
part later). A token where they differ is accepted only as a tie: the fp32 model's logits of the
two tokens on the common prefix must be within 3x the baseline-bf16 logit error (either bf16
run may flip a near tie); anything else fails.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import pytest
import torch
from gpu_helpers import compiled_hdims
from helpers import assert_tolerance, rounding_noise

import fa4
from fa4 import build_info

transformers = pytest.importorskip("transformers")
fa4_hf = pytest.importorskip("fa4.integrations.transformers")

pytestmark = pytest.mark.gpu

VOCAB = 101
HEAD_DIM = 64
WINDOW = 64  # shorter than every sequence below, and not a multiple of their lengths
NEW_TOKENS = 4  # greedy tokens compared (bf16 runs may part later)
SHAPES = dict(
    vocab_size=VOCAB,
    hidden_size=256,
    intermediate_size=384,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,  # GQA: fa4 takes the 2 key/value heads as they are
    head_dim=HEAD_DIM,
    max_position_embeddings=1024,
    initializer_range=0.1,  # fairly peaked attention: windows, softcap and sinks matter
    pad_token_id=0,
)

# name: (config class, model class, extra config, baseline implementation)
MODELS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}, "sdpa"),
    "qwen2": (  # layer 0 full attention, layer 1 sliding window
        "Qwen2Config",
        "Qwen2ForCausalLM",
        dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1),
        "sdpa",
    ),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {}, "sdpa"),
    "gemma2": (  # layers alternate sliding / full; softcap; scaling 48**-0.5, not 64**-0.5
        "Gemma2Config",
        "Gemma2ForCausalLM",
        dict(sliding_window=WINDOW, attn_logit_softcapping=5.0, query_pre_attn_scalar=48),
        "eager",
    ),
    "gpt_oss": (  # sinks, sliding / full layers, MoE (every expert taken: no routing flips)
        "GptOssConfig",
        "GptOssForCausalLM",
        dict(
            sliding_window=WINDOW,
            num_local_experts=2,
            num_experts_per_tok=2,
            experts_implementation="eager",  # fp32 and bf16 alike (no grouped_mm dtype rules)
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},  # no YaRN warning
        ),
        "eager",
    ),
}


@dataclass
class Case:
    name: str
    model: torch.nn.Module  # bf16 on CUDA, switched between "fa4" and baseline
    ref: torch.nn.Module  # the same weights in fp32, baseline implementation
    baseline: str


@pytest.fixture(scope="module", autouse=True)
def _needs_sm90_and_kernel_backend():
    """Runs first (module scope, autouse): the device check, then fa4 registered with
    backend="sm90" (a fallback to the reference raises) and TF32 off for the fp32 baseline."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an SM90 (H100/H200) device")
    if not compiled_hdims("fwd", "sm90"):
        pytest.skip(f"no SM90 forward kernel in this build: {build_info.CONFIG.get('reason')}")
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    fa4_hf.register(backend="sm90")
    yield
    fa4_hf.register()
    torch.backends.cuda.matmul.allow_tf32 = tf32


def _missing_kernels(name: str, head_dim: int) -> str | None:
    for direction in ("fwd", "bwd"):
        compiled = compiled_hdims(direction, "sm90")
        if (head_dim, head_dim) not in compiled:
            return (
                f"{name}: head dim {head_dim} has no SM90 {direction} kernel in this build "
                f"(compiled: {compiled}; FA4_HDIMS)"
            )
    return None


def build(name: str) -> Case:
    config_name, model_name, extra, baseline = MODELS[name]
    config = getattr(transformers, config_name)(**SHAPES, **extra)
    why = _missing_kernels(name, config.head_dim)
    if why:
        pytest.skip(why)
    torch.manual_seed(0)
    model = getattr(transformers, model_name)(config).eval()
    if name == "gpt_oss":
        with torch.no_grad():  # sinks of the size of the scores, so that they matter
            for layer in model.model.layers:
                layer.self_attn.sinks.normal_(0.0, 2.0)
    model = model.to("cuda", torch.bfloat16)
    model.generation_config.pad_token_id = 0
    ref = copy.deepcopy(model).float()
    ref.set_attn_implementation(baseline)
    return Case(name, model, ref, baseline)


@pytest.fixture(scope="module", params=list(MODELS))
def case(request) -> Case:
    return build(request.param)


class _KernelSpy:
    """Stands in for torch.ops.fa4: counts the calls of the compiled kernel ops and forwards
    every attribute to the real namespace."""

    def __init__(self, real):
        self._real = real
        self.calls = {"_fwd_kernel": 0, "_bwd_kernel": 0}

    def __getattr__(self, name):
        attr = getattr(self._real, name)
        if name not in self.calls:
            return attr

        def counted(*args, **kwargs):
            self.calls[name] += 1
            return attr(*args, **kwargs)

        return counted


@pytest.fixture
def calls(monkeypatch):
    """Counts the fa4 calls the models make (attention, attention_varlen) and the compiled kernel
    calls they led to (_fwd_kernel, _bwd_kernel)."""
    spy = _KernelSpy(torch.ops.fa4)
    monkeypatch.setattr(torch.ops, "fa4", spy)
    counts = {"attention": 0, "attention_varlen": 0}
    for fn in list(counts):
        original = getattr(fa4, fn)

        def counted(*args, _fn=fn, _original=original, **kwargs):
            counts[_fn] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(fa4, fn, counted)

    class Calls:
        def __getitem__(self, key):
            return counts[key] if key in counts else spy.calls[key]

        def fa4(self):
            return counts["attention"] + counts["attention_varlen"]

    return Calls()


def assert_kernel_ran(calls, n_fa4: int, backward: bool = False) -> None:
    """n_fa4 fa4 calls, each one SM90 kernel launch (and one backward kernel each)."""
    assert calls.fa4() == n_fa4
    assert calls["_fwd_kernel"] == n_fa4, "an fa4 call did not reach the compiled kernel"
    assert calls["_bwd_kernel"] == (n_fa4 if backward else 0)


def logits(model, impl: str, **inputs) -> torch.Tensor:
    model.set_attn_implementation(impl)
    with torch.no_grad():
        return model(**inputs).logits.float()


def tokens(batch: int, length: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, VOCAB, (batch, length), generator=g).cuda()


def assert_rule(name, out, ref, pt) -> None:
    """fa4-bf16 (out) against the fp32 baseline (ref), 2x the baseline-bf16 (pt) error."""
    assert_tolerance(name, out.float(), ref.float(), pt.float(), torch.bfloat16)


def assert_downstream(name, out, ref, pt) -> None:
    """Parameters outside attention (MLP, router, norms, embeddings) see fa4 only through the
    attention outputs, which any bf16 attention rounds at 2^-8 relative. Their bf16 baseline can
    be far more exact than that (gpt-oss's router bias: 8.6e-7 against values of 0.027, H100,
    2026-12-06), so the 2x rule would hold fa4 to a precision its outputs cannot carry there:
    such gradients get 2x the baseline error plus 2 % of the tensor's largest entry."""
    err = (out.float() - ref.float()).abs().max().item()
    base = (pt.float() - ref.float()).abs().max().item()
    bound = 2.0 * base + 0.02 * ref.float().abs().max().item()
    assert err <= bound, f"{name}: max err {err:.3e} > {bound:.3e} (baseline {base:.3e})"


def test_logits(case, calls):
    ids = tokens(2, 200)
    ref = logits(case.ref, case.baseline, input_ids=ids)
    pt = logits(case.model, case.baseline, input_ids=ids)
    out = logits(case.model, "fa4", input_ids=ids)
    assert_kernel_ran(calls, 2)  # one dense call per layer
    assert calls["attention"] == 2
    assert_rule(f"{case.name} logits", out, ref, pt)


def _grads(model, impl, ids):
    model.set_attn_implementation(impl)
    model.train()  # attention_dropout is 0: training runs fa4 too
    try:
        model.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids).loss.backward()
        return {n: p.grad.float() for n, p in model.named_parameters() if p.grad is not None}
    finally:
        model.eval()
        model.zero_grad(set_to_none=True)


def test_gradients(case, calls):
    ids = tokens(2, 180, seed=2)
    ref = _grads(case.ref, case.baseline, ids)
    pt = _grads(case.model, case.baseline, ids)
    out = _grads(case.model, "fa4", ids)
    assert_kernel_ran(calls, 2, backward=True)
    assert ref.keys() == pt.keys() == out.keys()
    attn = [n for n in ref if "self_attn" in n]
    assert attn and all(ref[n].abs().max() > 0 for n in attn)  # gradients reach attention
    if case.name == "gpt_oss":
        assert any(n.endswith("sinks") for n in ref)  # the sinks' gradient is compared too
    for name in ref:
        if "self_attn" in name or name.endswith("sinks"):
            assert_rule(f"{case.name} grad {name}", out[name], ref[name], pt[name])
        else:
            assert_downstream(f"{case.name} grad {name}", out[name], ref[name], pt[name])


def test_padded_batch(case, calls):
    """A 2D attention mask, left padding in one row and right padding in the other."""
    ids = tokens(2, 240, seed=6)
    mask = torch.ones_like(ids)
    mask[0, :37] = 0
    mask[1, -45:] = 0
    ref = logits(case.ref, case.baseline, input_ids=ids, attention_mask=mask)
    pt = logits(case.model, case.baseline, input_ids=ids, attention_mask=mask)
    out = logits(case.model, "fa4", input_ids=ids, attention_mask=mask)
    assert_kernel_ran(calls, 2)
    assert calls["attention_varlen"] == 2
    real = mask.bool()
    assert_rule(f"{case.name} padded logits", out[real], ref[real], pt[real])


def test_packed_batch(case, calls):
    """Padding-free batch: two sequences end to end, position_ids restarting at 0, against
    separate runs; then the same boundaries as a flattening collator's cu_seq_lens kwargs."""
    la, lb = 120, 150
    a, b = tokens(1, la, seed=4), tokens(1, lb, seed=5)
    packed = torch.cat([a, b], dim=1)
    positions = torch.cat([torch.arange(la), torch.arange(lb)])[None].cuda()
    out = logits(case.model, "fa4", input_ids=packed, position_ids=positions, use_cache=False)
    assert_kernel_ran(calls, 2)
    assert calls["attention_varlen"] == 2
    ref = torch.cat([logits(case.ref, case.baseline, input_ids=x) for x in (a, b)], dim=1)
    pt = torch.cat([logits(case.model, case.baseline, input_ids=x) for x in (a, b)], dim=1)
    assert_rule(f"{case.name} packed logits", out, ref, pt)
    cu = torch.tensor([0, la, la + lb], dtype=torch.int32, device="cuda")
    given = logits(
        case.model, "fa4", input_ids=packed, position_ids=positions, use_cache=False,
        cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=lb, max_length_k=lb,
    )  # fmt: skip
    assert_kernel_ran(calls, 4)
    assert calls["attention_varlen"] == 4
    torch.testing.assert_close(given, out, atol=0, rtol=0)


def _last_logits(model, impl, row_tokens):
    return logits(model, impl, input_ids=row_tokens[None])[0, -1]


def test_generate(case, calls):
    """Greedy decoding from a left-padded batch (prefill and decode steps with a padding mask):
    the first NEW_TOKENS tokens of fa4-bf16 equal baseline-bf16's, up to fp32 near ties."""
    ids = tokens(2, 160, seed=3)
    mask = torch.ones_like(ids)
    ids[0, :29], mask[0, :29] = 0, 0
    runs = {}
    for impl in (case.baseline, "fa4"):
        case.model.set_attn_implementation(impl)
        with torch.no_grad():
            runs[impl] = case.model.generate(
                input_ids=ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False
            )[:, ids.shape[1] :]
    assert runs["fa4"].shape == (2, NEW_TOKENS)
    # 2 layers x (prefill + NEW_TOKENS - 1 steps); the padded prefill is varlen in both layers
    assert_kernel_ran(calls, 2 * NEW_TOKENS)
    assert calls["attention_varlen"] >= 2
    for row in range(2):
        differ = (runs["fa4"][row] != runs[case.baseline][row]).nonzero()
        if differ.numel() == 0:
            continue
        p = int(differ[0])
        # the common prefix without its padding (rope is relative: same logits)
        prefix = torch.cat([ids[row][mask[row].bool()], runs[case.baseline][row, :p]])
        ref = _last_logits(case.ref, case.baseline, prefix)
        pt = _last_logits(case.model, case.baseline, prefix)
        a, b = int(runs["fa4"][row, p]), int(runs[case.baseline][row, p])
        gap = (ref[a] - ref[b]).abs().item()
        noise = (pt - ref).abs().max().item()
        bound = 3 * noise + 2 * rounding_noise(ref, torch.bfloat16)
        assert gap <= bound, (
            f"{case.name} row {row}: token {p} is {a} with fa4, {b} with {case.baseline}; "
            f"their fp32 logits differ by {gap:.3e} > {bound:.3e} (not a bf16 near tie)"
        )

"""fa4.integrations.transformers: `attn_implementation="fa4"` in tiny random Transformers models.

Every model is built once per module (fp32, CPU, 2 layers, head dim 64: a head dim fa4
supports) and switched between its baseline implementation and "fa4" with
model.set_attn_implementation, so both runs use the same weights. The baseline is "sdpa" where
the model supports it, else "eager" (Gemma-2 and gpt-oss: sdpa takes no softcap and no sinks).

Tolerance: fp32 on CPU, fa4 runs its fp32 reference backend, so fa4 and the baseline differ only
in summation order (observed: below 1e-5 on logits). We use torch.testing.assert_close with
atol = rtol = 1e-4 (logits) and a 1e-4 bound relative to the largest gradient entry (gradients)
rather than the DESIGN rule of tests/helpers.assert_tolerance: that rule compares a
low-precision kernel with a naive low-precision implementation, and here there is no
low-precision computation to measure. The models are initialized with a large
initializer_range (peaked attention), so that a wrong window edge, a missing softcap or sink
moves the logits by far more than 1e-4; test_features_matter checks that for each feature.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass

import pytest
import torch
import transformers
from packaging.version import Version
from transformers import (
    AttentionInterface,
    Gemma2Config,
    Gemma2ForCausalLM,
    GptOssConfig,
    GptOssForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)
from transformers.masking_utils import AttentionMaskInterface, causal_mask_function, or_masks

import fa4
import fa4.integrations.transformers as fa4_hf

VOCAB = 101
WINDOW = 4  # shorter than every sequence below, so the sliding window matters
TOL = dict(atol=1e-4, rtol=1e-4)
SHAPES = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,  # GQA: fa4 takes the 2 key/value heads as they are
    head_dim=64,
    max_position_embeddings=256,
    initializer_range=0.2,  # peaked attention: masks and softcaps change the logits visibly
    pad_token_id=0,
)

# name: (config class, model class, extra config, baseline implementation)
MODELS = {
    "llama": (LlamaConfig, LlamaForCausalLM, {}, "sdpa"),
    "qwen2": (  # layer 0 full attention, layer 1 sliding window
        Qwen2Config,
        Qwen2ForCausalLM,
        dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1),
        "sdpa",
    ),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, {}, "sdpa"),
    "gemma2": (  # layers alternate sliding / full; softcap; scaling 48**-0.5, not 64**-0.5
        Gemma2Config,
        Gemma2ForCausalLM,
        dict(sliding_window=WINDOW, attn_logit_softcapping=1.0, query_pre_attn_scalar=48),
        "eager",
    ),
    "gpt_oss": (  # sinks, sliding / full layers, a 4-expert MoE
        GptOssConfig,
        GptOssForCausalLM,
        dict(
            sliding_window=WINDOW,
            num_local_experts=4,
            num_experts_per_tok=2,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},  # no YaRN warning
        ),
        "eager",
    ),
}


@dataclass
class Case:
    name: str
    model: torch.nn.Module
    baseline: str


def build(name: str) -> Case:
    config_cls, model_cls, extra, baseline = MODELS[name]
    torch.manual_seed(0)
    config = config_cls(**SHAPES, **extra)
    model = model_cls(config).eval()
    if name == "gpt_oss":
        with torch.no_grad():  # sinks of the size of the scores, so that they matter
            for layer in model.model.layers:
                layer.self_attn.sinks.normal_(0.0, 2.0)
    model.generation_config.pad_token_id = 0
    return Case(name, model, baseline)


@pytest.fixture(scope="module", autouse=True)
def reference_backend():
    """CPU runs fa4's reference backend; naming it keeps the one-time CPU warning away."""
    fa4_hf.register(backend="reference")
    yield
    fa4_hf.register()


@pytest.fixture(scope="module", params=list(MODELS))
def case(request) -> Case:
    return build(request.param)


@pytest.fixture
def fa4_calls(monkeypatch):
    """Counts the fa4 calls the models make (proves the "fa4" runs reached fa4)."""
    calls = {"attention": 0, "attention_varlen": 0}
    for fn in calls:
        original = getattr(fa4, fn)

        def counted(*args, _fn=fn, _original=original, **kwargs):
            calls[_fn] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(fa4, fn, counted)
    return calls


def logits(case: Case, impl: str, **inputs) -> torch.Tensor:
    case.model.set_attn_implementation(impl)
    with torch.no_grad():
        return case.model(**inputs).logits


def tokens(batch: int, length: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, VOCAB, (batch, length), generator=g)


def test_logits_match_baseline(case, fa4_calls):
    ids = tokens(2, 13)
    ref = logits(case, case.baseline, input_ids=ids)
    out = logits(case, "fa4", input_ids=ids)
    assert fa4_calls["attention"] == 2  # one dense call per layer
    torch.testing.assert_close(out, ref, **TOL)


def test_gradients_match_baseline(case, fa4_calls):
    ids = tokens(2, 11, seed=2)
    model = case.model
    model.train()  # attention_dropout is 0: training runs fa4 too
    grads = {}
    try:
        for impl in (case.baseline, "fa4"):
            model.set_attn_implementation(impl)
            model.zero_grad(set_to_none=True)
            model(input_ids=ids, labels=ids).loss.backward()
            params = model.named_parameters()
            grads[impl] = {n: p.grad.clone() for n, p in params if p.grad is not None}
    finally:
        model.eval()
        model.zero_grad(set_to_none=True)
    assert fa4_calls["attention"] == 2
    ref, out = grads[case.baseline], grads["fa4"]
    assert ref.keys() == out.keys()
    attn = [n for n in ref if "self_attn" in n]
    assert attn and all(ref[n].abs().max() > 0 for n in attn)  # gradients reach attention
    if case.name == "gpt_oss":
        assert any(n.endswith("sinks") for n in ref)  # the sinks' gradient is compared too
    for name in ref:
        scale = max(ref[name].abs().max().item(), 1e-6)
        err = (out[name] - ref[name]).abs().max().item()
        assert err <= 1e-4 * scale, f"{name}: max err {err:.3e} > 1e-4 * {scale:.3e}"


def test_generate_matches_baseline(case, fa4_calls):
    """Greedy decoding, left-padded batch: prefill and decode steps with a padding mask."""
    ids = tokens(2, 9, seed=3)
    mask = torch.ones_like(ids)
    ids[0, :3], mask[0, :3] = 0, 0
    runs = {}
    for impl in (case.baseline, "fa4"):
        case.model.set_attn_implementation(impl)
        runs[impl] = case.model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=8, do_sample=False
        )
    assert runs["fa4"].shape == (2, 17)
    # 2 layers x (prefill + 7 steps); the padded prefill is varlen in both layers (a sliding
    # layer's later steps may see no padding: dense)
    assert sum(fa4_calls.values()) == 2 * 8 and fa4_calls["attention_varlen"] >= 2
    assert torch.equal(runs["fa4"], runs[case.baseline])


def test_packed_sequences_match_separate_runs(case, fa4_calls):
    """Padding-free batch: two sequences end to end, position_ids restarting at 0."""
    a, b = tokens(1, 7, seed=4), tokens(1, 9, seed=5)
    packed = torch.cat([a, b], dim=1)
    positions = torch.cat([torch.arange(7), torch.arange(9)])[None]
    out = logits(case, "fa4", input_ids=packed, position_ids=positions, use_cache=False)
    assert fa4_calls["attention_varlen"] == 2 and fa4_calls["attention"] == 0
    ref = torch.cat([logits(case, case.baseline, input_ids=x) for x in (a, b)], dim=1)
    torch.testing.assert_close(out, ref, **TOL)
    # the same boundaries given as a flattening collator's cu_seq_lens kwargs
    cu = torch.tensor([0, 7, 16], dtype=torch.int32)
    given = logits(
        case, "fa4", input_ids=packed, position_ids=positions, use_cache=False,
        cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=9, max_length_k=9,
    )  # fmt: skip
    assert fa4_calls["attention_varlen"] == 4
    torch.testing.assert_close(given, out, atol=0, rtol=0)


def test_padded_batch_matches_baseline(case, fa4_calls):
    """A 2D attention mask with left padding in one row and right padding in the other."""
    ids = tokens(2, 12, seed=6)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    mask[1, -2:] = 0
    ref = logits(case, case.baseline, input_ids=ids, attention_mask=mask)
    out = logits(case, "fa4", input_ids=ids, attention_mask=mask)
    assert fa4_calls["attention_varlen"] == 2 and fa4_calls["attention"] == 0
    real = mask.bool()
    torch.testing.assert_close(out[real], ref[real], **TOL)


@pytest.mark.parametrize(
    "name, change",
    [
        ("qwen2", dict(sliding_window=WINDOW + 1)),
        ("gemma2", dict(sliding_window=WINDOW + 1)),
        ("gemma2", dict(attn_logit_softcapping=None)),
        ("gpt_oss", dict(sliding_window=WINDOW + 1)),
    ],
)
def test_features_matter(name, change):
    """The window (off by one token), the softcap and the sinks each move the logits by far more
    than the tolerance, so the comparisons above would catch them being handled wrong."""
    case = build(name)
    ids = tokens(1, 13)
    ref = logits(case, case.baseline, input_ids=ids)
    for key, value in change.items():
        setattr(case.model.config, key, value)
        for layer in case.model.model.layers:
            attn = layer.self_attn
            if key == "sliding_window" and attn.sliding_window is not None:
                attn.sliding_window = value
            if key == "attn_logit_softcapping":
                attn.attn_logit_softcapping = value
    moved = (logits(case, case.baseline, input_ids=ids) - ref).abs().max().item()
    assert moved > 100 * TOL["atol"]


def test_sinks_matter():
    case = build("gpt_oss")
    ids = tokens(1, 13)
    ref = logits(case, "fa4", input_ids=ids)
    with torch.no_grad():
        for layer in case.model.model.layers:
            layer.self_attn.sinks.fill_(-1e4)  # weight 0: no sink
    moved = (logits(case, "fa4", input_ids=ids) - ref).abs().max().item()
    assert moved > 100 * TOL["atol"]


def test_dropout_raises():
    case = build("llama")
    case.model.set_attn_implementation("fa4")
    case.model.train()
    for layer in case.model.model.layers:
        layer.self_attn.attention_dropout = 0.1
    with pytest.raises(NotImplementedError, match="dropout"):
        case.model(input_ids=tokens(1, 5))


def test_4d_mask_raises():
    case = build("llama")
    case.model.set_attn_implementation("fa4")
    mask = torch.zeros(1, 1, 5, 5)
    with pytest.raises(NotImplementedError, match="4D attention mask"):
        case.model(input_ids=tokens(1, 5), attention_mask=mask)


def test_static_cache_raises():
    """A static cache's keys run past the current token: fa4_mask refuses it."""
    case = build("llama")
    case.model.set_attn_implementation("fa4")
    with pytest.raises(NotImplementedError, match="keys must end at the last query"):
        case.model.generate(
            input_ids=tokens(1, 5), max_new_tokens=2, do_sample=False, cache_implementation="static"
        )


def test_mask_function_rules():
    def mask(**kw):
        return fa4_hf.fa4_mask(batch_size=1, q_length=4, kv_length=4, **kw)

    assert mask(mask_function=causal_mask_function) is None
    assert mask(attention_mask=torch.ones(1, 4, dtype=torch.bool)) is None
    padded = torch.tensor([[False, True, True, True]])
    assert torch.equal(mask(attention_mask=padded), padded)
    bidirectional_images = or_masks(causal_mask_function, lambda b, h, q, kv: kv < 2)
    with pytest.raises(NotImplementedError, match="mask part"):
        mask(mask_function=bidirectional_images)


def test_call_rules():
    q = torch.randn(1, 4, 6, 64)
    kv = torch.randn(1, 2, 6, 64)
    module = torch.nn.Module()
    with pytest.raises(NotImplementedError, match="without causality"):
        fa4_hf.fa4_attention_forward(module, q, kv, kv, None, sliding_window=3, is_causal=False)
    with pytest.raises(NotImplementedError, match="output_attentions"):
        fa4_hf.fa4_attention_forward(module, q, kv, kv, None, output_attentions=True)
    out, weights = fa4_hf.fa4_attention_forward(module, q, kv, kv, None, sliding_window=3)
    assert weights is None and out.shape == (1, 6, 4, 64)
    expected = fa4.attention(
        q.transpose(1, 2), kv.transpose(1, 2), kv.transpose(1, 2), causal=True,
        window_size=(2, 0), backend="reference",
    )  # fmt: skip
    torch.testing.assert_close(out, expected, atol=0, rtol=0)


def test_register_is_idempotent():
    fa4_hf.register(backend="reference")
    fa4_hf.register(backend="reference")
    assert AttentionInterface._global_mapping["fa4"] is fa4_hf.fa4_attention_forward
    assert AttentionMaskInterface._global_mapping["fa4"] is fa4_hf.fa4_mask
    assert Version(transformers.__version__) >= Version("5.25.0")  # setup.py's extra


def test_import_fa4_does_not_import_transformers():
    code = "import sys, fa4, fa4.integrations; assert 'transformers' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)

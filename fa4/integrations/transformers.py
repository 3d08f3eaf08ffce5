"""fa4 as a Hugging Face Transformers attention implementation: `attn_implementation="fa4"`.

    import fa4.integrations.transformers  # registers "fa4" (importing is enough)
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="fa4")
    model.set_attn_implementation("fa4")  # or switch a loaded model

Importing this module registers "fa4" with Transformers' AttentionInterface (the attention
function) and AttentionMaskInterface (the mask each layer receives). register() does it again,
idempotently, and sets the fa4 backend / deterministic mode used by every call. Tested with
transformers 5.25.0 (docs/integrations.md).

What a layer passes and what fa4 gets:
- query (b, h, s_q, d), key/value (b, h_kv, s_k, d): transposed views to (b, s, h, d); GQA keys
  and values go in with their own head count (fa4 takes h % h_kv == 0 natively).
- scaling -> softmax_scale; softcap (Gemma-2's attn_logit_softcapping) -> softcap; s_aux
  (gpt-oss sinks) -> learnable_sink in float32 (h,), differentiable.
- sliding_window = w: Transformers' masks keep key j for query i when i - w < j <= i (the token
  and the w - 1 before it), which is fa4's window_size=(w - 1, 0) with causal=True.
- is_causal: the call's value, else module.is_causal (else True).
- The mask: the "fa4" mask function hands each layer None (no padding) or the 2D boolean
  key mask (b, s_k) (True = real token). With it, the real tokens are packed and run through
  fa4.attention_varlen; padded query rows get zeros.
- Without a mask: cu_seq_lens_q/k with max_length_q/k (a flattening collator's kwargs) or
  position_ids that do not increase by 1 (packed, padding-free batches: a sequence starts at
  every break) give fa4.attention_varlen; otherwise fa4.attention on the dense batch.
Raised rather than computed wrong: dropout > 0 (fa4 has no dropout), output_attentions=True
(fa4 never forms the probabilities), position_bias, 4D masks, masks fa4 cannot express (custom
or/and mask functions, chunked or block-bidirectional masks, bidirectional sliding windows),
caches whose keys do not end at the current token (StaticCache), and non-causal windows.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

import fa4

__all__ = ["NAME", "register", "fa4_attention_forward", "fa4_mask"]

NAME = "fa4"

# The fa4 keywords register() sets for every call (backend "auto": the kernel for the GPU, the
# reference on CPU with fa4's one-time warning).
_settings = {"backend": "auto", "deterministic": False}

# The mask functions of transformers.masking_utils whose patterns the attention function
# reproduces: causality (is_causal), the causal sliding window (sliding_window), padding (the
# 2D mask) and packed sequences (position_ids). Any other part of a mask raises.
_EXPRESSIBLE_MASK_PARTS = frozenset(
    {
        "causal_mask_function",
        "bidirectional_mask_function",
        "and_masks.<locals>.and_mask",
        "sliding_window_overlay.<locals>.inner_mask",
        "padding_mask_function.<locals>.inner_mask",
        "packed_sequence_mask_function.<locals>.inner_mask",
        "remap_positions_for_packed_sequence.<locals>.inner_mask",
    }
)


def _unsupported(what: str, why: str):
    raise NotImplementedError(f"fa4 attention for transformers: {what} is not supported: {why}")


def _mask_parts(fn):
    """fn and the mask functions it combines (closures of and_masks, remap_..., etc.)."""
    yield fn
    for cell in getattr(fn, "__closure__", None) or ():
        value = cell.cell_contents
        for inner in value if isinstance(value, tuple) else (value,):
            if callable(inner) and hasattr(inner, "__qualname__"):
                yield from _mask_parts(inner)


def _check_mask_function(mask_function) -> None:
    for part in _mask_parts(mask_function):
        expressible = part.__module__ == "transformers.masking_utils" and (
            part.__qualname__ in _EXPRESSIBLE_MASK_PARTS
        )
        if not expressible:
            _unsupported(
                f"the mask part {part.__module__}.{part.__qualname__}",
                "fa4 takes causal, causal sliding-window, padding and packed-sequence masks "
                "only (use attn_implementation='sdpa' for this model)",
            )


def fa4_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset=0,
    kv_offset: int = 0,
    mask_function=None,
    attention_mask: torch.Tensor | None = None,
    **kwargs,
) -> torch.Tensor | None:
    """The mask each layer receives: None, or the 2D boolean key mask (batch, kv_length).

    Checks that the pattern is one the attention function reproduces (causality and windows
    come from the layer, packing from position_ids) and that the keys end at the current
    query, as fa4's bottom-right aligned masks assume.
    """
    if mask_function is not None:
        _check_mask_function(mask_function)
    if int(q_offset) + q_length != kv_offset + kv_length:
        _unsupported(
            f"keys [{kv_offset}, {kv_offset + kv_length}) for queries "
            f"[{int(q_offset)}, {int(q_offset) + q_length})",
            "the keys must end at the last query (a static cache or a prefix has keys past or "
            "before them that only a dense mask can exclude; use a DynamicCache)",
        )
    if attention_mask is None:
        return None
    # The 2D mask covers every token seen so far; a sliding-window cache keeps the last ones.
    attention_mask = attention_mask[:, -kv_length:].to(torch.bool)
    if attention_mask.shape[1] == kv_length and bool(attention_mask.all()):
        return None  # no padding: the dense path (one sync per forward, not per layer)
    return attention_mask


def _window(sliding_window, causal: bool) -> tuple[int, int]:
    if sliding_window is None or sliding_window <= 0:
        return (-1, -1)
    if not causal:
        _unsupported(
            f"sliding_window={sliding_window} without causality",
            "Transformers' bidirectional window masks and its flash-attention window differ by "
            "one token, so there is no single meaning to match",
        )
    return (int(sliding_window) - 1, 0)


def _starts_from_positions(position_ids: torch.Tensor, batch: int, length: int):
    """Boolean (batch, length): where a packed sequence starts (position t is not position
    t - 1 plus one, as Transformers' packed-sequence masks read it), or None when each row is
    one sequence."""
    if position_ids is None or position_ids.dim() != 2 or position_ids.shape[-1] != length:
        return None  # e.g. 3D rope positions (multimodal models): rows are not split
    if length < 2:
        return None
    position_ids = position_ids.expand(batch, -1)
    breaks = position_ids[:, 1:] - position_ids[:, :-1] != 1
    if not bool(breaks.any()):
        return None
    first = torch.ones(batch, 1, dtype=torch.bool, device=position_ids.device)
    return torch.cat([first, breaks], dim=1)


def _cu_seqlens_from_starts(starts: torch.Tensor):
    """cu_seqlens int32 (n + 1,) and the longest length, for sequences laid end to end."""
    flat = starts.reshape(-1)
    begin = flat.nonzero().view(-1).to(torch.int32)
    end = torch.tensor([flat.numel()], dtype=torch.int32, device=flat.device)
    cu = torch.cat([begin, end])
    return cu, int((cu[1:] - cu[:-1]).max())


def _cu_seqlens_from_mask(mask: torch.Tensor):
    lengths = mask.sum(dim=1, dtype=torch.int32)
    cu = torch.nn.functional.pad(torch.cumsum(lengths, 0, dtype=torch.int32), (1, 0))
    return cu, int(lengths.max()) if lengths.numel() else 0


def _varlen(q, k, v, cu_q, cu_k, max_q, max_k, opts):
    return fa4.attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, **opts)


def _padded(q, k, v, key_mask, opts):
    """q (b, s_q, h, d), k/v (b, s_k, h_kv, ·), key_mask (b, s_k): the real tokens packed.

    The queries are the last s_q positions of the mask; the keys end at the last query, so
    fa4's bottom-right alignment puts each real query on its own key."""
    b, s_q = q.shape[:2]
    query_mask = key_mask[:, -s_q:]
    k_rows = key_mask.reshape(-1).nonzero().view(-1)
    q_rows = query_mask.reshape(-1).nonzero().view(-1)
    cu_k, max_k = _cu_seqlens_from_mask(key_mask)
    cu_q, max_q = _cu_seqlens_from_mask(query_mask)
    k, v = (x.reshape(-1, *x.shape[2:]).index_select(0, k_rows) for x in (k, v))
    q_packed = q.reshape(-1, *q.shape[2:]).index_select(0, q_rows)
    out = _varlen(q_packed, k, v, cu_q, cu_k, max_q, max_k, opts)
    full = out.new_zeros(b * s_q, *out.shape[1:])  # padded query rows: zeros
    return full.index_copy(0, q_rows, out).view(b, s_q, *out.shape[1:])


def _flattened(q, k, v, cu_q, cu_k, max_q, max_k, opts):
    """Sequences laid end to end over the batch (padding-free): varlen, then the batch shape."""
    b, s_q = q.shape[:2]
    q, k, v = (x.reshape(-1, *x.shape[2:]) for x in (q, k, v))
    out = _varlen(q, k, v, cu_q, cu_k, max_q, max_k, opts)
    return out.view(b, s_q, *out.shape[1:])


def _check_call(dropout, attention_mask, kwargs) -> None:
    if dropout:
        _unsupported(f"dropout={dropout}", "fa4 has no dropout (set attention_dropout=0)")
    if kwargs.get("output_attentions"):
        _unsupported("output_attentions=True", "fa4 never forms the attention probabilities")
    if kwargs.get("position_bias") is not None:
        _unsupported("position_bias", "fa4 adds no bias to the scores")
    if attention_mask is not None and attention_mask.dim() != 2:
        _unsupported(
            f"a {attention_mask.dim()}D attention mask",
            "fa4 takes the 2D padding mask its own mask function makes; build the model with "
            "attn_implementation='fa4' after importing fa4.integrations.transformers",
        )


def fa4_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    is_causal: bool | None = None,
    s_aux: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    cu_seq_lens_q: torch.Tensor | None = None,
    cu_seq_lens_k: torch.Tensor | None = None,
    max_length_q: int | None = None,
    max_length_k: int | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Transformers' attention-function signature; returns (out (b, s_q, h, d_v), None)."""
    _check_call(dropout, attention_mask, kwargs)
    causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
    opts = dict(
        causal=causal,
        softmax_scale=None if scaling is None else float(scaling),
        window_size=_window(sliding_window, causal),
        softcap=float(softcap) if softcap else 0.0,
        learnable_sink=None if s_aux is None else s_aux.to(torch.float32),
        **_settings,
    )
    q, k, v = (x.transpose(1, 2) for x in (query, key, value))  # (b, s, h, d) views
    varlen = dict(cu_q=cu_seq_lens_q, cu_k=cu_seq_lens_k, max_q=max_length_q, max_k=max_length_k)
    return _dispatch(q, k, v, attention_mask, position_ids, varlen, opts), None


def _dispatch(q, k, v, attention_mask, position_ids, varlen, opts):
    """The padded, the flattened (given cu_seqlens or packed position_ids) or the dense path."""
    if attention_mask is not None:
        if attention_mask.shape[-1] != k.shape[1]:
            raise ValueError(
                f"fa4 attention for transformers: the 2D mask covers {attention_mask.shape[-1]} "
                f"keys, the layer has {k.shape[1]}"
            )
        return _padded(q, k, v, attention_mask.to(torch.bool), opts)
    if varlen["cu_q"] is not None and varlen["cu_k"] is not None:
        cu_q, cu_k = (varlen[n].to(torch.int32) for n in ("cu_q", "cu_k"))
        max_q, max_k = (
            int((cu[1:] - cu[:-1]).max()) if m is None else int(m)
            for cu, m in ((cu_q, varlen["max_q"]), (cu_k, varlen["max_k"]))
        )
        return _flattened(q, k, v, cu_q, cu_k, max_q, max_k, opts)
    if q.shape[1] == k.shape[1]:  # no past keys: position_ids may split rows into sequences
        starts = _starts_from_positions(position_ids, q.shape[0], q.shape[1])
        if starts is not None:
            cu, longest = _cu_seqlens_from_starts(starts)
            return _flattened(q, k, v, cu, cu, longest, longest, opts)
    return fa4.attention(q, k, v, **opts)


def register(*, backend: str = "auto", deterministic: bool = False) -> None:
    """Registers "fa4" with Transformers (again: harmless) and sets the fa4 backend and
    deterministic mode of every later call. Importing this module has already called
    register() with the defaults."""
    _settings.update(backend=backend, deterministic=bool(deterministic))
    AttentionInterface.register(NAME, fa4_attention_forward)
    AttentionMaskInterface.register(NAME, fa4_mask)


register()

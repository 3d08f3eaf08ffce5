"""Adapters that plug fa4 into other libraries. Each submodule imports its library itself, so
importing fa4 (or this package) imports none of them.

- fa4.integrations.transformers: `attn_implementation="fa4"` for Hugging Face Transformers
  (docs/integrations.md).
"""

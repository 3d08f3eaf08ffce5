"""Markers gpu / sm100 skip (with the reason) where the hardware is missing; DESIGN.md §5."""

import pytest
import torch


def _skip_reason(item) -> str | None:
    if "gpu" in item.keywords or "sm100" in item.keywords:
        if not torch.cuda.is_available():
            return "needs a CUDA device (none here)"
    if "sm100" in item.keywords:
        major, minor = torch.cuda.get_device_capability()
        if major != 10:
            return f"needs a CC 10.x (Blackwell) device; this one is {major}.{minor}"
    return None


def pytest_collection_modifyitems(config, items):
    for item in items:
        reason = _skip_reason(item)
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))

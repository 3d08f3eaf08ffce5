"""Markers gpu / sm100 skip (with the reason) where the hardware is missing; DESIGN.md §5. The
SASS tests' compiles start in the background at the first test (sass_helpers.compile_ahead)."""

import sys

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


@pytest.fixture(scope="session", autouse=True)
def _sass_compiles_in_background(request, tmp_path_factory):
    """The kernels the selected SASS tests read compile while the tests before them run (each is
    10-20 s of nvcc); sass_helpers is imported only where a SASS test module was collected."""
    helpers = sys.modules.get("sass_helpers")
    if helpers is not None:
        modules = {getattr(item.module, "__name__", None) for item in request.session.items}
        helpers.compile_in_background(tmp_path_factory, modules)
    yield
    if helpers is not None:
        helpers.stop_background()

"""What the installed build compiled, read from fa4/_build_config.py (written by setup.py).

Without that file (a source checkout that was never built) nothing was compiled.
"""

from __future__ import annotations

from . import manifest

try:
    from . import _build_config as _cfg

    CONFIG: dict = dict(_cfg.CONFIG)
except ImportError:
    CONFIG = {"built": False, "reason": "fa4 was not built (no fa4/_build_config.py)"}

if CONFIG.get("built"):
    try:
        from . import _C  # noqa: F401  (registers torch.ops.fa4._fwd_kernel / _bwd_kernel)
    except ImportError as e:
        CONFIG.update(built=False, reason=f"fa4._C was built but failed to import: {e}")

# kernels: {"fwd": {"sm90": [[64, 64], ...]}, "bwd": {...}}: the (d, d_v) pairs compiled per arch.
KERNELS: dict = CONFIG.get("kernels", {})


def _instances() -> list[manifest.Instance]:
    """The instances this build compiled: CONFIG["instances"] where setup.py records them (names
    as `python fa4/manifest.py list` prints them), else those the manifest gives for the build's
    archs, head dims and bwd flag (what setup.py compiled from the same manifest)."""
    if not CONFIG.get("built"):
        return []
    names = CONFIG.get("instances")
    try:
        insts = manifest.instances(
            CONFIG.get("archs"), CONFIG.get("hdims"), CONFIG.get("bwd", True)
        )
    except ValueError:  # a manifest that no longer knows the build's archs or head dims
        return []
    return insts if names is None else [i for i in insts if i.filename[: -len(".cu")] in names]


# Every compiled instance, with its dtype (KERNELS has only the head dims).
INSTANCES: list[manifest.Instance] = _instances()


def instance_dims(arch: str, direction: str, dtype: str) -> list[tuple[int, int]]:
    """The (d, d_v) pairs of the compiled instances of (arch, direction, dtype), sorted."""
    return sorted(
        {i.dims for i in INSTANCES if (i.family, i.direction, i.dtype) == (arch, direction, dtype)}
    )


def missing_instance(arch: str, direction: str, hdims: tuple[int, int], dtype: str) -> str | None:
    """None when an instance of (arch, direction, dtype) covering hdims is compiled in (dtype a
    kernels.json "dtypes" key, e.g. "e4m3"; Note [padded head dims]: the C++ dispatch picks the
    covering instance of the problem's dtype), else the reason."""
    if not CONFIG.get("built"):
        return f"the CUDA extension was not built: {CONFIG.get('reason')}"
    have = instance_dims(arch, direction, dtype)
    if not have:
        return f"this build has no {arch} {direction} kernels of dtype {dtype}"
    if manifest.cover(have, *hdims) is None:
        return (
            f"head dims {tuple(hdims)}: no {dtype} {arch} {direction} kernel covers them "
            f"(it has {sorted(have)})"
        )
    return None


def missing_kernel(arch: str, direction: str, hdims: tuple[int, int]) -> str | None:
    """None when a kernel for (arch, direction, hdims) is compiled in, else the reason."""
    if not CONFIG.get("built"):
        return f"the CUDA extension was not built: {CONFIG.get('reason')}"
    compiled = KERNELS.get(direction, {}).get(arch)
    if not compiled:
        return f"this build has no {arch} {direction} kernels"
    if manifest.cover(compiled, *hdims) is None:
        return f"head dims {hdims}: no {arch} {direction} kernel covers them (FA4_HDIMS)"
    return None


def summary() -> str:
    from . import __version__

    if not CONFIG.get("built"):
        reason = CONFIG.get("reason")
        return f"fa4 {__version__}: CUDA kernels not built ({reason}); CPU reference only"
    lines = [f"fa4 {__version__}: CUDA extension built for archs {CONFIG.get('archs')}"]
    for direction in ("fwd", "bwd"):
        per_arch = KERNELS.get(direction, {})
        listed = ", ".join(f"{a}: {v}" for a, v in per_arch.items() if v) or "none yet"
        lines.append(f"  {direction} kernels: {listed}")
    return "\n".join(lines)

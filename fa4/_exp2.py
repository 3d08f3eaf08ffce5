"""Software exp2 of the kernels (csrc/exp2_poly.cuh) in torch, bit for bit, for CPU models.

Same steps as the C++: clamp to [-127, 128], j = floor, f = x - j, Horner with fmaf (emulated
exactly, see _fma_f32), j added to the exponent bits; x < -126 -> +0, NaN -> the input NaN.
docs/numerics.md, "Software exp2", has the error table and the special values.
"""

from __future__ import annotations

import torch

from ._exp2_coeffs import COEFFS

__all__ = ["exp2_poly", "COEFFS"]


def _fma_f32(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | float) -> torch.Tensor:
    """fmaf(a, b, c) for float32 a, b and fp32-valued c, correctly rounded like FFMA.

    a*b is exact in float64. The float64 sum is made round-to-odd (TwoSum gives its exact
    error; if it is nonzero and the last bit is even, step one ulp towards the exact sum); that
    rounds to fp32 exactly like the exact a*b + c. A plain float64 sum can double-round.
    """
    prod = a.double() * b.double()
    s = prod + c
    bb = s - prod
    err = (prod - (s - bb)) + (c - bb)
    bits = s.view(torch.int64)
    step = torch.where((err > 0) == (s > 0), 1, -1)
    fix = (err != 0) & ((bits & 1) == 0)
    return (bits + torch.where(fix, step, 0)).view(torch.float64).float()


def exp2_poly(x: torch.Tensor, degree: int) -> torch.Tensor:
    """2^x of a float32 tensor with the degree-`degree` polynomial (2..5), as the kernels do."""
    if degree not in COEFFS:
        raise ValueError(f"exp2_poly: degree must be one of {sorted(COEFFS)}, got {degree}")
    if x.dtype != torch.float32:
        raise TypeError(f"exp2_poly: x must be float32, got {x.dtype}")
    coeffs = COEFFS[degree]
    # fminf(fmaxf(x, -127), 128): fmaxf drops a NaN (-> -127); torch.clamp would keep it.
    xc = torch.where(torch.isnan(x), -127.0, x.clamp(-127.0, 128.0))
    j = torch.floor(xc)
    f = xc - j  # float32 subtraction, rounded like the C++ (inexact only for x in (-1, 0))
    p = torch.full_like(f, coeffs[-1])
    for ck in coeffs[-2::-1]:
        p = _fma_f32(p, f, ck)
    # bits(p) + (j << 23): done in int64, where it cannot wrap; the sum is in [0, 0x7F800000]
    # (p in [1, 2), j in [-127, 128], p = 1 when j = 128), so it fits int32 as it is.
    bits = p.view(torch.int32).long() + (j.long() << 23)
    r = bits.int().view(torch.float32)
    r = torch.where(x < -126.0, 0.0, r)
    return torch.where(torch.isnan(x), x, r)

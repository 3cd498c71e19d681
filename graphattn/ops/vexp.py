"""``exp`` for the numba kernels: in float32 a branch-free polynomial LLVM vectorises (:mod:`graphattn.ops.fused`).

``math.exp`` in a numba loop is a call to the C library's ``expf`` per
element, which no loop around it can vectorise; in the fused forward it took
about 30 % of the time at 8 channels per head. In float32, :func:`exp` is
Cephes' ``expf`` written out (``x = m ln 2 + r``, ``|r| <= ln 2 / 2``, a
degree-7 polynomial for ``exp(r)``, times ``2 ** m`` built from its bits):
within 1 ulp of the exact value on [-87.3, 88.7] (measured against float64,
``tests/test_fused.py``), ``0`` below ``-87.3365`` (where ``expf`` would give
a subnormal, under 1.2e-38: a softmax weight below float32's resolution of
the sum, which is at least 1), ``exp(-inf) = 0`` and NaN stays NaN. Compiled
without ``reassoc``: the two-constant reduction ``x - m C1 - m C2`` must not be
refolded. In float64, ``math.exp``.

Imported by :func:`graphattn.ops.fused._build` with numba, never by ``import graphattn``.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic, overload

__all__ = ["exp"]

F = np.float32


@intrinsic
def _floor(typingctx, x):
    """``floor(x)`` as LLVM's ``llvm.floor`` (vectorisable; ``math.floor`` calls ``floorf`` and returns an int)."""
    if isinstance(x, types.Float):

        def codegen(context, builder, signature, args):
            fn = builder.module.declare_intrinsic("llvm.floor", [args[0].type])
            return builder.call(fn, [args[0]])

        return x(x), codegen
    return None


@intrinsic
def _pow2(typingctx, m):
    """``2.0 ** m`` in float32 for an int32 ``m`` in [-126, 128] (its bits ``(m + 127) << 23``; 128 gives inf)."""
    if isinstance(m, types.Integer) and m.bitwidth == 32:

        def codegen(context, builder, signature, args):
            i32 = ir.IntType(32)
            bits = builder.shl(builder.add(args[0], ir.Constant(i32, 127)), ir.Constant(i32, 23))
            return builder.bitcast(bits, ir.FloatType())

        return types.float32(m), codegen
    return None


def exp(x):  # pragma: no cover (the numba kernels call the overload below)
    """``e ** x`` (in numba: float32 vectorisable, float64 ``math.exp``)."""
    return math.exp(x)


@overload(exp, jit_options={"fastmath": {"contract"}})
def _exp(x):
    if isinstance(x, types.Float) and x.bitwidth == 32:

        def exp32(x):  # pragma: no cover (compiled)
            m = _floor(x * F(1.44269504088896341) + F(0.5))  # x = m ln 2 + r
            r = x - m * F(0.693359375)
            r = r - m * F(-2.12194440e-4)
            p = F(1.9875691500e-4)
            p = p * r + F(1.3981999507e-3)
            p = p * r + F(8.3334519073e-3)
            p = p * r + F(4.1665795894e-2)
            p = p * r + F(1.6666665459e-1)
            p = p * r + F(5.0000001201e-1)
            p = p * r * r + r + F(1.0)  # exp(r)
            y = p * _pow2(np.int32(min(max(m, F(-126.0)), F(128.0))))
            return F(0.0) if x < F(-87.33654) else y

        return exp32
    return lambda x: math.exp(x)

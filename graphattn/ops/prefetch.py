"""A software prefetch of one row of an array, for the numba kernels (:mod:`graphattn.ops.fused`).

The kernels read and update the rows of the keys and values of random
sources, edge after edge. A row that is not in the cache stalls the loop for
the memory latency, and the hardware prefetchers cannot guess the next random
row; the work on one edge is too long for the out-of-order core to reach the
next edge's loads on its own. ``prefetch_row(a, j)`` asks for every 64-byte
line of ``a[j]`` (LLVM's ``llvm.prefetch``: a hint, never a fault, no result),
a few edges ahead of its use: 15-45 % off the kernels' time on the benchmark
graphs (``benchmarks/train.py``).

Imported by :func:`graphattn.ops.fused._build` with numba, never by ``import graphattn``.
"""

from __future__ import annotations

import numba
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["prefetch_row", "prefetch_row_write", "prefetch_edge", "prefetch_edge_update", "DISTANCE"]

DISTANCE = 8  # edges ahead: the rows of edge e + DISTANCE are asked for while edge e is worked on
LINE = 64  # bytes per cache line


def _codegen(write: int):
    def codegen(context, builder, signature, args):
        aryty, rowty = signature.args
        ary = context.make_array(aryty)(context, builder, args[0])
        zero = context.get_constant(types.intp, 0)
        row = context.cast(builder, args[1], rowty, types.intp)
        first = cgutils.get_item_pointer(
            context, builder, aryty, ary, [row] + [zero] * (aryty.ndim - 1), wraparound=False
        )
        i8p = ir.IntType(8).as_pointer()
        base = builder.bitcast(first, i8p)
        nbytes = cgutils.unpack_tuple(builder, ary.strides, aryty.ndim)[0]  # a C-contiguous row: its stride
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0i8")
        with cgutils.for_range_slice(builder, zero, nbytes, context.get_constant(types.intp, LINE)) as (offset, _):
            # (address, 0 read / 1 write, locality 3: keep in every cache level, 1: data cache)
            builder.call(fn, [builder.gep(base, [offset]), i32(write), i32(3), i32(1)])
        return context.get_dummy_value()

    return codegen


@intrinsic
def prefetch_row(typingctx, array, row):
    """Prefetch ``array[row]`` (a C-contiguous array, ``row`` an integer) for reading."""
    if isinstance(array, types.Array) and array.layout == "C" and isinstance(row, types.Integer):
        return types.void(array, row), _codegen(0)
    return None


@intrinsic
def prefetch_row_write(typingctx, array, row):
    """Prefetch ``array[row]`` (a C-contiguous array, ``row`` an integer) for writing."""
    if isinstance(array, types.Array) and array.layout == "C" and isinstance(row, types.Integer):
        return types.void(array, row), _codegen(1)
    return None


@numba.njit(inline="always")
def prefetch_edge(e, src, dst, x_src, x_dst):  # pragma: no cover (inlined into the kernels)
    """For edge ``e`` of ``(src, dst)``: the rows edge ``e + DISTANCE`` reads, ``x_src[j]`` and ``x_dst[i]``,
    asked for now (the per-edge kernels of GATv2's scores).
    """
    if e + DISTANCE < src.shape[0]:
        prefetch_row(x_src, src[e + DISTANCE])
        prefetch_row(x_dst, dst[e + DISTANCE])


@numba.njit(inline="always")
def prefetch_edge_update(e, src, dst, x_src, x_dst, dx_src, dx_dst):  # pragma: no cover (inlined)
    """:func:`prefetch_edge`, and the rows that edge updates, ``dx_src[j]`` and ``dx_dst[i]`` (the backward)."""
    prefetch_edge(e, src, dst, x_src, x_dst)
    if e + DISTANCE < src.shape[0]:
        prefetch_row_write(dx_src, src[e + DISTANCE])
        prefetch_row_write(dx_dst, dst[e + DISTANCE])

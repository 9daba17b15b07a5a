"""LLVM intrinsics for numba kernels: raw data pointers, prefetch, unaligned 8-byte loads, trailing zeros, a
32-byte vector compare; and cache-line aligned arrays for per-feature records."""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba.core import cgutils, types as nbt
from numba.extending import intrinsic


CACHE_LINE = 64


def zeros_aligned(shape, dtype, align: int = CACHE_LINE) -> np.ndarray:
    """A zeroed C-contiguous array whose data starts on an ``align``-byte boundary.

    Large NumPy arrays start 16 bytes past a page (the allocator's header), so with 32-byte records every odd
    record straddles two cache lines: its second half is a second miss that the kernel's prefetch (of the
    record's first byte) does not cover. STSGD's kernel at webspam width ran at about half its speed that way."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.zeros(nbytes + align, dtype=np.uint8)
    off = -raw.ctypes.data % align
    return raw[off:off + nbytes].view(dtype).reshape(shape)


@intrinsic
def base(typingctx, arr):
    """Data pointer of a C-contiguous array (element [0, ..., 0]; a 2-D array's row j starts at j·ncols): a
    scalar, so inlined helpers take it without refcounts, and its indexing has no negative-index wraparound."""
    if not (isinstance(arr, nbt.Array) and arr.layout == "C"):
        return None

    def codegen(context, builder, sig, args):
        return context.make_array(sig.args[0])(context, builder, args[0]).data

    return nbt.CPointer(arr.dtype)(arr), codegen


@intrinsic
def prefetch(typingctx, p, i):
    """Hint the cache line of p[i] into the cache (no fault on a bad address)."""
    if not (isinstance(p, nbt.CPointer) and isinstance(i, nbt.Integer)):
        return None

    def codegen(context, builder, sig, args):
        k = context.cast(builder, args[1], sig.args[1], nbt.intp)
        ptr = builder.bitcast(builder.gep(args[0], [k]), ir.IntType(8).as_pointer())
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer(), i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0i8")
        builder.call(fn, [ptr, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return nbt.void(p, i), codegen


@intrinsic
def load_u64(typingctx, p, i):
    """The 8 bytes p[i:i+8] as one little-endian uint64 (unaligned load; the caller keeps it in bounds)."""
    if not (isinstance(p, nbt.CPointer) and p.dtype == nbt.uint8 and isinstance(i, nbt.Integer)):
        return None

    def codegen(context, builder, sig, args):
        k = context.cast(builder, args[1], sig.args[1], nbt.intp)
        ptr = builder.bitcast(builder.gep(args[0], [k]), ir.IntType(64).as_pointer())
        return builder.load(ptr, align=1)

    return nbt.uint64(p, i), codegen


@intrinsic
def cttz(typingctx, x):
    """Number of trailing zero bits of a uint64 (64 for 0)."""
    if x != nbt.uint64:
        return None

    def codegen(context, builder, sig, args):
        return builder.cttz(args[0], ir.Constant(ir.IntType(1), 0))

    return nbt.uint64(x), codegen


@intrinsic
def below_mask32(typingctx, p, i, c):
    """Bit k (k < 32) set iff byte p[i + k] < c (unsigned): one 32-byte vector compare (the caller keeps
    p[i:i+32] in bounds)."""
    if not (isinstance(p, nbt.CPointer) and p.dtype == nbt.uint8 and isinstance(i, nbt.Integer)
            and isinstance(c, nbt.Integer)):
        return None

    def codegen(context, builder, sig, args):
        k = context.cast(builder, args[1], sig.args[1], nbt.intp)
        vec = ir.VectorType(ir.IntType(8), 32)
        ptr = builder.bitcast(builder.gep(args[0], [k]), vec.as_pointer())
        v = builder.load(ptr, align=1)
        b = builder.trunc(context.cast(builder, args[2], sig.args[2], nbt.int64), ir.IntType(8))
        splat = builder.insert_element(ir.Constant(vec, ir.Undefined), b, ir.Constant(ir.IntType(32), 0))
        splat = builder.shuffle_vector(splat, ir.Constant(vec, ir.Undefined),
                                       ir.Constant(ir.VectorType(ir.IntType(32), 32), [0] * 32))
        bits = builder.bitcast(builder.icmp_unsigned("<", v, splat), ir.IntType(32))
        return builder.zext(bits, ir.IntType(64))

    return nbt.uint64(p, i, c), codegen

"""The elementwise kernel: every entry of the elementwise table (tritonad/elementwise.py) and
its derivatives, plus fills, strided copies and casts, arange, clamp by numbers and pow.

Every op is one launch of `_elementwise_kernel`. A table entry's formula is compiled in as the
constexpr FN (its vocabulary bound to kernels/tlmath.py), taking up to four operands; the other
ops are named by OP. The launcher broadcasts the operands' strides to the output's shape (stride
0 on broadcast dimensions: a broadcast row is read in place, never copied), drops size-1
dimensions and merges neighbouring dimensions that are contiguous for every operand. What remains
is either one contiguous run (the lean 1-d fast path: large blocks, vectorised 16-byte accesses)
or at most MAX_RANK strided dimensions, which the kernel walks by splitting the flat output index
into coordinates. Python numbers are kernel arguments, never arrays.

Memory traffic: one read of each array operand and one write of the result, the floor for an
elementwise op; a derivative reads only what its formula names (dy and x, or dy and y).
Values are computed in `COMPUTE`: float32 for float16/bfloat16/float32, float64 for float64, the
integer type itself for integers (int32 for bool and uint8), and rounded once on the store.
"""
from __future__ import annotations

import itertools
import math
import struct
import types

import numpy as np
import torch
import triton
import triton.language as tl

from .. import dtypes
from .. import elementwise as table
from . import tlmath
from .launch import INTERPRET, PDL, KernelLaunch, cdiv, dtype_of, next_power_of_2
from .plans import PlanCache, empty
from .plans import OperandPlan, array_key

MAX_RANK = 4                 # strided dimensions the kernel walks after collapsing
CONTIGUOUS_BLOCK, CONTIGUOUS_WARPS = 4096, 8
STRIDED_BLOCK, STRIDED_WARPS = 1024, 4
INTERPRET_BLOCK = 1 << 16    # the interpreter pays per program: few, large ones
INT32_LIMIT = 2**31 - 2**17  # offsets at or past this are computed in int64 (margin for a block)

_abs = abs  # this module defines its own abs and pow (the primitives)

# how an operand reaches the kernel
TENSOR, INT, FLOAT, ABSENT = 0, 1, 2, 3


# ----------------------------------------------------------------------------------- kernels


@triton.jit
def _load_operand(ptr, value, offs, mask, KIND: tl.constexpr, COMPUTE: tl.constexpr):
    """An operand's values in COMPUTE: loaded, or a scalar argument (an int, or the bit pattern
    of a float64 so that no precision is lost on the way in). COMPUTE int1 means "as a bool"."""
    if KIND == 0:
        v = tl.load(ptr + offs, mask=mask, other=0)
    elif KIND == 2:
        v = value.to(tl.int64).to(tl.float64, bitcast=True)
    else:  # an int, or 0 for an absent operand
        v = value.to(tl.int64)
    if COMPUTE == tl.int1:
        v = v != 0
    else:
        v = v.to(COMPUTE)
    return v


@triton.jit
def cast_for_store(v, ptr):
    """v cast to the element type of ptr as tritonad casts: nonzero -> True, float -> int
    truncates towards zero (NaN -> 0); bfloat16 rounds from float32 to nearest even."""
    dtype = ptr.dtype.element_ty
    if dtype == tl.int1:
        out = v != 0
    elif dtype.is_int() and v.dtype.is_floating():
        out = tl.where(v == v, v, 0).to(dtype)
    elif dtype == tl.bfloat16:
        out = _round_to_bfloat16(v.to(tl.float32))
    else:
        out = v.to(dtype)
    return out


@triton.jit
def _round_to_bfloat16(v):
    # float32 -> bfloat16 rounding to nearest even on the bit pattern: add 0x7FFF plus the lowest
    # kept bit, keep the top 16 bits (a carry rounds up into the exponent, up to inf); NaN stays
    # a quiet NaN. Bit-identical to the reference and to the hardware conversion, and right
    # under the interpreter too (whose own conversion truncates).
    bits = v.to(tl.uint32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    rounded = tl.where(v != v, 0x7FC0, rounded)
    return rounded.to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _pow_float(x, y):
    # |x|^y = 2^(y log2|x|), evaluated in float64 so that float32 results are correctly rounded
    # to within an ulp even when y log2|x| is large. C99's special cases on top (as numpy): a
    # negative base (-0.0 included) keeps the sign for odd integer exponents, gives NaN for
    # non-integer ones unless it is -inf or -0.0; x^0 = 1^y = 1, also for NaN; (-1)^+-inf = 1.
    xd = x.to(tl.float64)
    yd = y.to(tl.float64)
    ax = tl.abs(xd)
    r = tl.exp2(yd * tl.log2(ax))
    y_int = tl.floor(yd) == yd
    y_odd = y_int & ((yd - 2.0 * tl.floor(yd * 0.5)) == 1.0)
    negative_zero = (xd == 0) & ((1.0 / xd) < 0)
    negative = (xd < 0) | negative_zero
    no_real_root = (xd < 0) & (ax != float("inf"))
    r = tl.where(negative & y_odd, -r, r)
    r = tl.where(no_real_root & ~y_int, float("nan"), r)
    one = (yd == 0) | (xd == 1) | ((ax == 1) & (tl.abs(yd) == float("inf")))
    return tl.where(one, 1.0, r)


@triton.jit
def _pow_int(x, y):
    # square-and-multiply over every bit of the exponent: wraps on overflow as numpy does.
    # NOTE: a negative exponent gives 1/x^|y| truncated: 1, -1 or 0 (numpy refuses them).
    result = (x * 0 + 1) + y * 0
    base = x + y * 0
    e = y + x * 0
    for _ in tl.static_range(63):
        result = tl.where((e & 1) != 0, result * base, result)
        base = base * base
        e = e >> 1
    odd = (y & 1) != 0
    negative = tl.where(x == 1, 1, tl.where(x == -1, tl.where(odd, -1, 1), 0))
    return tl.where(y < 0, negative.to(result.dtype), result)


@triton.jit
def _apply(a, b, c, d, idx, OP: tl.constexpr, FN: tl.constexpr, ARITY: tl.constexpr,
           B_KIND: tl.constexpr, C_KIND: tl.constexpr):
    """The op on values already in their compute type: a formula of the elementwise table
    (FN, taking ARITY operands), or one of the few ops that are not in it (copies and fills,
    arange, clamp by numbers, pow)."""
    if ARITY == 1:
        r = FN(a)
    elif ARITY == 2:
        r = FN(a, b)
    elif ARITY == 3:
        r = FN(a, b, c)
    elif ARITY == 4:
        r = FN(a, b, c, d)
    else:
        # one shape for both operands (a number is a scalar): the interpreter cannot combine a
        # scalar mask with a block mask
        a, b = tl.broadcast(a, b)
        if OP == "copy":
            r = a
        elif OP == "square":
            r = a * a
        elif OP == "clamp":
            # bounds arrive already converted to x's dtype, then to the compute type
            r = a
            if B_KIND != 3:
                r = tl.where(r < b, b, r)
            if C_KIND != 3:
                r = tl.where(r > c, c, r)
        elif OP == "pow":
            if a.dtype.is_floating():
                r = _pow_float(a, b).to(a.dtype)
            else:
                r = _pow_int(a, b)
        elif OP == "arange":
            r = a + idx.to(b.dtype) * b
        else:
            tl.static_assert(False, "unknown elementwise op")
    return r


# NOTE: the scalar operands (ints, or float64 bit patterns) are typed tl.int64 and not
# specialized: every call of a signature runs one compiled kernel, whatever the numbers
@triton.jit(do_not_specialize=["a_value", "b_value", "c_value", "d_value"])
def _elementwise_kernel(out_ptr, a_ptr, b_ptr, c_ptr, d_ptr, a_value: tl.int64,
                        b_value: tl.int64, c_value: tl.int64, d_value: tl.int64,
                        n, size1, size2, size3,
                        stride_o0, stride_o1, stride_o2, stride_o3,
                        stride_a0, stride_a1, stride_a2, stride_a3,
                        stride_b0, stride_b1, stride_b2, stride_b3,
                        stride_c0, stride_c1, stride_c2, stride_c3,
                        stride_d0, stride_d1, stride_d2, stride_d3,
                        OP: tl.constexpr, FN: tl.constexpr, ARITY: tl.constexpr,
                        COND: tl.constexpr, A_KIND: tl.constexpr, B_KIND: tl.constexpr,
                        C_KIND: tl.constexpr, D_KIND: tl.constexpr, COMPUTE: tl.constexpr,
                        CONTIGUOUS: tl.constexpr, INT64: tl.constexpr, BLOCK: tl.constexpr,
                        GDC: tl.constexpr):
    if GDC:  # programmatic dependent launch (launch.PDL): wait for the kernels before
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    # One program: BLOCK consecutive elements of the output in C order. Strided: the flat index
    # splits into coordinates (i0, i1, i2, i3) of the collapsed shape, and each operand's offset
    # is sum(i_k * stride_k) (stride 0 on broadcast dimensions).
    pid = tl.program_id(0)
    if INT64:
        pid = pid.to(tl.int64)
    idx = pid * BLOCK + tl.arange(0, BLOCK)
    mask = idx < n
    if CONTIGUOUS:
        off_o = idx
        off_a = idx
        off_b = idx
        off_c = idx
        off_d = idx
    else:
        i3 = idx % size3
        rest = idx // size3
        i2 = rest % size2
        rest = rest // size2
        i1 = rest % size1
        i0 = rest // size1
        off_o = i0 * stride_o0 + i1 * stride_o1 + i2 * stride_o2 + i3 * stride_o3
        off_a = i0 * stride_a0 + i1 * stride_a1 + i2 * stride_a2 + i3 * stride_a3
        off_b = i0 * stride_b0 + i1 * stride_b1 + i2 * stride_b2 + i3 * stride_b3
        off_c = i0 * stride_c0 + i1 * stride_c1 + i2 * stride_c2 + i3 * stride_c3
        off_d = i0 * stride_d0 + i1 * stride_d1 + i2 * stride_d2 + i3 * stride_d3
    if COND:  # a bool condition (where): nonzero is True
        a = _load_operand(a_ptr, a_value, off_a, mask, A_KIND, tl.int1)
    else:
        a = _load_operand(a_ptr, a_value, off_a, mask, A_KIND, COMPUTE)
    b = _load_operand(b_ptr, b_value, off_b, mask, B_KIND, COMPUTE)
    c = _load_operand(c_ptr, c_value, off_c, mask, C_KIND, COMPUTE)
    d = _load_operand(d_ptr, d_value, off_d, mask, D_KIND, COMPUTE)
    if ARITY > 0:  # a formula sees blocks only: numbers are splatted (the interpreter cannot
        # combine a scalar with a block in every operation)
        a = tl.broadcast_to(a, [BLOCK])
        b = tl.broadcast_to(b, [BLOCK])
        c = tl.broadcast_to(c, [BLOCK])
        d = tl.broadcast_to(d, [BLOCK])
    r = _apply(a, b, c, d, idx, OP, FN, ARITY, B_KIND, C_KIND)
    r = tl.broadcast_to(cast_for_store(r, out_ptr), [BLOCK])  # scalars only: fill_, arange
    tl.store(out_ptr + off_o, r, mask=mask)


# ----------------------------------------------------------------------------------- planning

_TL = {"float64": tl.float64, "float32": tl.float32, "float16": tl.float16,
       "bfloat16": tl.bfloat16, "int64": tl.int64, "int32": tl.int32, "uint8": tl.uint8,
       "bool": tl.int1}


def compute_type(dtype):
    """The Triton type a result of `dtype` is computed in."""
    dtype = dtypes.get_dtype(dtype)
    if dtype.is_floating_point:
        return tl.float64 if dtype is dtypes.float64 else tl.float32
    return tl.int64 if dtype is dtypes.int64 else tl.int32


def tl_type(dtype):
    return _TL[dtypes.get_dtype(dtype).name]


def broadcast_shape(op, *operands):
    """numpy's broadcast of the operands' shapes (numbers are 0-d); a clear error otherwise."""
    shapes = [tuple(x.shape) for x in operands if isinstance(x, torch.Tensor)]
    rank = max((len(s) for s in shapes), default=0)
    out = [1] * rank
    for s in shapes:
        for i, size in enumerate(s, rank - len(s)):
            if size != 1 and out[i] not in (1, size):
                raise ValueError(f"{op}: shapes {' and '.join(str(x) for x in shapes)} do not "
                                 f"broadcast together")
            if size != 1:
                out[i] = size
    return tuple(out)


def broadcast_strides(x, shape):
    """x's strides seen as an array of `shape`: 0 where x is broadcast."""
    lead = len(shape) - x.dim()
    return [0 if i < lead or x.shape[i - lead] != size else x.stride(i - lead)
            for i, size in enumerate(shape)]


def collapse(shape, strides):
    """Drop size-1 dimensions and merge neighbours (outer, inner) that every operand walks as
    one: stride_outer == stride_inner * size_inner. Returns (sizes, [strides per operand])."""
    sizes, merged = [], [[] for _ in strides]
    for i, size in enumerate(shape):
        if size == 1:
            continue
        if sizes and all(m[-1] == st[i] * size for m, st in zip(merged, strides)):
            sizes[-1] *= size
            for m, st in zip(merged, strides):
                m[-1] = st[i]
        else:
            sizes.append(size)
            for m, st in zip(merged, strides):
                m.append(st[i])
    return sizes, merged


def needs_int64(numel, sizes, strides):
    """True when a flat index or an element offset of some operand can reach 2**31."""
    if numel >= INT32_LIMIT:
        return True
    return any(sum((n - 1) * _abs(s) for n, s in zip(sizes, st)) >= INT32_LIMIT for st in strides)


def _scalar_arg(value):
    """(kind, payload) for a Python number: ints as they are, floats as float64 bit patterns."""
    if isinstance(value, (bool, np.bool_, int, np.integer)):
        return INT, int(value)
    if isinstance(value, (float, np.floating)):
        return FLOAT, struct.unpack("<q", struct.pack("<d", float(value)))[0]
    raise TypeError(f"expected an array or a number, got {type(value).__name__}")


# ----------------------------------------------------------------------------------- plans
# A call's plan depends only on its signature: the op, each operand's dtype, shape, strides,
# device and pointer alignment (numbers: their kind and int width), and the output's. The first
# call of a signature checks the operands, broadcasts and collapses the strides, picks blocks
# and binds the launch (launch.KernelLaunch), kept as a plans.OperandPlan; later calls look it
# up (one dict lookup) and call it, which allocates the result and launches.

_PLANS = PlanCache()
_Tensor = torch.Tensor
_key = array_key  # what a plan depends on for one array operand (inline in the launchers)


def _operand(x):
    """(what a plan depends on, the kernel's scalar payload) for one operand: an array's dtype,
    shape, strides, device and pointer alignment; a number's kind (its value is the payload)."""
    if isinstance(x, _Tensor):
        return (x.dtype, x.shape, x.stride(), x.get_device(), x.data_ptr() % 16 == 0), 0
    if x is None:
        return None, 0
    return _scalar_arg(x)


def _planned(key, op, out, shape, dtype, device, operands, payloads, compute):
    """Run an elementwise call through its plan (made and cached on the signature's first call).

    out: the array to write or None (then a new contiguous one of shape/dtype on device)."""
    operands = list(operands) + [None] * (4 - len(operands))
    payloads = tuple(payloads) + (0,) * (4 - len(payloads))
    plan = _PLANS.get(key)
    if plan is not None:
        return plan(out, *operands[:3], *payloads[:3], operands[3], payloads[3])
    result = out if out is not None else empty(shape, dtype.torch, device)
    steps = _launch(op, result, operands, compute)
    if steps is not None:
        like = next((i for i, x in enumerate(operands[:2]) if isinstance(x, torch.Tensor)
                     and tuple(x.shape) == tuple(shape) and x.dtype == dtype.torch
                     and x.is_contiguous()), None)
        _PLANS.keep(key, OperandPlan(tuple(shape), dtype.torch, device,
                                     [isinstance(x, torch.Tensor) for x in operands], steps, like))
    return result


def _launch(op, out, operands, compute):
    """out[...] = op(*operands) elementwise; operands: 4 arrays, numbers or None. Returns the
    launches made as [(KernelLaunch, element offset)], or None when they cannot be replayed
    (a layout walked with one launch per outer coordinate)."""
    n = out.numel()
    if n == 0:
        return []
    shape = tuple(out.shape)
    kinds, values, arrays = [], [], []
    for x in operands:
        if isinstance(x, torch.Tensor):
            kinds.append(TENSOR)
            values.append(0)
            arrays.append(x)
        elif x is None:
            kinds.append(ABSENT)
            values.append(0)
            arrays.append(out)
        else:
            kind, payload = _scalar_arg(x)
            kinds.append(kind)
            values.append(payload)
            arrays.append(out)
    strides = [list(out.stride())] + [
        broadcast_strides(x, shape) if k == TENSOR else [0] * len(shape)
        for x, k in zip(arrays, kinds)]
    sizes, strides = collapse(shape, strides)
    if len(sizes) > MAX_RANK:
        _launch_outer_loop(op, out, arrays, kinds, values, sizes, strides, compute)
        return None
    return _launch_collapsed(op, out, arrays, kinds, values, sizes, strides, compute)


def _launch_collapsed(op, out, arrays, kinds, values, sizes, strides, compute, start=0):
    n = math.prod(sizes)
    live = [strides[0]] + [st for st, k in zip(strides[1:], kinds) if k == TENSOR]
    contiguous = len(sizes) <= 1 and all(st == [1] * len(sizes) for st in live)
    if contiguous and not INTERPRET and n % 16 and n > 16 and op != "arange":
        # NOTE: a length that is not a multiple of 16 hides where the mask changes, and the
        # compiler falls back to scalar accesses: run the first n - n % 16 elements (16-byte
        # vectors) and the short tail as two launches
        main = n - n % 16
        launches = []
        for begin, count in ((0, main), (main, n - main)):
            part = [x.as_strided((count,), (1,), x.storage_offset() + begin)
                    if k == TENSOR else x for x, k in zip([out] + arrays, [TENSOR] + kinds)]
            launches += _launch_collapsed(op, part[0], part[1:], kinds, values, [count],
                                          [[1] for _ in strides], compute, start=begin)
        return launches
    pad = MAX_RANK - len(sizes)
    sizes = [1] * pad + sizes
    strides = [[0] * pad + st for st in strides]
    if INTERPRET:
        block, warps = min(next_power_of_2(n), INTERPRET_BLOCK), 1
    elif contiguous:
        block, warps = CONTIGUOUS_BLOCK, CONTIGUOUS_WARPS
    else:
        block, warps = STRIDED_BLOCK, STRIDED_WARPS
    launch = KernelLaunch(
        _elementwise_kernel, (cdiv(n, block),),
        [out, *arrays, *values, n, *sizes[1:], *(s for st in strides for s in st)],
        dict(**_op_meta(op), A_KIND=kinds[0], B_KIND=kinds[1], C_KIND=kinds[2],
             D_KIND=kinds[3], COMPUTE=compute, CONTIGUOUS=contiguous,
             INT64=needs_int64(n, sizes, strides), BLOCK=block, num_warps=warps, **PDL),
        dynamic=range(9))
    return [(launch, start)]


def _launch_outer_loop(op, out, arrays, kinds, values, sizes, strides, compute):
    # more than MAX_RANK dimensions survive collapsing (rare: a high-rank, oddly strided view):
    # one launch per coordinate of the leading dimensions, on views of the same memory.
    lead = len(sizes) - MAX_RANK
    views = [out] + arrays
    for coord in itertools.product(*(range(s) for s in sizes[:lead])):
        sub = [v.as_strided(sizes[lead:], st[lead:],
                            v.storage_offset() + sum(i * s for i, s in zip(coord, st[:lead])))
               if k == TENSOR else v
               for v, st, k in zip(views, strides, [TENSOR] + kinds)]
        _launch_collapsed(op, sub[0], sub[1:], kinds, values, list(sizes[lead:]),
                          [st[lead:] for st in strides], compute)
    return out


# ----------------------------------------------------------------------------------- checks


def _check_operands(op, *operands):
    arrays = [x for x in operands if isinstance(x, torch.Tensor)]
    if not arrays:
        raise TypeError(f"{op}: expected at least one array operand, got only numbers")
    for x in operands:
        if x is not None and not isinstance(x, (torch.Tensor, bool, int, float, np.number,
                                                np.bool_)):
            raise TypeError(f"{op}: expected arrays or numbers, got {type(x).__name__}")
    devices = {x.device for x in arrays}
    if len(devices) > 1:
        raise RuntimeError(f"{op}: operands are on different devices: "
                           f"{', '.join(str(d) for d in devices)}")
    return arrays[0].device


def _check_out(op, out, shape, device):
    """A given `out` must have the result's shape and the operands' device."""
    if out is None:
        return
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"{op}: out has shape {tuple(out.shape)} but the result has shape "
                         f"{tuple(shape)}")
    if out.device != device:
        raise RuntimeError(f"{op}: out is on {out.device} but the operands are on {device}")


def _out_key(out):
    return None if out is None else _operand(out)[0]


# ----------------------------------------------------------------------------------- launchers
# Each launcher looks its signature's plan up first; only a new signature pays for the checks.


def fill_(x, value):
    """x[...] = value (any strides), in place; returns x."""
    kv, pv = _operand(value)
    key = ("fill", _operand(x)[0], kv)
    plan = _PLANS.get(key)
    if plan is not None:
        return plan(x, value, None, None, pv, 0, 0)
    _check_operands("fill_", x, value)
    compute = tl.float64 if kv == FLOAT else tl.int64
    return _planned(key, "copy", x, x.shape, dtype_of(x), x.device, [value], (pv, 0, 0), compute)


def copy_(dst, src):
    """dst[...] = src: src (array or number) broadcast to dst's shape and cast to dst's dtype;
    dst may have any strides (not overlapping itself). Returns dst."""
    if not isinstance(src, torch.Tensor):
        return fill_(dst, src)
    key = ("copy", _operand(dst)[0], _operand(src)[0])
    plan = _PLANS.get(key)
    if plan is not None:
        return plan(dst, src, None, None, 0, 0, 0)
    _check_operands("copy_", dst, src)
    shape = broadcast_shape("copy_", dst, src)
    if shape != tuple(dst.shape):
        raise ValueError(f"copy_: source of shape {tuple(src.shape)} does not broadcast to the "
                         f"destination's shape {tuple(dst.shape)}")
    src_type, dst_type = dtype_of(src), dtype_of(dst)
    # copy in the source's own type (exact for every pair); half <-> other types via float32
    half = (dtypes.float16, dtypes.bfloat16)
    compute = tl.float32 if src_type in half and dst_type is not src_type else tl_type(src_type)
    return _planned(key, "copy", dst, dst.shape, dst_type, dst.device, [src], (0, 0, 0), compute)


def contiguous(x):
    """A contiguous copy of x. x: [any shape], any strides."""
    return copy_(empty(x.shape, x.dtype, x.device), x)


def cast(x, dtype):
    """x converted to dtype (floats to ints truncate towards zero; nonzero -> True)."""
    return copy_(empty(x.shape, dtypes.get_dtype(dtype).torch, x.device), x)


def arange(start, end, step, dtype, device):
    """[start, start + step, ...) up to but excluding end, as numpy.arange. -> [n]"""
    if step == 0:
        raise ValueError("arange: step must be nonzero")
    numbers = (start, end, step)
    if all(isinstance(v, (int, np.integer)) for v in numbers):
        count = max(0, -((start - end) // step))
        compute, delta = tl.int64, step
    else:
        count = max(0, math.ceil((end - start) / step))
        # numpy fills start + i * delta with delta = (start + step) - start
        compute, delta = tl.float64, (float(start) + float(step)) - float(start)
        start = float(start)
    dtype = dtypes.get_dtype(dtype)
    out = empty((count,), dtype.torch, device)
    (ka, pa), (kb, pb) = _operand(start), _operand(delta)
    key = ("arange", _operand(out)[0], ka, kb)
    return _planned(key, "arange", out, out.shape, dtype, out.device, [start, delta],
                    (pa, pb, 0), compute)


def _binary(op, a, b, out):
    """r = op(a, b) (pow) with numpy broadcasting; the result type is dtypes.result_type(a, b)."""
    ka, pa = _operand(a)
    kb, pb = _operand(b)
    key = (op, ka, kb, None if out is None else _key(out))
    plan = _PLANS.get(key)
    if plan is not None:
        return plan(out, a, b, None, pa, pb, 0)
    device = _check_operands(op, a, b)
    dtype = dtypes.result_type(a, b)
    shape = broadcast_shape(op, a, b)
    _check_out(op, out, shape, device)
    return _planned(key, op, out, shape, dtype, device, [a, b], (pa, pb, 0), compute_type(dtype))


def pow(a, b, out=None):
    """a ** b elementwise, numpy's special cases (see _pow_float); integers wrap."""
    return _binary("pow", a, b, out)


def pow_scalar(x, exponent, out=None):
    """x ** exponent for a Python number exponent (float result for float x)."""
    if not isinstance(exponent, (bool, int, float, np.number)):
        raise TypeError(f"pow_scalar: exponent must be a number, got {type(exponent).__name__}")
    if exponent != 2:
        return _binary("pow", x, exponent, out)
    # numpy's fast path too: exactly x * x
    key = ("square", _operand(x)[0], _out_key(out), type(exponent))
    plan = _PLANS.get(key)
    if plan is not None:
        return plan(out, x, None, None, 0, 0, 0)
    device = _check_operands("pow_scalar", x)
    dtype = dtypes.result_type(x, exponent)
    _check_out("pow_scalar", out, x.shape, device)
    return _planned(key, "square", out, x.shape, dtype, device, [x], (0, 0, 0),
                    compute_type(dtype))


def clamp(x, min=None, max=None, out=None):
    """Elementwise min(max(x, min), max) for number bounds, either of which may be None. Bounds
    are converted to x's dtype first (as the reference does), so an int x stays int."""
    device = _check_operands("clamp", x)
    dtype = dtype_of(x)
    _check_out("clamp", out, x.shape, device)
    bounds = [None if v is None else _convert_number(v, dtype) for v in (min, max)]
    (kb, pb), (kc, pc) = _operand(bounds[0]), _operand(bounds[1])
    key = ("clamp", _operand(x)[0], kb, kc, _out_key(out))
    return _planned(key, "clamp", out, x.shape, dtype, device, [x] + bounds, (0, pb, pc),
                    compute_type(dtype))


def _convert_number(value, dtype):
    """A Python number as `dtype` would hold it (float bounds of an int x truncate; half types
    round)."""
    if dtype.is_floating_point:
        if dtype is dtypes.float64:
            return float(value)
        if dtype is dtypes.bfloat16:
            bits = np.array([value], np.float32).view(np.uint32)[0]
            if not math.isnan(value):
                bits = (int(bits) + 0x7FFF + ((int(bits) >> 16) & 1)) >> 16 << 16
            return float(np.array([bits], np.uint32).view(np.float32)[0])
        return float(np.array([value], dtype.numpy)[0])
    if dtype is dtypes.bool_:
        return bool(value)
    return int(math.trunc(value)) if math.isfinite(value) else 0


# ----------------------------------------------------------------------------------- the table
# Every entry of tritonad/elementwise.py (and each of its derivatives) runs as
# _elementwise_kernel with the entry's formula compiled in as FN: its vocabulary bound to
# tlmath's functions, its constants to tl.constexpr.

_NAMESPACE = {name: value for name, value in vars(tlmath).items() if not name.startswith("__")}
_NAMESPACE.update({name: tl.constexpr(value) for name, value in table.CONSTANTS.items()},
                  __name__=table.__name__)


class _Form:
    """A table formula as the kernel runs it: FN, how many operands, how its result is typed."""

    __slots__ = ("name", "fn", "arity", "result", "condition", "operands")

    def __init__(self, formula):
        self.name, self.arity, self.result = formula.name, formula.arity, formula.result
        self.condition = formula.condition
        # the operands that decide the result type: an op's own (not its numbers), or all a
        # derivative reads
        self.operands = len(getattr(formula, "operands", ())) or formula.arity
        code = formula.fn.__code__
        fn = types.FunctionType(code, _NAMESPACE, code.co_name, formula.fn.__defaults__)
        self.fn = triton.jit(fn)
        # (named so that a noted launch can be compiled again elsewhere: scripts/compile_check)
        self.fn.tritonad_formula = formula.name

    def __repr__(self):
        return f"<kernel form {self.name}>"


_FORMS = {}


def form(formula):
    """The compiled form of an entry or derivative of the table (made once)."""
    f = _FORMS.get(formula)
    if f is None:
        f = _FORMS[formula] = _Form(formula)
    return f


def _op_meta(op):
    """The kernel's constexpr arguments that say which op it computes."""
    if isinstance(op, str):
        return dict(OP=op, FN=None, ARITY=0, COND=False)
    return dict(OP="table", FN=op.fn, ARITY=op.arity, COND=op.condition)


def _first_call(f, operands, out, key):
    """A table formula's first call for a signature: checks, result type, plan."""
    device = _check_operands(f.name, *operands)
    deciding = operands[1 if f.condition else 0:f.operands]
    promoted = dtypes.result_type(*deciding)
    if f.result == "bool":
        dtype, compute = dtypes.bool_, compute_type(promoted)
    else:
        dtype = promoted
        if f.result == "float" and not dtype.is_floating_point:
            dtype = dtypes.default_float
        compute = compute_type(dtype)
    shape = broadcast_shape(f.name, *operands)
    _check_out(f.name, out, shape, device)
    payloads = [0 if isinstance(x, _Tensor) else _operand(x)[1] for x in operands]
    return _planned(key, f, out, shape, dtype, device, operands, payloads, compute)


def apply(formula, *operands, out=None):
    """out[...] = formula(*operands) elementwise, for any entry or derivative of the table:
    operands are arrays (any strides, broadcast together) or numbers."""
    f = form(formula)
    keys = tuple(_operand(x)[0] for x in operands)
    key = (f, keys, None if out is None else _key(out))
    plan = _PLANS.get(key)
    if plan is not None:
        padded = list(operands) + [None] * (4 - len(operands))
        pays = [0 if isinstance(x, _Tensor) else _operand(x)[1] for x in padded]
        return plan(out, *padded[:3], *pays[:3], padded[3], pays[3])
    return _first_call(f, operands, out, key)


def _launcher(op):
    """The primitive of a table entry: one and two operands inline the plan lookup (the eager
    path of `x.exp()` and `a + b`), the rest go through `apply`."""
    f = form(op)
    if op.arity == 1:
        def run(x, out=None):
            key = (f, _key(x) if type(x) is _Tensor else _operand(x)[0],
                   None if out is None else _key(out))
            plan = _PLANS.get(key)
            if plan is not None:
                return plan(out, x, None, None, 0, 0, 0)
            return _first_call(f, (x,), out, key)
    elif op.arity == 2:
        def run(a, b, out=None):
            if type(a) is _Tensor:  # (_key inline: this runs on every eager call)
                ka, pa = (a.dtype, a.shape, a.stride(), a.get_device(), a.data_ptr() % 16 == 0), 0
            else:
                ka, pa = _operand(a)
            if type(b) is _Tensor:
                kb, pb = (b.dtype, b.shape, b.stride(), b.get_device(), b.data_ptr() % 16 == 0), 0
            else:
                kb, pb = _operand(b)
            key = (f, ka, kb, None if out is None else _key(out))
            plan = _PLANS.get(key)
            if plan is not None:
                return plan(out, a, b, None, pa, pb, 0)
            return _first_call(f, (a, b), out, key)
    else:
        def run(*operands, out=None):
            return apply(op, *operands, out=out)
    run.__name__ = run.__qualname__ = op.name
    run.__doc__ = f"{op.doc} Elementwise, broadcast; the kernel of tritonad.elementwise.{op.name}."
    return run


for _op in table.OPS.values():
    globals()[_op.name] = _launcher(_op)


def relu_backward(dy, x, out=None):
    """dx = dy where x > 0, else 0 (relu's derivative, as a gate for fused backwards)."""
    return apply(table.relu.derivatives["x"], x, dy, out=out)


PRIMITIVES = ("fill_", "copy_", "contiguous", "cast", "arange", "pow", "pow_scalar", "clamp",
              "relu_backward", "elementwise") + tuple(table.OPS)


def elementwise(formula, *operands, out=None):
    """The backend primitive for any formula of the table (an entry or a derivative)."""
    return apply(formula, *operands, out=out)

"""Handlers: the elementwise family (every aten operator that is an entry of the elementwise
table, tritonad/elementwise.py, and the backward operators autograd calls for them), with
their in-place (`add_`) and `out=` overloads; and the argument helpers the other families share.

Type promotion: the table's primitives type their results by `dtypes.result_type`, which is
PyTorch's rule (tensors with dimensions, then 0-d tensors, then Python numbers, each deciding only
when it raises the category), so a handler passes the operands as they come. A 0-d cpu tensor
beside cuda tensors (a number PyTorch keeps on the host) is read as a Python number when that
leaves the result type unchanged; otherwise the call falls back. Outputs are new contiguous
tensors. In place (`add_`), the result is written into self when its type is self's and no
other operand overlaps self's memory; otherwise it is computed apart and copied in, cast to
self's type where PyTorch allows that cast (else PyTorch's kernel runs and raises its error).
"""
from __future__ import annotations

import math

import torch

from .. import dtypes
from .. import elementwise as table
from ..backend import _instance
from ..kernels.launch import INTERPRET
from . import registry
from .registry import Fallback, register

B = _instance("triton")          # the triton backend: its primitives take torch tensors
_Tensor = torch.Tensor
OK = frozenset(d.torch for d in dtypes.ALL)          # the types tritonad's kernels hold
FLOATS = frozenset(d.torch for d in dtypes.FLOATING)
_CATEGORY = {d.torch: d.category for d in dtypes.ALL}
STRIDED = torch.empty(0).layout                       # the layout of ordinary tensors
registry.check_errors = lambda: B.check_errors(None)   # every device's flags


# ------------------------------------------------------------------------------ shared helpers

def check(*xs):
    """Fall back unless every tensor among xs has a type tritonad holds (no int8, int16,
    complex, float8, ...) and is strided (no sparse or nested tensors)."""
    for x in xs:
        if isinstance(x, _Tensor):
            if x.dtype not in OK:
                raise Fallback(f"dtype {x.dtype}")
            if x.layout is not STRIDED:
                raise Fallback(f"layout {x.layout}")
        elif isinstance(x, complex):
            raise Fallback("a complex number")


def operands(xs):
    """check(*xs), then xs with 0-d cpu tensors beside device tensors read as Python numbers
    (host_scalars); one pass over xs in the common case."""
    host = False
    for x in xs:
        if isinstance(x, _Tensor):
            if x.dtype not in OK:
                raise Fallback(f"dtype {x.dtype}")
            if x.layout is not STRIDED:
                raise Fallback(f"layout {x.layout}")
            if x.is_cpu and not INTERPRET:
                host = True
        elif isinstance(x, complex):
            raise Fallback("a complex number")
    return host_scalars(*xs) if host else xs


def host_scalars(*xs):
    """The operands with 0-d cpu tensors beside device tensors read as Python numbers (on a GPU;
    under the interpreter every tensor is a cpu tensor and runs as it is). Falls back when the
    number would change the result type (int32 tensor + float64 0-d tensor is float64)."""
    if INTERPRET:
        return xs
    found = [isinstance(x, _Tensor) and x.dim() == 0 and x.is_cpu for x in xs]
    if not any(found):
        return xs
    if all(found[i] or not isinstance(x, _Tensor) for i, x in enumerate(xs)):
        raise Fallback("only cpu tensors")
    numbers = tuple(x.item() if f else x for x, f in zip(xs, found))
    if dtypes.result_type(*xs) is not dtypes.result_type(*numbers):
        raise Fallback("a 0-d cpu tensor decides the result type")
    return numbers


def _overlaps(a, b):
    """Whether tensors a and b share memory (storage), unless they are the same view."""
    if a is b:
        return False
    if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False
    return not (a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride())


def self_overlaps(x):
    """Whether some element of x is written through two indices (a broadcast self): PyTorch
    refuses such in-place writes."""
    return any(s == 0 and n > 1 for s, n in zip(x.stride(), x.shape))


def can_cast(source, target):
    """PyTorch's rule for writing a result of `source` type into a tensor of `target` type:
    never to a lower category (float to int, int to bool)."""
    return _CATEGORY[source] <= _CATEGORY[target]


def write_into(dst, result):
    """dst[...] = result (shapes equal), cast to dst's type; returns dst."""
    if tuple(dst.shape) != tuple(result.shape):
        raise Fallback(f"out has shape {tuple(dst.shape)}, the result {tuple(result.shape)}")
    if not can_cast(result.dtype, dst.dtype):
        raise Fallback(f"result type {result.dtype} cannot be cast to out's {dst.dtype}")
    if dst.numel():
        B.copy_(dst, result)
    return dst


def in_place(fn, self, *others):
    """self[...] = fn(self, *others) as PyTorch's in-place operators: self keeps its shape and
    type; directly into self when the result has self's type, else computed apart and copied
    in. An operand sharing self's memory in another view falls back (PyTorch refuses a partial
    overlap with its own error, and runs a disjoint view of the same storage)."""
    if self_overlaps(self):
        raise Fallback("in-place write into a broadcast tensor")
    tensors = [o for o in others if isinstance(o, _Tensor)]
    if any(_overlaps(self, o) for o in tensors):
        raise Fallback("an operand shares self's memory in another view")
    result_type = dtypes.result_type(self, *(o for o in others if o is not None)).torch
    if result_type == self.dtype:
        shape = broadcast(self, *tensors)
        if shape != tuple(self.shape):
            raise Fallback("in-place result does not have self's shape")
        if self.numel():
            fn(self, *others, out=self)
        return self
    return write_into(self, fn(self, *others))


def broadcast(*xs):
    """numpy's broadcast of the tensors' shapes (no check)."""
    shape = ()
    for x in xs:
        s = tuple(x.shape)
        if len(s) > len(shape):
            shape, s = s, shape
        lead = len(shape) - len(s)
        shape = shape[:lead] + tuple(a if b == 1 else b for a, b in zip(shape[lead:], s))
    return shape


def overloads(name, functional=True, inplace=True, out=True, suffix=""):
    """The aten names of an operator's functional, in-place and out= overloads."""
    dot = f".{suffix}" if suffix else ""
    names = []
    if functional:
        names.append(f"aten::{name}{dot or '.default'}")
    if inplace:
        names.append(f"aten::{name}_{dot or '.default'}")
    if out:
        names.append(f"aten::{name}.{suffix + '_out' if suffix else 'out'}")
    return names


def _result_dtype(entry, args):
    """The dtype of the table entry's result on these operands (as the kernel types it)."""
    n = len(entry.operands)
    promoted = dtypes.result_type(*(args[1:n] if entry.condition else args[:n]))
    if entry.result == "bool":
        return torch.bool
    if entry.result == "float" and not promoted.is_floating_point:
        return dtypes.default_float.torch
    return promoted.torch


def layout_out(entry, args):
    """A new output laid out as the first tensor operand when that is a dense, non-contiguous
    tensor of the result's shape (channels-last activations stay channels-last, as PyTorch's
    elementwise kernels keep them), else None: a new contiguous result."""
    x = args[1] if entry.condition else args[0]
    if type(x) is not _Tensor or x.dim() < 2 or x.is_contiguous():
        return None
    if broadcast(*(a for a in args if isinstance(a, _Tensor))) != tuple(x.shape):
        return None
    out = torch.empty_like(x, dtype=_result_dtype(entry, args))   # preserve_format
    return None if out.is_contiguous() else out


def family(name, fn, functional=True, inplace=True, out=True, suffix="", typing=None,
           out_name=None):
    """Register fn (operands -> a new result) for `name`'s functional, in-place and out=
    overloads: one handler, the overload told apart by the `out` keyword or the aten op.
    typing: the table entry that types fn's result, to lay a new output out as its first
    operand (layout_out); None: always a new contiguous result. out_name: the out= overload's
    name where it is not `{suffix}_out` (add.Tensor's is add.out)."""
    def functional_handler(*args, **kw):
        args = operands(args)
        if typing is not None and type(args[0]) is _Tensor and not args[0].is_contiguous():
            laid_out = layout_out(typing, args)
            if laid_out is not None:
                return fn(*args, out=laid_out, **kw)
        return fn(*args, **kw)

    def inplace_handler(self, *args, **kw):
        check(self)
        args = operands(args)
        return in_place(lambda *ops, out=None: fn(*ops, out=out, **kw), self, *args)

    def out_handler(*args, out, **kw):
        check(out)
        return write_into(out, fn(*operands(args), **kw))

    dot = f".{suffix}" if suffix else ".default"
    if functional:
        register(f"aten::{name}{dot}")(functional_handler)
    if inplace:
        register(f"aten::{name}_{dot}")(inplace_handler)
    if out:
        register(f"aten::{name}.{out_name or (suffix + '_out' if suffix else 'out')}")(
            out_handler)
    return fn


# ------------------------------------------------------------------------------ unary table ops

def _float_only(name):
    def fn(x, out=None):
        if x.dtype not in FLOATS:
            raise Fallback(f"{name} of {x.dtype}")
        return getattr(B, name)(x, out=out)
    return fn


def _no_bool(name):
    def fn(x, out=None):
        if x.dtype is torch.bool:
            raise Fallback(f"{name} of bool")
        return getattr(B, name)(x, out=out)
    return fn


def _direct(name):
    def fn(x, out=None):
        return getattr(B, name)(x, out=out)
    return fn


# exp of an int tensor is a float32 tensor, as the table types "float" results
for _name in ("exp", "log", "sqrt", "rsqrt", "sigmoid", "tanh", "sin", "cos", "erf", "log1p",
              "expm1", "reciprocal"):
    family(_name, _direct(_name), typing=table.OPS[_name])
for _name in ("neg", "abs", "relu"):
    family(_name, _no_bool(_name), typing=table.OPS[_name])
family("sign", _direct("sign"), typing=table.sign)
family("sgn", _direct("sign"), typing=table.sign)          # sgn is sign on real types
for _name in ("floor", "ceil", "trunc"):
    family(_name, _float_only(_name))
family("round", _float_only("round"))
family("isnan", _direct("isnan"), inplace=False)
family("logical_not", _direct("logical_not"))


def _round_decimals(x, *, decimals=0, out=None):
    if decimals != 0 or x.dtype not in FLOATS:
        raise Fallback("round with decimals")
    return B.round(x, out=out)


family("round", _round_decimals, suffix="decimals")


def _isinf(x, out=None):
    if x.dtype not in FLOATS:  # an int is never infinite: all False
        return B.ne(x, x, out=out)
    return B.isinf(x, out=out)


family("isinf", _isinf, inplace=False)


def _bitwise_not(x, out=None):
    if x.dtype is torch.bool:
        return B.logical_not(x, out=out)
    if x.dtype is torch.uint8:
        return B.sub(255, x, out=out)
    if x.dtype in FLOATS:
        raise Fallback("bitwise_not of a float")
    return B.sub(-1, x, out=out)        # ~x = -1 - x in two's complement


family("bitwise_not", _bitwise_not)


# ------------------------------------------------------------------------------ binary table ops

def _alpha(b, alpha):
    """alpha * b for add/sub's alpha (b a tensor or a number)."""
    if alpha == 1:
        return b
    if isinstance(alpha, bool) or (isinstance(alpha, float) and not isinstance(b, float)
                                   and isinstance(b, _Tensor) and not b.is_floating_point()):
        raise Fallback("alpha of another category")
    if isinstance(b, _Tensor):
        return B.mul(b, alpha)
    return b * alpha


def _add(a, b, *, alpha=1, out=None):
    return B.add(a, _alpha(b, alpha), out=out)


def _sub(a, b, *, alpha=1, out=None):
    if _is_bool(a) or _is_bool(b):
        raise Fallback("subtraction of bools")
    return B.sub(a, _alpha(b, alpha), out=out)


def _rsub(a, b, *, alpha=1, out=None):
    return _sub(b, a, alpha=alpha, out=out)


def _is_bool(x):
    return x.dtype is torch.bool if isinstance(x, _Tensor) else isinstance(x, bool)


def _mul(a, b, *, out=None):
    return B.mul(a, b, out=out)


def _div(a, b, *, rounding_mode=None, out=None):
    if rounding_mode is None:
        return B.div(a, b, out=out)
    if rounding_mode != "trunc" or dtypes.result_type(a, b).category != 2:
        raise Fallback(f"div with rounding_mode={rounding_mode!r} of integers or floor")
    return B.trunc(B.div(a, b), out=out)


for _name, _fn in (("add", _add), ("sub", _sub), ("mul", _mul), ("div", _div)):
    family(_name, _fn, suffix="Tensor", typing=table.OPS[_name], out_name="out")
    family(_name, _fn, suffix="Scalar", out=False, typing=table.OPS[_name])
family("div", _div, suffix="Tensor_mode", out_name="out_mode")
family("div", _div, suffix="Scalar_mode", out=False)
family("rsub", _rsub, suffix="Tensor", inplace=False)
family("rsub", _rsub, suffix="Scalar", inplace=False, out=False)
# true_divide decomposes into div above the mode (CompositeImplicitAutograd), out= too


def _scalar_out(name, fn):
    """The `X.Scalar_out` overloads: (self, other, *, out)."""
    @register(f"aten::{name}.Scalar_out")
    def handler(a, b, *, out, **kw):
        check(out, a, b)
        return write_into(out, fn(a, b, **kw))
    return handler


for _name, _fn in (("add", _add), ("sub", _sub), ("mul", _mul), ("div", _div),
                   ("rsub", _rsub)):
    _scalar_out(_name, _fn)


def _table_binary(name):
    def fn(a, b, out=None):
        return getattr(B, name)(a, b, out=out)
    return fn


for _name in ("maximum", "minimum", "atan2"):
    family(_name, _table_binary(_name), inplace=_name == "atan2", typing=table.OPS[_name])
for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    family(_name, _table_binary(_name), suffix="Tensor", typing=table.OPS[_name])
    family(_name, _table_binary(_name), suffix="Scalar", typing=table.OPS[_name])
for _name in ("logical_and", "logical_or", "logical_xor"):
    family(_name, _table_binary(_name))


def _bitwise(logical):
    def fn(a, b, out=None):
        if not (_is_bool(a) and _is_bool(b)):
            raise Fallback("bitwise op of integers")
        return getattr(B, logical)(a, b, out=out)
    return fn


for _name, _logical in (("bitwise_and", "logical_and"), ("bitwise_or", "logical_or"),
                        ("bitwise_xor", "logical_xor")):
    family(_name, _bitwise(_logical), suffix="Tensor")
    family(_name, _bitwise(_logical), suffix="Scalar")


def _pow(a, b, out=None):
    integral = dtypes.result_type(a, b).category < 2
    if integral and (not isinstance(b, _Tensor) and b < 0):
        raise Fallback("integer to a negative power")
    if integral and isinstance(b, _Tensor):
        raise Fallback("integer to a tensor power")
    if isinstance(b, _Tensor) or not isinstance(a, _Tensor):
        return B.pow(a, b, out=out)
    if isinstance(b, bool):
        b = int(b)
    return B.pow_scalar(a, b, out=out)


family("pow", _pow, suffix="Tensor_Tensor", inplace=False)
family("pow", _pow, suffix="Tensor_Scalar", inplace=False)
family("pow", _pow, suffix="Tensor", functional=False, out=False)    # pow_.Tensor
family("pow", _pow, suffix="Scalar", functional=False, out=False)    # pow_.Scalar
family("pow", _pow, suffix="Scalar", inplace=False)


def _where(condition, a, b, out=None):
    if condition.dtype is not torch.bool:
        raise Fallback(f"where with a {condition.dtype} condition")
    return B.where(condition, a, b, out=out)


family("where", _where, suffix="self", inplace=False, out=False, typing=table.where)


@register("aten::where.self_out")
def where_out(condition, a, b, *, out):
    check(out, condition, a, b)
    return write_into(out, _where(*host_scalars(condition, a, b)))




def _lerp(a, end, weight, out=None):
    if a.dtype not in FLOATS:
        raise Fallback("lerp of integers")
    return B.lerp(a, end, weight, out=out)


family("lerp", _lerp, suffix="Scalar")
family("lerp", _lerp, suffix="Tensor")


def _addc(entry):
    """self + value * t1 * t2 (or / t2): the table's entry, one kernel rounding once, as
    PyTorch's (half types computed in float32)."""
    def fn(self, t1, t2, *, value=1, out=None):
        if _is_bool(self) or _is_bool(t1) or _is_bool(t2):
            raise Fallback(f"{entry.name} of bools")
        integers = dtypes.result_type(self, t1, t2).category < 2
        if integers and (entry is table.addcdiv or not isinstance(value, int)):
            raise Fallback(f"{entry.name} of integers")  # PyTorch's error
        return getattr(B, entry.name)(self, t1, t2, value, out=out)
    return fn


family("addcmul", _addc(table.addcmul), typing=table.addcmul)
family("addcdiv", _addc(table.addcdiv), typing=table.addcdiv)


# ------------------------------------------------------------------------------ clamp

def _finite_bounds(*bounds):
    for v in bounds:
        if v is not None and not isinstance(v, _Tensor) and isinstance(v, float) \
                and math.isnan(v):
            raise Fallback("a NaN bound")


def _clamp(x, min=None, max=None, out=None):
    if min is None and max is None:
        raise Fallback("clamp without bounds")  # PyTorch's error
    if isinstance(min, _Tensor) or isinstance(max, _Tensor):
        return _clamp_tensor(x, min, max, out)
    if x.dtype is torch.bool:
        raise Fallback("clamp of bool")
    _finite_bounds(min, max)
    wide = dtypes.result_type(x, *(v for v in (min, max) if v is not None))
    if wide.torch != x.dtype:
        x = B.cast(x, wide)
    return B.clamp(x, min, max, out=out)


def _clamp_tensor(x, min, max, out=None):
    if x.dtype is torch.bool:
        raise Fallback("clamp of bool")
    if min is not None and max is not None:
        return B.clamp_tensor(x, min, max, out=out)
    if min is not None:
        return B.maximum(x, min, out=out)
    return B.minimum(x, max, out=out)


family("clamp", _clamp)
family("clamp", _clamp, suffix="Tensor")
family("clamp_min", lambda x, v, out=None: _clamp(x, v, None, out))
family("clamp_min", lambda x, v, out=None: _clamp(x, v, None, out), suffix="Tensor")
family("clamp_max", lambda x, v, out=None: _clamp(x, None, v, out))
family("clamp_max", lambda x, v, out=None: _clamp(x, None, v, out), suffix="Tensor")


# ------------------------------------------------------------------------------ activations

def _floating(x, name):
    if x.dtype not in FLOATS:
        raise Fallback(f"{name} of {x.dtype}")


def _gelu(x, *, approximate="none", out=None):
    _floating(x, "gelu")
    if approximate == "tanh":
        return B.gelu_tanh(x, out=out)
    if approximate != "none":
        raise Fallback(f"gelu approximate={approximate!r}")
    return B.gelu(x, out=out)


family("gelu", _gelu, typing=table.gelu)
family("silu", lambda x, out=None: (_floating(x, "silu"), B.silu(x, out=out))[1],
       typing=table.silu)
family("mish", lambda x, out=None: (_floating(x, "mish"), B.mish(x, out=out))[1])
family("hardswish", lambda x, out=None: (_floating(x, "hardswish"), B.hardswish(x, out=out))[1])


def _leaky_relu(x, negative_slope=0.01, out=None):
    _floating(x, "leaky_relu")
    return B.leaky_relu(x, negative_slope, out=out)


def _elu(x, alpha=1.0, scale=1.0, input_scale=1.0, out=None):
    _floating(x, "elu")
    if scale != 1 or input_scale != 1:
        raise Fallback("elu with scale (selu, celu)")
    return B.elu(x, alpha, out=out)


def _hardtanh(x, min_val=-1.0, max_val=1.0, out=None):
    if x.dtype is torch.bool:
        raise Fallback("hardtanh of bool")
    if x.dtype not in FLOATS:
        raise Fallback("hardtanh of integers (bounds truncated)")
    return B.hardtanh(x, min_val, max_val, out=out)


def _softplus(x, beta=1.0, threshold=20.0, out=None):
    _floating(x, "softplus")
    return B.softplus(x, beta, threshold, out=out)


family("leaky_relu", _leaky_relu, typing=table.leaky_relu)
family("elu", _elu)
family("hardtanh", _hardtanh, typing=table.hardtanh)
family("softplus", _softplus, inplace=False)


# ------------------------------------------------------------------------------ their backwards
# Each is a derivative of the table: d(op)/dx contracted with dy, one kernel reading dy and x
# (or y). `grad_input=` is the out= of these operators.

def _derivative(entry, wrt=None):
    d = entry.derivatives[wrt or entry.operands[0]]
    return d, d.reads


def _backward(name, entry, reads_output=False, params=(), wrt=None, register_as=True):
    """A handler of `aten::{name}` (grad_output, x or y, *params) and its grad_input overload,
    registered unless register_as is False (then a wrapper registers it)."""
    d, reads = _derivative(entry, wrt)
    y_or_x = "y" if reads_output else entry.operands[0]

    def fn(dy, x, *numbers, grad_input=None, out=None):
        grad_input = out if out is not None else grad_input
        check(dy, x, grad_input)
        if dy.dtype not in FLOATS or x.dtype not in FLOATS:
            raise Fallback(f"{name} of integers")
        values = {"dy": dy, y_or_x: x, **dict(zip(params, numbers))}
        operands = [values[r] for r in reads]
        if dy.dtype != x.dtype:
            raise Fallback(f"{name} of mixed types")
        laid_out = None
        if not dy.is_contiguous() and dy.dim() > 1 and dy.shape == x.shape:
            laid_out = torch.empty_like(dy)          # channels-last gradients stay so
            if laid_out.is_contiguous():
                laid_out = None
        result = B.elementwise(d, *operands, out=laid_out)
        if result.dtype != dy.dtype:  # a derivative of numbers only is typed float32
            result = B.cast(result, dtypes.get_dtype(dy.dtype))
        if grad_input is not None:
            return write_into(grad_input, result)
        return result

    if register_as:   # the out= overload is grad_input= or out= by operator
        packet = getattr(torch.ops.aten, name)
        register(f"aten::{name}.default", *(f"aten::{name}.{o}" for o in ("grad_input", "out")
                                            if o in packet.overloads()))(fn)
    return fn


_backward("sigmoid_backward", table.sigmoid, reads_output=True)
_backward("tanh_backward", table.tanh, reads_output=True)
_gelu_exact = _backward("gelu_backward", table.gelu, register_as=False)
_gelu_tanh = _backward("gelu_backward", table.gelu_tanh, register_as=False)
# silu_backward and mish_backward decompose above the mode (CompositeImplicitAutograd): their
# grad_input overloads only
register("aten::silu_backward.grad_input")(_backward("silu_backward", table.silu,
                                                     register_as=False))
_backward("hardswish_backward", table.hardswish)
_backward("hardtanh_backward", table.hardtanh, params=("min_val", "max_val"))
_backward("softplus_backward", table.softplus, params=("beta", "threshold"))
_relu_backward = _backward("threshold_backward", table.relu, register_as=False)


@register("aten::gelu_backward.default", "aten::gelu_backward.grad_input")
def gelu_backward(dy, x, *, approximate="none", grad_input=None):
    if approximate == "tanh":
        return _gelu_tanh(dy, x, grad_input=grad_input)
    if approximate != "none":
        raise Fallback(f"gelu approximate={approximate!r}")
    return _gelu_exact(dy, x, grad_input=grad_input)


@register("aten::threshold_backward.default", "aten::threshold_backward.grad_input")
def threshold_backward(dy, x, threshold, *, grad_input=None):
    """relu's backward at threshold 0 (one kernel: dy where x > 0; relu'(NaN) = 1 as
    PyTorch's x <= threshold test); else where(x > threshold, dy, 0), NaN to dy likewise."""
    if threshold != 0:
        check(dy, x, grad_input)
        if dy.dtype != x.dtype or dy.dtype not in FLOATS:
            raise Fallback("threshold_backward of mixed or integer types")
        result = B.where(B.le(x, threshold), 0, dy)
        return result if grad_input is None else write_into(grad_input, result)
    return _relu_backward(dy, x, grad_input=grad_input)


def _threshold(x, threshold, value, out=None):
    """y = value where x <= threshold, else x (nn.Threshold; NaN stays NaN, as PyTorch)."""
    if x.dtype is torch.bool:
        raise Fallback("threshold of bools")
    if dtypes.result_type(x, threshold, value) != dtypes.get_dtype(x.dtype):
        raise Fallback("threshold with numbers of a higher category")
    return B.where(B.le(x, threshold), value, x, out=out)


family("threshold", _threshold)


_leaky_backward = _backward("leaky_relu_backward", table.leaky_relu,
                           params=("negative_slope",), register_as=False)


@register("aten::leaky_relu_backward.default", "aten::leaky_relu_backward.grad_input")
def leaky_relu_backward(dy, x, negative_slope, self_is_result, *, grad_input=None):
    if self_is_result and negative_slope < 0:
        raise Fallback("leaky_relu_backward from a result with a negative slope")
    return _leaky_backward(dy, x, negative_slope, grad_input=grad_input)


_elu_backward = _backward("elu_backward", table.elu, params=("alpha",), register_as=False)


@register("aten::elu_backward.default", "aten::elu_backward.grad_input")
def elu_backward(dy, alpha, scale, input_scale, is_result, x, *, grad_input=None):
    if is_result or scale != 1 or input_scale != 1:
        raise Fallback("elu_backward from a result or with scales")
    return _elu_backward(dy, x, alpha, grad_input=grad_input)

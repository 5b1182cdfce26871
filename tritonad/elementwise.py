"""The elementwise ops, one entry each: a formula and its derivatives, written once.

An entry is a plain Python function over a small vocabulary of maths (`exp`, `erf`, `where`, ...)
and the operators. Its signature says what it takes: parameters without a default are operands
(tensors or numbers, broadcast together), parameters with one are numbers (`negative_slope`).
Each derivative is a function of the same kind whose parameter names pick what it reads: the
op's operands and numbers, `y` (the result) and `dy` (the incoming gradient).

    @elementwise(module="SiLU")
    def silu(x):
        "x * sigmoid(x)."
        return x * sigmoid(x)

    @silu.derivative
    def _(x, dy):
        s = sigmoid(x)
        return dy * s * (1.0 + x * (1.0 - s))

From that entry follow, with no other file touched:
- the Triton kernel: the formula compiled into `kernels/elementwise.py`'s one strided,
  broadcasting kernel (its names bound to `kernels/tlmath.py`), on the lean launch path;
- the numpy evaluation (the reference backend; names bound to `npmath.py`);
- the autodiff rule: each derivative runs as one fused kernel, or, when a graph of the backward
  is wanted (`create_graph=True`), as Tensor ops (names bound to the table's own ops), so that
  gradients of every order exist;
- `td.silu`, `x.silu()`, `F.silu` and, with `module=`, `nn.SiLU`.

`tests/test_table.py` checks every entry: the kernel against numpy, forward and backward, on odd,
broadcast and strided shapes; the derivatives against float64 finite differences; and PyTorch's
function of the same name at edge values (NaN, infinities, zeros, ties).

Vocabulary (implemented by each evaluator): exp log log1p expm1 sqrt rsqrt sin cos tanh sigmoid
erf floor ceil trunc rint fabs sign atan2 div where maximum minimum zeros_like isnan, the
constants below, and Python's arithmetic, comparison and bitwise (& | ^) operators.
Comparisons give bools; `div` is true division, rounded as IEEE (plain `/` may not be, on a GPU).
"""
from __future__ import annotations

import inspect
import math

# constants a formula may name (bound as tl.constexpr for the kernels)
CONSTANTS = {  # (in a formula, a constant goes right of a tensor: `x * SQRT1_2`)
    "SQRT1_2": math.sqrt(0.5),                      # 1 / sqrt(2)
    "INV_SQRT_2PI": 1.0 / math.sqrt(2.0 * math.pi),  # the normal density's constant
    "SQRT_2_OVER_PI": math.sqrt(2.0 / math.pi),
    "TWO_OVER_SQRT_PI": 2.0 / math.sqrt(math.pi),
}

VOCABULARY = ("exp", "log", "log1p", "expm1", "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid",
              "erf", "floor", "ceil", "trunc", "rint", "fabs", "sign", "atan2", "div", "where",
              "maximum", "minimum", "zeros_like", "isnan")

OPS = {}  # name -> Op, in the order written


class Op:
    """One table entry. `operands`: the names of its operands; `params`: {name: default} of its
    number parameters; `result`: "float" (integers give the default float), "same" (the operands'
    promoted type) or "bool"; `derivatives`: {operand name: Derivative}. An Op and each of its
    Derivatives is a formula a backend evaluates: `name`, `fn`, `arity`, `result`, `condition`."""

    def __init__(self, fn, result, module, method, condition):
        signature = inspect.signature(fn)
        self.name = fn.__name__
        self.fn = fn
        self.operands = tuple(n for n, p in signature.parameters.items()
                              if p.default is inspect.Parameter.empty)
        self.params = {n: p.default for n, p in signature.parameters.items()
                       if p.default is not inspect.Parameter.empty}
        self.arity = len(self.operands) + len(self.params)  # what the kernel is called with
        self.result = result
        self.module = module
        self.method = method
        self.condition = condition  # the first operand is a bool condition (where)
        self.derivatives = {}
        self.doc = inspect.getdoc(fn) or self.name
        if self.arity > 4:
            raise ValueError(f"{self.name}: the kernel takes at most 4 operands and numbers")

    def derivative(self, fn=None, *, wrt=None):
        """Register fn as d(op)/d(operand `wrt`) contracted with dy (`wrt` defaults to the
        only operand). Use as `@op.derivative` or `@op.derivative(wrt="b")`."""
        def register(fn):
            target = wrt or self.operands[0]
            if target not in self.operands:
                raise ValueError(f"{self.name}: no operand named {target}")
            self.derivatives[target] = Derivative(self, target, fn)
            return self
        return register(fn) if fn is not None else register

    def __repr__(self):
        return f"<elementwise op {self.name}({', '.join(self.operands)})>"


class Derivative:
    """d(op)/d(wrt) times dy as a formula of `reads`: some of the op's operands and numbers,
    y (its result) and dy. Its result has the floating type of what it reads."""

    result = "float"

    def __init__(self, op, wrt, fn):
        self.op, self.wrt, self.fn = op, wrt, fn
        self.name = f"{op.name}_backward_{wrt}"
        self.reads = tuple(inspect.signature(fn).parameters)
        known = set(op.operands) | set(op.params) | {"y", "dy"}
        if not set(self.reads) <= known:
            raise ValueError(f"{self.name}: a derivative may read {sorted(known)}, not "
                             f"{sorted(set(self.reads) - known)}")
        self.arity = len(self.reads)
        if self.arity > 4:
            raise ValueError(f"{self.name}: a derivative reads at most 4 values")
        self.condition = op.condition and self.reads[0] == op.operands[0]
        # `return dy` (add's operands, sub's first): the gradient is dy itself, handed on
        # without a kernel, as PyTorch's AddBackward does (the engine then sums it to the
        # operand's shape and casts it to its dtype, as any gradient)
        self.identity = self.reads == ("dy",) and _returns_its_argument(fn)

    def __repr__(self):
        return f"<derivative {self.name}({', '.join(self.reads)})>"


def formula(name):
    """The entry or derivative of the table called `name` ("gelu", "gelu_backward_x")."""
    if name in OPS:
        return OPS[name]
    op, _, wrt = name.partition("_backward_")
    try:
        return OPS[op].derivatives[wrt]
    except KeyError:
        raise KeyError(f"no elementwise entry or derivative {name!r}") from None


def _returns_its_argument(fn):
    marker = object()
    try:
        return fn(marker) is marker
    except Exception:  # (any arithmetic on the marker: not the identity)
        return False


def elementwise(fn=None, *, result="float", module=None, method=True, condition=False):
    """Register an entry (see the module docstring)."""
    def register(fn):
        op = Op(fn, result, module, method, condition)
        if op.name in OPS:
            raise ValueError(f"elementwise op {op.name} is defined twice")
        OPS[op.name] = op
        return op
    return register(fn) if fn is not None else register


# ------------------------------------------------------------------------------ arithmetic

@elementwise(result="same")
def neg(x):
    "-x."
    return -x


@neg.derivative
def _(dy):
    return -dy


@elementwise(result="same", method=False)
def add(a, b):
    "a + b."
    return a + b


@add.derivative(wrt="a")
def _(dy):
    return dy


@add.derivative(wrt="b")
def _(dy):
    return dy


@elementwise(result="same", method=False)
def sub(a, b):
    "a - b."
    return a - b


@sub.derivative(wrt="a")
def _(dy):
    return dy


@sub.derivative(wrt="b")
def _(dy):
    return -dy


@elementwise(result="same", method=False)
def mul(a, b):
    "a * b."
    return a * b


@mul.derivative(wrt="a")
def _(b, dy):
    return dy * b


@mul.derivative(wrt="b")
def _(a, dy):
    return dy * a


@elementwise(method=False)
def div(a, b):
    "a / b, true division (integers give floats), rounded as IEEE."
    return div(a, b)


@div.derivative(wrt="a")
def _(b, dy):
    return div(dy, b)


@div.derivative(wrt="b")
def _(b, y, dy):
    return -div(dy * y, b)


@elementwise
def reciprocal(x):
    "1 / x."
    return div(1.0, x)


@reciprocal.derivative
def _(y, dy):
    return -dy * y * y


@elementwise(result="same")
def abs(x):
    "|x|.  NOTE: the gradient is dy * sign(x): 0 at 0 and at NaN, as torch."
    return fabs(x)


@abs.derivative
def _(x, dy):
    return dy * sign(x)


@elementwise(result="same")
def sign(x):
    "-1, 0 or 1.  NOTE: sign(NaN) = 0, as torch."
    return sign(x)


@sign.derivative
def _(dy):
    return zeros_like(dy)


@elementwise(result="same")
def maximum(a, b):
    "The larger of a and b; NaN if either is.  NOTE: ties give each side half the gradient."
    return maximum(a, b)


@maximum.derivative(wrt="a")
def _(a, b, dy):
    return where(a < b, 0.0, where(a == b, 0.5 * dy, dy))  # NaN: all of dy to both, as torch


@maximum.derivative(wrt="b")
def _(a, b, dy):
    return where(a > b, 0.0, where(a == b, 0.5 * dy, dy))


@elementwise(result="same")
def minimum(a, b):
    "The smaller of a and b; NaN if either is.  NOTE: ties give each side half the gradient."
    return minimum(a, b)


@minimum.derivative(wrt="a")
def _(a, b, dy):
    return where(a > b, 0.0, where(a == b, 0.5 * dy, dy))


@minimum.derivative(wrt="b")
def _(a, b, dy):
    return where(a < b, 0.0, where(a == b, 0.5 * dy, dy))


@elementwise(result="same", method=False, condition=True)
def where(condition, input, other):
    "input where condition is true, other elsewhere."
    return where(condition, input, other)


@where.derivative(wrt="input")
def _(condition, dy):
    return where(condition, dy, 0.0)


@where.derivative(wrt="other")
def _(condition, dy):
    return where(condition, 0.0, dy)


@elementwise(result="same", method=False)
def clamp_tensor(input, min, max):
    "min(max(input, min), max) with tensor bounds; max wins where min > max, as torch."
    return minimum(maximum(input, min), max)


@clamp_tensor.derivative(wrt="input")
def _(input, min, max, dy):
    return where((input >= min) & (input <= max), dy, 0.0)


@clamp_tensor.derivative(wrt="min")
def _(input, min, max, dy):
    return where((input < min) & (min < max), dy, 0.0)  # (min > max: the result is max)


@clamp_tensor.derivative(wrt="max")
def _(input, min, max, dy):
    return where((input > max) | (max < min), dy, 0.0)


@elementwise
def lerp(input, end, weight):
    "input + weight * (end - input), evaluated from the nearer end as torch does."
    return where(fabs(weight) < 0.5, input + weight * (end - input),
                 end - (end - input) * (1.0 - weight))


@lerp.derivative(wrt="input")
def _(weight, dy):
    return dy * (1.0 - weight)


@lerp.derivative(wrt="end")
def _(weight, dy):
    return dy * weight


@lerp.derivative(wrt="weight")
def _(input, end, dy):
    return dy * (end - input)


@elementwise(result="same")
def addcmul(input, tensor1, tensor2, value=1.0):
    "input + value * tensor1 * tensor2, rounded once (half types compute in float32)."
    return input + value * tensor1 * tensor2


@addcmul.derivative(wrt="input")
def _(dy):
    return dy


@addcmul.derivative(wrt="tensor1")
def _(tensor2, value, dy):
    return dy * value * tensor2


@addcmul.derivative(wrt="tensor2")
def _(tensor1, value, dy):
    return dy * value * tensor1


@elementwise
def addcdiv(input, tensor1, tensor2, value=1.0):
    "input + value * (tensor1 / tensor2), rounded once (integers divide truly)."
    return input + value * div(tensor1, tensor2)


@addcdiv.derivative(wrt="input")
def _(dy):
    return dy


@addcdiv.derivative(wrt="tensor1")
def _(tensor2, value, dy):
    return dy * value / tensor2


@addcdiv.derivative(wrt="tensor2")
def _(tensor1, tensor2, value, dy):
    return -dy * value * tensor1 / (tensor2 * tensor2)


@elementwise
def atan2(input, other):
    "The angle of the point (other, input), in (-pi, pi], with C99's signed zeros."
    return atan2(input, other)


@atan2.derivative(wrt="input")
def _(input, other, dy):
    r = input * input + other * other
    return where(r == 0.0, 0.0, div(dy * other, r))  # NOTE: 0 at the origin, as torch


@atan2.derivative(wrt="other")
def _(input, other, dy):
    r = input * input + other * other
    return where(r == 0.0, 0.0, div(-dy * input, r))


# ------------------------------------------------------------------------------ exp and log

@elementwise
def exp(x):
    "e ** x."
    return exp(x)


@exp.derivative
def _(y, dy):
    return dy * y


@elementwise
def expm1(x):
    "e ** x - 1, accurate near 0."
    return expm1(x)


@expm1.derivative
def _(y, dy):
    return dy * (y + 1.0)


@elementwise
def log(x):
    "The natural logarithm."
    return log(x)


@log.derivative
def _(x, dy):
    return div(dy, x)


@elementwise
def log1p(x):
    "log(1 + x), accurate near 0."
    return log1p(x)


@log1p.derivative
def _(x, dy):
    return div(dy, x + 1.0)


@elementwise
def sqrt(x):
    "The square root, rounded as IEEE."
    return sqrt(x)


@sqrt.derivative
def _(y, dy):
    return div(dy, y * 2.0)


@elementwise
def rsqrt(x):
    "1 / sqrt(x)."
    return rsqrt(x)


@rsqrt.derivative
def _(y, dy):
    return -0.5 * dy * y * y * y


# ------------------------------------------------------------------------------ trigonometry

@elementwise
def sin(x):
    "The sine."
    return sin(x)


@sin.derivative
def _(x, dy):
    return dy * cos(x)


@elementwise
def cos(x):
    "The cosine."
    return cos(x)


@cos.derivative
def _(x, dy):
    return -dy * sin(x)


@elementwise(module="Tanh")
def tanh(x):
    "The hyperbolic tangent."
    return tanh(x)


@tanh.derivative
def _(y, dy):
    return dy * (1.0 - y * y)


@elementwise
def erf(x):
    "The error function."
    return erf(x)


@erf.derivative
def _(x, dy):
    return dy * TWO_OVER_SQRT_PI * exp(-x * x)


# ------------------------------------------------------------------------------ rounding

@elementwise(result="same")
def floor(x):
    "The largest integer <= x."
    return floor(x)


@floor.derivative
def _(dy):
    return zeros_like(dy)


@elementwise(result="same")
def ceil(x):
    "The smallest integer >= x."
    return ceil(x)


@ceil.derivative
def _(dy):
    return zeros_like(dy)


@elementwise(result="same")
def trunc(x):
    "x rounded towards zero."
    return trunc(x)


@trunc.derivative
def _(dy):
    return zeros_like(dy)


@elementwise(result="same")
def round(x):
    "x rounded to the nearest integer, halves to even (as torch.round)."
    return rint(x)


@round.derivative
def _(dy):
    return zeros_like(dy)


# ------------------------------------------------------------------------------ activations

@elementwise(result="same", module="ReLU")
def relu(x):
    "max(x, 0).  NOTE: NaN stays NaN; relu'(0) = 0 and relu'(NaN) = 1, as torch."
    return where(x < 0, 0, x)


@relu.derivative
def _(x, dy):
    return where(x <= 0, 0.0, dy)


@elementwise(module="Sigmoid")
def sigmoid(x):
    "1 / (1 + exp(-x)), exactly 0 and 1 in the limits."
    return sigmoid(x)


@sigmoid.derivative
def _(y, dy):
    return dy * y * (1.0 - y)


@elementwise(module="GELU", method=False)
def gelu(x):
    "x Phi(x) = 0.5 x (1 + erf(x / sqrt 2)): the exact GELU (approximate='none')."
    return 0.5 * x * (1.0 + erf(x * SQRT1_2))


@gelu.derivative
def _(x, dy):
    return dy * (0.5 * (1.0 + erf(x * SQRT1_2)) + x * exp(-0.5 * x * x) * INV_SQRT_2PI)


@elementwise(method=False)
def gelu_tanh(x):
    "0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): GELU's tanh form (approximate='tanh')."
    return 0.5 * x * (1.0 + tanh((x + 0.044715 * x * x * x) * SQRT_2_OVER_PI))


@gelu_tanh.derivative
def _(x, dy):
    t = tanh((x + 0.044715 * x * x * x) * SQRT_2_OVER_PI)
    return dy * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * SQRT_2_OVER_PI *
                 (1.0 + 3.0 * 0.044715 * x * x))


@elementwise(module="SiLU", method=False)
def silu(x):
    "x * sigmoid(x) (also called swish)."
    return x * sigmoid(x)


@silu.derivative
def _(x, dy):
    s = sigmoid(x)
    return dy * s * (1.0 + x * (1.0 - s))


@elementwise(module="Softplus", method=False)
def softplus(x, beta=1.0, threshold=20.0):
    "log(1 + exp(beta x)) / beta, and x itself where beta x > threshold."
    return where(x * beta > threshold, x, div(log1p(exp(-fabs(x * beta))) +
                                              maximum(x * beta, 0.0), beta))


@softplus.derivative
def _(x, beta, threshold, dy):
    return where(x * beta > threshold, dy, dy * sigmoid(x * beta))


@elementwise(module="Mish", method=False)
def mish(x):
    "x * tanh(softplus(x))."
    return x * tanh(log1p(exp(-fabs(x))) + maximum(x, 0.0))


@mish.derivative
def _(x, dy):
    t = tanh(log1p(exp(-fabs(x))) + maximum(x, 0.0))
    return dy * (t + x * sigmoid(x) * (1.0 - t * t))


@elementwise(module="LeakyReLU", method=False)
def leaky_relu(x, negative_slope=0.01):
    "x where x > 0, negative_slope * x elsewhere."
    return where(x > 0, x, x * negative_slope)


@leaky_relu.derivative
def _(x, negative_slope, dy):
    return where(x > 0, dy, dy * negative_slope)


@elementwise(module="ELU", method=False)
def elu(x, alpha=1.0):
    "x where x > 0, alpha (exp(x) - 1) elsewhere."
    return where(x > 0, x, alpha * expm1(x))


@elu.derivative
def _(x, alpha, dy):
    return where(x <= 0, dy * alpha * exp(x), dy)


@elementwise(result="same", module="Hardtanh", method=False)
def hardtanh(x, min_val=-1.0, max_val=1.0):
    "x clamped to [min_val, max_val]; NaN stays NaN."
    return minimum(maximum(x, min_val), max_val)


@hardtanh.derivative
def _(x, min_val, max_val, dy):
    return where((x <= min_val) | (x >= max_val), 0.0, dy)


@elementwise(result="same", module="ReLU6", method=False)
def relu6(x):
    "x clamped to [0, 6]; NaN stays NaN."
    return minimum(maximum(x, 0.0), 6.0)


@relu6.derivative
def _(x, dy):
    return where((x <= 0.0) | (x >= 6.0), 0.0, dy)


@elementwise(module="Hardswish", method=False)
def hardswish(x):
    "x * relu6(x + 3) / 6."
    return x * minimum(maximum(x + 3.0, 0.0), 6.0) * (1.0 / 6.0)


@hardswish.derivative
def _(x, dy):
    return where(x <= -3.0, 0.0, where(x < 3.0, dy * (x * (1.0 / 3.0) + 0.5), dy))


# ------------------------------------------------------------------------------ comparisons

@elementwise(result="bool", method=False)
def eq(a, b):
    "a == b."
    return a == b


@elementwise(result="bool", method=False)
def ne(a, b):
    "a != b."
    return a != b


@elementwise(result="bool", method=False)
def lt(a, b):
    "a < b."
    return a < b


@elementwise(result="bool", method=False)
def le(a, b):
    "a <= b."
    return a <= b


@elementwise(result="bool", method=False)
def gt(a, b):
    "a > b."
    return a > b


@elementwise(result="bool", method=False)
def ge(a, b):
    "a >= b."
    return a >= b


@elementwise(result="bool")
def isnan(x):
    "True where x is NaN."
    return isnan(x)


@elementwise(result="bool")
def logical_not(x):
    "True where x is zero (or False)."
    return x == 0


@elementwise(result="bool")
def logical_and(a, b):
    "True where both a and b are nonzero."
    return (a != 0) & (b != 0)


@elementwise(result="bool")
def logical_or(a, b):
    "True where a or b is nonzero."
    return (a != 0) | (b != 0)


@elementwise(result="bool")
def logical_xor(a, b):
    "True where exactly one of a and b is nonzero."
    return (a != 0) ^ (b != 0)


@elementwise(result="bool")
def isfinite(x):
    "True where x is neither infinite nor NaN."
    return (x - x) == 0


@elementwise(result="bool")
def isinf(x):
    "True where x is +inf or -inf."
    return (x == x) & ((x - x) != 0)

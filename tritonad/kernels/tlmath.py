"""The elementwise table's vocabulary in Triton (see tritonad/elementwise.py).

Each name is a `@triton.jit` function of values already in their compute type (float32 for
half and float32 inputs, float64, or an integer type). On a GPU the transcendental functions
are CUDA's libdevice ones (correctly rounded to within an ulp or two); under Triton's
interpreter, which cannot call libdevice, they are written out from exp and log with the
classic accurate forms (Kahan's for log1p and expm1) or come from `tl.math`.
"""
import triton
import triton.language as tl

from .launch import INTERPRET

if not INTERPRET:
    from triton.language.extra import libdevice


@triton.jit
def exp(x):
    return tl.exp(x)


@triton.jit
def log(x):
    return tl.log(x)


@triton.jit
def sqrt(x):
    if x.dtype == tl.float32:
        r = tl.sqrt_rn(x)  # NOTE: IEEE-rounded, as numpy (tl.sqrt may be approximate)
    else:
        r = tl.sqrt(x)
    return r


@triton.jit
def div(a, b):
    # (a + -0.0 is a exactly, and turns a number a into a block of b's type and shape)
    a = a + tl.full(b.shape, -0.0, b.dtype)
    if a.dtype == tl.float32:
        r = tl.div_rn(a, b)  # NOTE: IEEE-rounded division (plain / is approximate)
    else:
        r = a / b
    return r


@triton.jit
def rsqrt(x):
    return div(1.0, sqrt(x))


@triton.jit
def fabs(x):
    return tl.abs(x)


@triton.jit
def sign(x):
    # NOTE: sign(NaN) = 0, as torch (numpy gives NaN)
    return tl.where(x > 0, 1, tl.where(x < 0, -1, 0)).to(x.dtype)


@triton.jit
def isnan(x):
    return x != x


@triton.jit
def where(c, a, b):
    return tl.where(c, a, b)


@triton.jit
def maximum(a, b):
    return tl.where((a > b) | (a != a), a, b)  # NaN in either operand propagates


@triton.jit
def minimum(a, b):
    return tl.where((a < b) | (a != a), a, b)


@triton.jit
def zeros_like(x):
    return tl.zeros_like(x)


@triton.jit
def sigmoid(x):
    # 1 / (1 + exp(-x)) with exp of -|x| only: exactly 0 or 1 in the limits, never inf / inf.
    e = tl.exp(-tl.abs(x))
    return tl.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


@triton.jit
def tanh(x):
    # tanh(x) = sign(x) (1 - e) / (1 + e), e = exp(-2|x|) <= 1: exp never overflows.
    # NOTE: near 0, 1 - e cancels; there the odd series x - x^3/3 + 2x^5/15 - 17x^7/315 +
    # 62x^9/2835 is accurate to 1e-11 relative for |x| < 0.125.
    e = tl.exp(-2.0 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    t = tl.where(x < 0, -t, t)
    x2 = x * x
    series = x * (1.0 + x2 * (-1.0 / 3 + x2 * (2.0 / 15 + x2 * (-17.0 / 315 + x2 * (62.0 / 2835)))))
    return tl.where(tl.abs(x) < 0.125, series.to(t.dtype), t)


@triton.jit
def _log1p_kahan(x):
    # log1p(x) = log(u) * x / (u - 1), u = 1 + x rounded: the rounding error of u cancels
    u = 1.0 + x
    r = tl.log(u) * (x / (u - 1.0))
    return tl.where(u == 1.0, x, tl.where(u == float("inf"), u, r))


@triton.jit
def _expm1_kahan(x):
    # expm1(x) = (u - 1) * x / log(u), u = exp(x) rounded
    u = tl.exp(x)
    r = (u - 1.0) * (x / tl.log(u))
    r = tl.where(u == 1.0, x, r)
    r = tl.where(u - 1.0 == -1.0, -1.0, r)
    return tl.where(u == float("inf"), u, r)


@triton.jit
def _rint_floor(x):
    # round half to even from floor: a fraction of exactly 0.5 goes to the even neighbour
    f = tl.floor(x)
    d = x - f
    even = (f - 2.0 * tl.floor(f * 0.5)) == 0.0
    return tl.where(d > 0.5, f + 1.0, tl.where(d < 0.5, f, tl.where(even, f, f + 1.0)))


@triton.jit
def _atan_cephes(t):
    # atan(t) for t >= 0 (NaN passes), Cephes' rational form with its three-range reduction
    big = t > 2.414213562373095
    mid = (t > 0.66) & ~big
    z = tl.where(big, -1.0 / t, tl.where(mid, (t - 1.0) / (t + 1.0), t))
    base = tl.where(big, 1.5707963267948966, tl.where(mid, 0.7853981633974483, 0.0))
    extra = tl.where(big, 6.123233995736766e-17, tl.where(mid, 3.061616997868383e-17, 0.0))
    zz = z * z
    p = (((-8.750608600031904e-1 * zz - 1.615753718733365e1) * zz - 7.500855792314705e1) * zz
         - 1.228866684490136e2) * zz - 6.485021904942025e1
    q = ((((zz + 2.485846490142306e1) * zz + 1.650270098316988e2) * zz + 4.328810604912903e2)
         * zz + 4.853903996359137e2) * zz + 1.945506571482614e2
    return base + (z * zz * p / q + z + extra)


@triton.jit
def _atan2_cephes(y, x):
    ax = tl.abs(x)
    ay = tl.abs(y)
    swap = ay > ax
    t = tl.where(swap, ax / ay, ay / ax)
    t = tl.where((ax == ay) & (ax == float("inf")), 1.0, tl.where(ax == ay, tl.where(
        ax == 0.0, 0.0, 1.0), t))
    a = _atan_cephes(t)
    a = tl.where(swap, 1.5707963267948966 - a, a)
    x_negative = (x < 0) | ((x == 0) & (1.0 / x < 0))  # -0.0 counts as negative
    a = tl.where(x_negative, 3.141592653589793 - a, a)
    y_negative = (y < 0) | ((y == 0) & (1.0 / y < 0))
    a = tl.where(y_negative, -a, a)
    return tl.where((x != x) | (y != y), x + y, a)


if INTERPRET:
    @triton.jit
    def sin(x):
        return tl.sin(x)

    @triton.jit
    def cos(x):
        return tl.cos(x)

    @triton.jit
    def erf(x):
        return tl.math.erf(x)

    @triton.jit
    def log1p(x):
        return _log1p_kahan(x)

    @triton.jit
    def expm1(x):
        return _expm1_kahan(x)

    @triton.jit
    def atan2(y, x):
        y, x = tl.broadcast(y, x)
        return _atan2_cephes(y, x)

    @triton.jit
    def _trunc_float(x):
        return tl.where(x < 0, tl.ceil(x), tl.floor(x))

    @triton.jit
    def _rint_float(x):
        return _rint_floor(x)
else:
    @triton.jit
    def sin(x):
        return libdevice.sin(x)

    @triton.jit
    def cos(x):
        return libdevice.cos(x)

    @triton.jit
    def erf(x):
        return libdevice.erf(x)

    @triton.jit
    def log1p(x):
        return libdevice.log1p(x)

    @triton.jit
    def expm1(x):
        return libdevice.expm1(x)

    @triton.jit
    def atan2(y, x):
        y, x = tl.broadcast(y, x)
        return libdevice.atan2(y, x)

    @triton.jit
    def _trunc_float(x):
        return libdevice.trunc(x)

    @triton.jit
    def _rint_float(x):
        return libdevice.rint(x)


@triton.jit
def floor(x):
    if x.dtype.is_floating():
        r = tl.floor(x)
    else:
        r = x
    return r


@triton.jit
def ceil(x):
    if x.dtype.is_floating():
        r = tl.ceil(x)
    else:
        r = x
    return r


@triton.jit
def trunc(x):
    if x.dtype.is_floating():
        r = _trunc_float(x)
    else:
        r = x
    return r


@triton.jit
def rint(x):
    if x.dtype.is_floating():
        r = _rint_float(x)
    else:
        r = x
    return r

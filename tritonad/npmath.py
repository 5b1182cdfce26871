"""The elementwise table's vocabulary in numpy (see tritonad/elementwise.py): the reference
backend evaluates every entry's formula with these. Values arrive in their compute type
(float32 for half and float32, float64, or an integer type); NaN and the infinities follow
torch where numpy differs (`sign(NaN)` is 0)."""
import math

import numpy as np

exp, log, log1p, expm1, sqrt = np.exp, np.log, np.log1p, np.expm1, np.sqrt
sin, cos, tanh, floor, ceil, trunc, rint = np.sin, np.cos, np.tanh, np.floor, np.ceil, \
    np.trunc, np.rint
fabs, atan2, where, maximum, minimum, isnan = np.abs, np.arctan2, np.where, np.maximum, \
    np.minimum, np.isnan
zeros_like = np.zeros_like

_erf = np.frompyfunc(math.erf, 1, 1)


def erf(x):
    """math.erf on every element (numpy has no erf), in x's float type."""
    x = np.asarray(x)
    return _erf(x.astype(np.float64)).astype(x.dtype if x.dtype.kind == "f" else np.float64)


def div(a, b):
    return np.divide(a, b)


def rsqrt(x):
    return np.divide(1, np.sqrt(x))


def sign(x):
    # NOTE: sign(NaN) = 0, as torch
    s = np.sign(x)
    return np.where(np.isnan(s), np.zeros((), s.dtype), s) if s.dtype.kind == "f" else s


def sigmoid(x):
    # exp of a non-positive number only: no overflow for large |x|
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))

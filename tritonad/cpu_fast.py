"""The fast CPU path of the numpy backend: float32 convolutions through the DFT.

Off by default: the numpy backend (tritonad/reference/) is the oracle and convolves directly.
Switched on, it sends the stride-1, undilated, ungrouped float32 convolutions whose cost model
says so (the MNIST cnn's second layer, not its first) through the frequency domain, forward and
both gradients. Switch it on with the environment variable TRITONAD_NUMPY_FFT_CONV=1 (read at
import) or by setting `tritonad.cpu_fast.DFT_CONV = True`.

Its values are not the oracle's: float32 rounding is spread over each plane, so its error is
norm-wise (~2e-7 of the largest sum of |terms| of an output, as the direct product's largest
error, but an element whose own terms are small, such as an exact zero, gets that absolute
error too: a relu after it can flip). tests/test_cpu_fast.py checks it against the oracle and
torch. float64 and non-finite values always take the direct path.
"""
from __future__ import annotations

import functools
import math
import os

import numpy as np

from .reference.arrays import _per_thread, _transpose_into, _workspace

# A stride-1, undilated, ungrouped convolution with many channels (the MNIST cnn's second layer)
# runs in the frequency domain: there a correlation is one product per frequency bin, and per bin
# it is a small matrix product over channels, [Co, C] @ [C, n] (complex), so the direct
# product's C Co kh kw multiply-adds per output pixel become ~4 C Co per bin with ~1 bin per
# output pixel: 2.0 -> 0.24 GFLOP per direction for MNIST's conv2. The planes are transformed
# by dense DFT matrices, as BLAS products (numpy's FFT takes ~8 ms for the 3200 16x16 planes of
# that layer's input, where two products take ~1 ms: at sizes like 16, a transform's
# O(P^2) per row by a GEMM beats an FFT's O(P log P) in numpy's one-line-at-a-time loop).
#
# The maths, along one axis (the 2-d transform is one along H, then one along W). With the
# input x [H] placed on a circle of P >= H positions at offset `pad`, and spectra
#   X[u] = sum_h x[h] z^(-u (h + pad)),  K[u] = sum_i k[i] z^(u i),  z = e^(2 pi i / P),
# the circular correlation yc[p] = sum_i k[i] xc[p + i] has Y[u] = K[u] X[u], and
# yc[p] = (1/P) sum_u Y[u] z^(u p). It equals the padded input's correlation y[p] for every
# output p in [0, Ho) when no position p + i < H + 2 pad that the zero padding holds wraps onto
# an input position (_dft_period). x is real, so along H only the bins u <= P/2 are needed (the
# rest are conjugates): the inverse is Re(sum_u a_u ...) with a_u = 2 except u = 0 and P/2.
# Complex numbers are kept as (real, imaginary) pairs of float32 rows, so every step is a real
# matrix product: each of the linear maps below has a real matrix, the gradients are the
# products by their transposes (exactly the adjoint of the forward's computation), and the
# per-bin complex product is the real [2 Co, 2 C] @ [2 C, n] of Kb = [[Kr, -Ki], [Ki, Kr]].
#
# Layout: planes [H, W, (C, n)] (pixels first, samples last): each transform is a left
# product (the pixel axis contracted is the rows), which leaves spectra bins first,
# [Bu, Pw, 2, C, n], so that a bin's [2 C, n] is one matrix for the batched product.
#
# Accuracy: a transform spreads float32 rounding over each plane. The error of y, dx and dw is
# ~2e-7 of their largest sum of |terms| (norm-wise; the direct product's largest error is about
# the same), but an element whose own terms are small (an output near 0 because its window
# holds zeros) gets that absolute error too, where the direct product's error is proportional
# to its own terms. float64 (the oracle of the kernel tests) always takes the direct path.
# Non-finite values spread over a whole plane in a transform, so any NaN or inf in x, k or dy
# sends the call to the direct path (the zero-frequency bin of a spectrum is the plain sum of
# its plane: checked there, cheaply).
#
# On when TRITONAD_NUMPY_FFT_CONV=1 at import, or when set to True (see the docstring).
DFT_CONV = os.environ.get("TRITONAD_NUMPY_FFT_CONV", "0") not in ("", "0")
# The DFT path is taken when the direct path's modelled time exceeds its own by this factor
# (_direct_conv_cost, _dft_conv_cost: fitted to 14 shapes timed on one thread, 1-128
# channels, 7x7-56x56 images, 3x3-7x7 kernels; the modelled ratio of the two was 0.63-1.7x the
# measured one, and on the measured side of 1 for all but a near-tie, measured 1.14).
DFT_CONV_GAIN = 1.0
# Samples are transformed and multiplied in chunks whose spectra take about this many bytes
# (a training batch of the MNIST cnn at once: 11 MB; a 1000-image evaluation batch in seven).
DFT_CHUNK_BYTES = 16 << 20


@functools.lru_cache(maxsize=None)
def _dft_period(size, pad, k):
    """The smallest circle P >= size on which the padded input's correlation with a k-tap
    kernel (stride 1) is exact: every position t < size + 2 pad read by an output lands, modulo
    P, on an input position exactly when t is one (no zero of the padding wraps onto an input
    value, and no input value onto another)."""
    span = size + 2 * pad  # positions read by the outputs: 0 .. Ho + k - 2
    period = max(size, 1)
    while any((pad <= t % period < pad + size) != (pad <= t < pad + size) for t in range(span)):
        period += 1
    return period


class _DftPlan:
    """The real DFT matrices of one geometry (input size, kernel, padding, float type):

    spectra      planes [H, W, M] -> [Bu, 2 Pw, M]:  A [(u, re/im), h], then per u
                 B [(v, re/im), (re/im, w)]
    outputs      spectra -> planes [Ho, Wo, M]:     per u C [(re/im, q), (v, re/im)], then
                 D [p, (u, re/im)] (a_u / (Ph Pw) folded in; only the outputs wanted)
    kernel       k [Co, C, kh, kw] -> Kb [Bu Pw, 2 Co, 2 C]: E [(i, j), (re/im, u, v)]
    and the transposes for the gradients. M is any number of planes (channels x samples)."""

    def __init__(self, in_hw, kernel, padding, dtype):
        (h, w), (kh, kw), (ph, pw) = in_hw, kernel, padding
        self.in_hw, self.kernel = (h, w), (kh, kw)
        self.out_hw = (h + 2 * ph - kh + 1, w + 2 * pw - kw + 1)
        self.period = (_dft_period(h, ph, kh), _dft_period(w, pw, kw))
        (per_h, per_w), (ho, wo) = self.period, self.out_hw
        self.half = bu = per_h // 2 + 1  # bins along H: a real input's spectrum is symmetric
        self.bins = bu * per_w
        u, v = np.arange(bu), np.arange(per_w)
        # A: along H, real -> complex, the input at offset ph on the circle
        angle = 2 * math.pi * np.outer(u, np.arange(h) + ph) / per_h
        a = np.stack([np.cos(angle), -np.sin(angle)], axis=1).reshape(2 * bu, h)
        # B: along W, complex -> complex: (re, im) times e^(-i phi), phi = 2 pi v (w + pw) / Pw
        phi = 2 * math.pi * np.outer(v, np.arange(w) + pw) / per_w
        b = np.empty((per_w, 2, 2, w))
        b[:, 0, 0], b[:, 0, 1], b[:, 1, 0], b[:, 1, 1] = np.cos(phi), np.sin(phi), \
            -np.sin(phi), np.cos(phi)
        # C: back along W, times e^(+i psi), psi = 2 pi v q / Pw, for the outputs q < Wo only
        psi = 2 * math.pi * np.outer(np.arange(wo), v) / per_w
        c = np.empty((2, wo, per_w, 2))
        c[0, :, :, 0], c[0, :, :, 1], c[1, :, :, 0], c[1, :, :, 1] = np.cos(psi), \
            -np.sin(psi), np.sin(psi), np.cos(psi)
        # D: back along H, the real part of a_u e^(+i theta) (.), theta = 2 pi u p / Ph
        weight = np.where((u == 0) | (2 * u == per_h), 1.0, 2.0) / (per_h * per_w)
        theta = 2 * math.pi * np.outer(np.arange(ho), u) / per_h
        d = np.stack([weight * np.cos(theta), -weight * np.sin(theta)], axis=2)
        # E: the kernel's spectrum K[u, v] = sum_ij k[i, j] e^(+2 pi i (u i / Ph + v j / Pw))
        angle = 2 * math.pi * (np.add.outer(np.outer(np.arange(kh), u) / per_h,
                                            np.outer(np.arange(kw), v) / per_w))  # [i, u, j, v]
        angle = angle.transpose(0, 2, 1, 3).reshape(kh * kw, self.bins)
        e = np.stack([np.cos(angle), np.sin(angle)], axis=1).reshape(kh * kw, 2 * self.bins)
        self.a, self.b, self.c, self.d, self.e = (
            np.ascontiguousarray(m, dtype=dtype) for m in
            (a, b.reshape(2 * per_w, 2 * w), c.reshape(2 * wo, 2 * per_w),
             d.reshape(ho, 2 * bu), e))

    def spectra(self, planes, name):
        """planes [H, W, M] -> spectra [Bu Pw, 2, M] (workspace `name`)."""
        h, w, m = planes.shape
        step = np.matmul(self.a, planes.reshape(h, w * m),
                         out=_workspace("dft_step", (2 * self.half, w * m), planes.dtype))
        out = _workspace(name, (self.half, 2 * self.period[1], m), planes.dtype)
        np.matmul(self.b, step.reshape(self.half, 2 * w, m), out=out)
        return out.reshape(self.bins, 2, m)

    def spectra_adjoint(self, spectra, name):
        """The transpose of spectra(): [Bu Pw, 2, M] -> planes [H, W, M]."""
        (h, w), m = self.in_hw, spectra.shape[-1]
        step = np.matmul(self.b.T, spectra.reshape(self.half, 2 * self.period[1], m),
                         out=_workspace("dft_step", (self.half, 2 * w, m), spectra.dtype))
        out = _workspace(name, (h, w * m), spectra.dtype)
        np.matmul(self.a.T, step.reshape(2 * self.half, w * m), out=out)
        return out.reshape(h, w, m)

    def outputs(self, spectra, name):
        """spectra [Bu Pw, 2, M] -> the output planes [Ho, Wo, M] (the inverse, restricted)."""
        (ho, wo), m = self.out_hw, spectra.shape[-1]
        step = np.matmul(self.c, spectra.reshape(self.half, 2 * self.period[1], m),
                         out=_workspace("dft_step", (self.half, 2 * wo, m), spectra.dtype))
        out = _workspace(name, (ho, wo * m), spectra.dtype)
        np.matmul(self.d, step.reshape(2 * self.half, wo * m), out=out)
        return out.reshape(ho, wo, m)

    def outputs_adjoint(self, planes, name):
        """The transpose of outputs(): output planes [Ho, Wo, M] -> [Bu Pw, 2, M]."""
        ho, wo, m = planes.shape
        step = np.matmul(self.d.T, planes.reshape(ho, wo * m),
                         out=_workspace("dft_step", (2 * self.half, wo * m), planes.dtype))
        out = _workspace(name, (self.half, 2 * self.period[1], m), planes.dtype)
        np.matmul(self.c.T, step.reshape(self.half, 2 * wo, m), out=out)
        return out.reshape(self.bins, 2, m)

    def kernel_spectra(self, k):
        """k [Co, C, kh, kw] -> Kb [Bu Pw, 2 Co, 2 C] = [[Kr, -Ki], [Ki, Kr]] per bin."""
        co, c = k.shape[:2]
        parts = np.matmul(self.e.T, k.reshape(co * c, -1).T).reshape(2, self.bins, co, c)
        kb = np.empty((self.bins, 2, co, 2, c), k.dtype)
        kb[:, 0, :, 0] = kb[:, 1, :, 1] = parts[0]
        kb[:, 1, :, 0] = parts[1]
        np.negative(parts[1], out=kb[:, 0, :, 1])
        return kb.reshape(self.bins, 2 * co, 2 * c)

    def kernel_grad(self, dkb):
        """The transpose of kernel_spectra(): dKb [Bu Pw, 2 Co, 2 C] -> dk [Co, C, kh, kw]."""
        co, c = dkb.shape[1] // 2, dkb.shape[2] // 2
        blocks = dkb.reshape(self.bins, 2, co, 2, c)
        parts = np.empty((2, self.bins, co, c), dkb.dtype)
        np.add(blocks[:, 0, :, 0], blocks[:, 1, :, 1], out=parts[0])
        np.subtract(blocks[:, 1, :, 0], blocks[:, 0, :, 1], out=parts[1])
        dk = np.matmul(self.e, parts.reshape(2 * self.bins, co * c))  # [(i, j), (o, c)]
        return np.ascontiguousarray(dk.T).reshape(co, c, *self.kernel)


_DFT_PLANS = {}


def _dft_plan(in_hw, kernel, padding, dtype):
    key = (tuple(in_hw), tuple(kernel), tuple(padding), np.dtype(dtype).str)
    plan = _DFT_PLANS.get(key)
    if plan is None:
        plan = _DFT_PLANS[key] = _DftPlan(in_hw, kernel, padding, dtype)
    return plan


def _direct_conv_cost(c, co, kernel, out_hw):
    """The direct path's time for a forward and both gradients, per sample, in multiply-adds
    of its large GEMMs (~45 G/s a thread here): three products, and its columns built twice
    (~4 each per element) and added back once (~18)."""
    taps = c * kernel[0] * kernel[1] * out_hw[0] * out_hw[1]
    return (3 * co + 26) * taps


def _dft_conv_cost(c, co, in_hw, out_hw, period):
    """The DFT path's time on the same scale: its transforms (x twice, dx; y and dy) and
    per-bin products run at ~2/3 of the direct GEMMs' rate, each element of a layout change
    (_to_planes, _from_planes) costs ~28, of the X^T copy ~8."""
    (h, w), (ho, wo), (per_h, per_w) = in_hw, out_hw, period
    half, bins = per_h // 2 + 1, (per_h // 2 + 1) * per_w
    plane_in = 2 * half * h * w + 4 * half * per_w * w  # spectra() of one plane
    plane_out = 4 * half * per_w * wo + 2 * half * ho * wo  # outputs() of one plane
    products = 1.5 * (3 * c * plane_in + 2 * co * plane_out + 12 * c * co * bins)
    return products + 28 * (3 * c * h * w + 2 * co * ho * wo) + 16 * c * bins


def _dft_conv_plan(v, k, stride, padding, dilation, groups):
    """The _DftPlan for this convolution when the DFT path pays (the cost models above,
    DFT_CONV_GAIN), else None, whether or not the path is on. float32 only: float64 is the
    oracle's, exact to its rounding, and stays direct."""
    n, c, h, w = v.shape
    co, _, kh, kw = k.shape
    if v.dtype != np.float32 or k.dtype != np.float32 or groups != 1 or \
            tuple(stride) != (1, 1) or tuple(dilation) != (1, 1) or n == 0 or c == 0 or co == 0:
        return None
    out_hw = (h + 2 * padding[0] - kh + 1, w + 2 * padding[1] - kw + 1)
    # (the dense transforms' cost grows as the cube of the image side: small images only)
    if min(out_hw) < 1 or kh * kw == 1 or h * w > 64 * 64:
        return None
    period = (_dft_period(h, padding[0], kh), _dft_period(w, padding[1], kw))
    if _direct_conv_cost(c, co, (kh, kw), out_hw) <= \
            DFT_CONV_GAIN * _dft_conv_cost(c, co, (h, w), out_hw, period):
        return None
    return _dft_plan((h, w), (kh, kw), tuple(padding), v.dtype)


def _to_planes(v, name):
    """[n, C, H, W] -> planes [H, W, C, n] (workspace `name`): pixels first, samples last.
    Contiguous, in two passes: [n, (C H W)] -> [(C H W), n] by blocks (_transpose_into), then
    [C, HW, n] -> [HW, C, n] in runs of n (one strided copy takes twice as long)."""
    n, c, h, w = v.shape
    planes = _workspace(name, (h, w, c, n), v.dtype)
    if not v.flags.c_contiguous:
        np.copyto(planes, v.transpose(2, 3, 1, 0))
        return planes
    staged = _transpose_into(_workspace("dft_stage", (c * h * w, n), v.dtype),
                             v.reshape(n, c * h * w))
    np.copyto(planes.reshape(h * w, c, n), staged.reshape(c, h * w, n).transpose(1, 0, 2))
    return planes


def _from_planes(dst, planes):
    """dst [n, C, H, W] = planes [H, W, C, n] (the inverse of _to_planes)."""
    h, w, c, n = planes.shape
    staged = _workspace("dft_stage", (c, h * w, n), planes.dtype)
    np.copyto(staged, planes.reshape(h * w, c, n).transpose(1, 0, 2))
    _transpose_into(dst.reshape(n, c * h * w), staged.reshape(c * h * w, n))
    return dst


def _all_finite(spectra):
    """Whether the planes behind spectra [Bu Pw, 2, M] (of spectra() or outputs_adjoint())
    hold only finite values: bin 0's real part is each plane's plain sum (times a positive
    constant), so a NaN or an inf anywhere in a plane, or a sum that overflows, makes it
    non-finite."""
    return bool(np.isfinite(spectra[0, 0]).all())


def _dft_chunks(n, plan, c, co, itemsize):
    step = max(1, DFT_CHUNK_BYTES // (plan.bins * 2 * (c + co) * itemsize))
    return [(lo, min(n, lo + step)) for lo in range(0, n, step)]


class _KeptKernelSpectra:
    """The kernel spectra of the last DFT forward in this thread, for its backward: found only
    by the plan and the exact bits of the kernel (compared with a copy taken in the forward)."""

    def __init__(self):
        self.key, self.kernel, self.spectra = None, None, None

    def keep(self, key, k, spectra):
        if self.kernel is None or self.kernel.shape != k.shape or self.kernel.dtype != k.dtype:
            self.kernel = np.empty_like(k)
        np.copyto(self.kernel, k)
        self.key, self.spectra = key, spectra

    def take(self, key, k):
        bits = np.dtype(f"u{k.itemsize}")
        if self.key == key and self.kernel.shape == k.shape and \
                np.array_equal(self.kernel.view(bits), k.view(bits)):
            return self.spectra
        return None


def _kept_kernel_spectra():
    return _per_thread("kernel_spectra", _KeptKernelSpectra)


def conv_plan(v, k, stride, padding, dilation, groups):
    """The _DftPlan to run this convolution (numpy operands v [n, C, H, W], k [Co, C, kh, kw])
    with, when the path is on (DFT_CONV) and pays; None sends it to the direct path."""
    return _dft_conv_plan(v, k, stride, padding, dilation, groups) if DFT_CONV else None


# conv2d and conv2d_backward return None when a value is not finite (the caller then takes the
# direct path, whose NaN and inf stay where the windows put them).
def conv2d(plan, v, k, bias):
    """y [n, Co, Ho, Wo] = conv(v, k) + bias: per chunk of samples, x's spectra, one
    product per bin with the kernel's spectra, the inverse; bias added to bin 0."""
    n, c, h, w = v.shape
    co = k.shape[0]
    kb = plan.kernel_spectra(k)
    if not np.isfinite(kb[0]).all() or (bias is not None and not np.isfinite(bias).all()):
        return None
    y = np.empty((n, co) + plan.out_hw, v.dtype)
    for lo, hi in _dft_chunks(n, plan, c, co, v.itemsize):
        m = hi - lo
        xs = plan.spectra(_to_planes(v[lo:hi], "dft_planes").reshape(h, w, c * m), "dft_x")
        if not _all_finite(xs):
            return None
        ys = np.matmul(kb, xs.reshape(plan.bins, 2 * c, m),
                       out=_workspace("dft_y", (plan.bins, 2 * co, m), v.dtype))
        if bias is not None:  # a constant plane's spectrum: Ph Pw b at bin 0, real
            ys[0, :co] += bias * (plan.period[0] * plan.period[1])
        out = plan.outputs(ys.reshape(plan.bins, 2, co * m), "dft_planes")
        _from_planes(y[lo:hi], out.reshape(*plan.out_hw, co, m))
    _kept_kernel_spectra().keep(plan, k, kb)
    return y

def conv2d_backward(plan, g, v, k, input_grad, weight_grad):
    """(dx, dk) by the transposes of the forward's maps: dy's spectra are
    outputs_adjoint(dy); dx = spectra_adjoint(Kb^T @ them) and dKb = them @ X^T per bin."""
    n, c, h, w = v.shape
    co = k.shape[0]
    kb = None
    if input_grad:
        kb = _kept_kernel_spectra().take(plan, k)
        kb = plan.kernel_spectra(k) if kb is None else kb
        if not np.isfinite(kb[0]).all():
            return None
    dx = np.empty(v.shape, v.dtype) if input_grad else None
    dkb = None
    for lo, hi in _dft_chunks(n, plan, c, co, v.itemsize):
        m = hi - lo
        dys = plan.outputs_adjoint(_to_planes(g[lo:hi], "dft_planes").reshape(
            *plan.out_hw, co * m), "dft_y")
        if not _all_finite(dys):
            return None
        dys = dys.reshape(plan.bins, 2 * co, m)
        if weight_grad:
            xs = plan.spectra(_to_planes(v[lo:hi], "dft_planes").reshape(h, w, c * m),
                              "dft_x")
            if not _all_finite(xs):
                return None
            # X^T copied first: OpenBLAS runs this product with a transposed right operand
            # (K = m) at half the rate on one thread and a quarter on two
            xs_t = _workspace("dft_xt", (plan.bins, m, 2 * c), v.dtype)
            np.copyto(xs_t, xs.reshape(plan.bins, 2 * c, m).transpose(0, 2, 1))
            part = np.matmul(dys, xs_t)
            dkb = part if dkb is None else np.add(dkb, part, out=dkb)
        if input_grad:
            dxs = np.matmul(kb.transpose(0, 2, 1), dys,
                            out=_workspace("dft_x", (plan.bins, 2 * c, m), v.dtype))
            planes = plan.spectra_adjoint(dxs.reshape(plan.bins, 2, c * m), "dft_planes")
            _from_planes(dx[lo:hi], planes.reshape(h, w, c, m))
    return dx, None if dkb is None else plan.kernel_grad(dkb)

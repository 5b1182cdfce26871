"""Tensor ops models reach for, written as composites over existing differentiable ops (their
gradients come from their parts): tril, triu, mm, bmm, einsum, pad (constant by cat; reflect,
replicate and circular as one gather along each padded dim), conv1d (conv2d on a height-1 view)
and adaptive_avg_pool2d (a mean for 1x1, avg_pool2d where the bins tile the plane evenly,
per-bin means otherwise), conv_transpose2d (conv2d's input gradient) and interpolate
(nearest and bilinear as gathers along each axis).

einsum lowers an equation to the ops that exist: a letter repeated within one operand takes
the diagonal (a product with an equality mask, summed), a letter of one operand only that is
not wanted later is summed at once, and each pair of operands (left to right) becomes one
batched matmul: permute to [batch, rows, contracted] @ [batch, contracted, columns], reshape
back, permute to the output's order.
"""
from __future__ import annotations

import string

import numpy as np

from .. import dtypes
from ..backend import get_backend
from ..tensor import Tensor, arange, full, tensor
from .conv_ops import avg_pool2d, conv2d
from .function import Function
from .nn_ops import matmul
from .ops import where
from .scan_ops import gather_along
from .shape_ops import cat


# ------------------------------------------------------------------------------ tril / triu


def _triangle(op, x, diagonal, lower):
    if x.ndim < 2:
        raise ValueError(f"{op}: input must have at least 2 dims, got shape {tuple(x.shape)}")
    if isinstance(diagonal, bool) or not isinstance(diagonal, int):
        raise TypeError(f"{op}: diagonal must be an int, got {type(diagonal).__name__}")
    rows, cols = x.shape[-2], x.shape[-1]
    offset = arange(cols, device=x.device).reshape(1, cols) - \
        arange(rows, device=x.device).reshape(rows, 1)          # j - i
    keep = offset <= diagonal if lower else offset >= diagonal
    return where(keep, x, 0.0 if x.dtype.is_floating_point else 0)


def tril(input, diagonal=0):
    """The lower triangle of the last two dims (j - i <= diagonal), zeros above:
    `td.tril(scores)`."""
    return _triangle("tril", input, diagonal, True)


def triu(input, diagonal=0):
    """The upper triangle of the last two dims (j - i >= diagonal), zeros below:
    `td.triu(x, 1)`."""
    return _triangle("triu", input, diagonal, False)


# ------------------------------------------------------------------------------------ mm / bmm


def mm(input, mat2):
    """[n, m] @ [m, p] -> [n, p], 2-d operands only (as torch.mm): `td.mm(a, b)`."""
    if input.ndim != 2 or mat2.ndim != 2:
        raise ValueError(f"mm: expected 2-d tensors, got shapes {tuple(input.shape)} and "
                         f"{tuple(mat2.shape)}")
    if input.shape[1] != mat2.shape[0]:
        raise ValueError(f"mm: shapes {tuple(input.shape)} and {tuple(mat2.shape)} cannot be "
                         f"multiplied ({input.shape[0]}x{input.shape[1]} and "
                         f"{mat2.shape[0]}x{mat2.shape[1]})")
    return matmul(input, mat2)


def bmm(input, mat2):
    """[b, n, m] @ [b, m, p] -> [b, n, p], no broadcasting (as torch.bmm): `td.bmm(q, k)`."""
    if input.ndim != 3 or mat2.ndim != 3:
        raise ValueError(f"bmm: expected 3-d tensors, got shapes {tuple(input.shape)} and "
                         f"{tuple(mat2.shape)}")
    if input.shape[0] != mat2.shape[0] or input.shape[2] != mat2.shape[1]:
        raise ValueError(f"bmm: shapes {tuple(input.shape)} and {tuple(mat2.shape)} do not "
                         "match: expected [b, n, m] and [b, m, p]")
    return matmul(input, mat2)


# ------------------------------------------------------------------------------------ einsum


def _parse(equation, operands):
    """(list of letter strings per operand, output letters): ellipses made letters, spaces gone,
    the implicit output (letters seen once, sorted) filled in."""
    eq = equation.replace(" ", "")
    if "->" in eq:
        lhs, out = eq.split("->", 1)
    else:
        lhs, out = eq, None
    terms = lhs.split(",")
    if len(terms) != len(operands):
        raise ValueError(f"einsum: the equation {equation!r} names {len(terms)} operands but "
                         f"{len(operands)} were given")
    used = set(eq) - set(".,->")
    spare = [c for c in string.ascii_letters if c not in used]
    ell_dims = 0
    for term, x in zip(terms, operands):
        if "..." in term:
            ell_dims = max(ell_dims, x.ndim - (len(term) - 3))
    ell = "".join(spare[:ell_dims])
    letters = []
    for term, x in zip(terms, operands):
        if term.count("...") > 1 or "." in term.replace("...", ""):
            raise ValueError(f"einsum: bad ellipsis in {equation!r}")
        if "..." in term:
            n = x.ndim - (len(term) - 3)
            if n < 0:
                raise ValueError(f"einsum: operand of shape {tuple(x.shape)} has fewer dims "
                                 f"than {term!r} names")
            term = term.replace("...", ell[ell_dims - n:])
        if len(term) != x.ndim:
            raise ValueError(f"einsum: {term!r} names {len(term)} dims for an operand of shape "
                             f"{tuple(x.shape)}")
        if not all(c.isalpha() for c in term):
            raise ValueError(f"einsum: subscripts must be letters, got {term!r}")
        letters.append(term)
    if out is None:
        counts = {}
        for term in letters:
            for c in term:
                counts[c] = counts.get(c, 0) + 1
        out = ell + "".join(sorted(c for c, n in counts.items() if n == 1 and c not in ell))
    else:
        if "..." in out:
            out = out.replace("...", ell)
        if len(set(out)) != len(out) or not all(c.isalpha() for c in out):
            raise ValueError(f"einsum: bad output subscripts in {equation!r}")
        missing = set(out) - set("".join(letters))
        if missing:
            raise ValueError(f"einsum: output subscripts {sorted(missing)} appear in no operand "
                             f"of {equation!r}")
    return letters, out


def _diagonal(x, term):
    """Take the diagonal of every letter repeated in term: (x, term with each letter once)."""
    while len(set(term)) != len(term):
        c = next(c for c in term if term.count(c) > 1)
        a = term.index(c)
        b = term.index(c, a + 1)
        if x.shape[a] != x.shape[b]:
            raise ValueError(f"einsum: subscript {c!r} has sizes {x.shape[a]} and {x.shape[b]}")
        n = x.shape[a]
        shape_a = [n if d == a else 1 for d in range(x.ndim)]
        shape_b = [n if d == b else 1 for d in range(x.ndim)]
        eq = arange(n, device=x.device).reshape(shape_a) == \
            arange(n, device=x.device).reshape(shape_b)
        x = where(eq, x, 0.0).sum(b)
        term = term[:b] + term[b + 1:]
    return x, term


def _sum_out(x, term, keep):
    """Sum the letters of term not in keep."""
    dims = [d for d, c in enumerate(term) if c not in keep]
    if dims:
        x = x.sum(tuple(dims))
        term = "".join(c for c in term if c in keep)
    return x, term


def _sizes(letters, operands):
    size = {}
    for term, x in zip(letters, operands):
        for c, n in zip(term, x.shape):
            if size.get(c, n) != n and n != 1 and size[c] != 1:
                raise ValueError(f"einsum: subscript {c!r} has sizes {size[c]} and {n}")
            size[c] = max(size.get(c, n), n)
    return size


def _contract(a, ta, b, tb, keep, size):
    """a (letters ta) times b (letters tb), summed over the letters not in keep, as one batched
    matmul; returns (result, its letters)."""
    batch = [c for c in ta if c in tb and c in keep]
    summed = [c for c in ta if c in tb and c not in keep]
    left = [c for c in ta if c not in tb]
    right = [c for c in tb if c not in ta]
    for c in batch + summed:  # a size-1 side broadcasts
        if a.shape[ta.index(c)] != size[c]:
            a = a.expand([size[c] if t == c else a.shape[i] for i, t in enumerate(ta)])
        if b.shape[tb.index(c)] != size[c]:
            b = b.expand([size[c] if t == c else b.shape[i] for i, t in enumerate(tb)])
    a = a.permute([ta.index(c) for c in batch + left + summed])
    b = b.permute([tb.index(c) for c in batch + summed + right])
    nb = _prod(size[c] for c in batch)
    m, k, n = (_prod(size[c] for c in group) for group in (left, summed, right))
    y = matmul(a.reshape(nb, m, k), b.reshape(nb, k, n))
    return y.reshape([size[c] for c in batch + left + right]), "".join(batch + left + right)


def _prod(values):
    out = 1
    for v in values:
        out *= v
    return out


def einsum(equation, *operands):
    """Einstein summation, as torch.einsum: `td.einsum("bij,bjk->bik", a, b)`; ellipses,
    implicit outputs, traces ("ii->"), diagonals, outer products and any number of operands
    (contracted left to right). Operands may also come as one list."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    if not operands:
        raise ValueError("einsum: at least one operand is needed")
    letters, out = _parse(equation, operands)
    size = _sizes(letters, operands)
    items = []
    for x, term in zip(operands, letters):
        x, term = _diagonal(x, term)
        items.append((x, term))
    # letters wanted after operand i: the output's and those of the operands after it
    x, term = items[0]
    for i in range(1, len(items) + 1):
        later = set(out).union(*(t for _, t in items[i:]))
        if i == len(items):
            x, term = _sum_out(x, term, later)
            break
        y, ty = items[i]
        x, term = _sum_out(x, term, later | set(ty))
        y, ty = _sum_out(y, ty, later | set(term))
        x, term = _contract(x, term, y, ty, later, size)
    if sorted(term) != sorted(out):  # letters of size-1 broadcasts kept in the output
        raise ValueError(f"einsum: cannot form the output {out!r} of {equation!r}")
    if term != out:
        x = x.permute([term.index(c) for c in out])
    # a letter broadcast from size 1 on every side it appeared on
    want = [size[c] for c in out]
    if list(x.shape) != want:
        x = x.expand(want)
    return x


# ------------------------------------------------------------------------------------ pad


_PAD_MODES = ("constant", "reflect", "replicate", "circular")


def _source_positions(n, left, right, mode):
    """For each position of a padded dim (length n + left + right), the position of x it
    copies (numpy, host side: it depends only on sizes)."""
    at = np.arange(-left, n + right)
    if mode == "replicate":
        return np.clip(at, 0, n - 1)
    if mode == "circular":
        return at % n
    period = 2 * (n - 1)                     # reflect: mirror without repeating the edge
    at = np.abs(at) % period if period else np.zeros_like(at)
    return np.where(at >= n, period - at, at)


def pad(input, pad, mode="constant", value=None):
    """Pad the last len(pad) // 2 dims: pad = (left, right) of the last dim, then of the one
    before, ... (as torch.nn.functional.pad); negative amounts crop. mode "constant" (value,
    default 0), "reflect", "replicate" or "circular". `F.pad(x, (1, 1, 2, 0))`."""
    if mode not in _PAD_MODES:
        raise ValueError(f"pad: mode must be one of {_PAD_MODES}, got {mode!r}")
    pad = tuple(pad)
    if len(pad) % 2 or len(pad) // 2 > input.ndim or \
            not all(isinstance(p, int) and not isinstance(p, bool) for p in pad):
        raise ValueError(f"pad: pad must be an even number of ints, at most 2 per dim of the "
                         f"input (shape {tuple(input.shape)}), got {pad}")
    if mode != "constant" and value not in (None, 0, 0.0):
        raise ValueError(f"pad: value is only for mode 'constant', got mode {mode!r}")
    x = input
    for i in range(len(pad) // 2):
        dim = input.ndim - 1 - i
        left, right = pad[2 * i], pad[2 * i + 1]
        n = x.shape[dim]
        if mode == "constant":
            x = _pad_constant(x, dim, left, right, 0 if value is None else value)
            continue
        if left < 0 or right < 0:  # crop first, as torch does
            x = _narrow(x, dim, max(-left, 0), n - max(-left, 0) - max(-right, 0))
            n, left, right = x.shape[dim], max(left, 0), max(right, 0)
        if mode == "reflect" and (left >= n or right >= n):
            raise ValueError(f"pad: reflect padding ({left}, {right}) must be smaller than the "
                             f"padded dim {dim} of size {n} (shape {tuple(input.shape)})")
        if mode == "circular" and (left > n or right > n):
            raise ValueError(f"pad: circular padding ({left}, {right}) must be at most the "
                             f"padded dim {dim} of size {n} (shape {tuple(input.shape)})")
        if mode == "replicate" and n == 0 and left + right:
            raise ValueError(f"pad: cannot replicate an empty dim {dim} (shape "
                             f"{tuple(input.shape)})")
        if not left and not right:
            continue
        where_from = _source_positions(n, left, right, mode)
        shape = [1] * x.ndim
        shape[dim] = len(where_from)
        index = tensor(where_from, dtype=dtypes.int64, device=x.device).reshape(shape)
        full_shape = list(x.shape)
        full_shape[dim] = len(where_from)
        x = gather_along(x, index.expand(full_shape), dim)
    return x


def _narrow(x, dim, start, length):
    """x[..., start:start + length, ...] along dim (a view)."""
    return x[(slice(None),) * dim + (slice(start, start + length),)]


def _pad_constant(x, dim, left, right, value):
    n = x.shape[dim]
    if left < 0 or right < 0:
        start, stop = max(-left, 0), n - max(-right, 0)
        if stop < start:
            raise ValueError(f"pad: cropping ({left}, {right}) removes more than dim {dim} of "
                             f"size {n} holds")
        x = _narrow(x, dim, start, stop - start)
        left, right = max(left, 0), max(right, 0)
    if not left and not right:
        return x
    parts = []
    for amount in (left, right):
        shape = list(x.shape)
        shape[dim] = amount
        parts.append(full(shape, value, dtype=x.dtype, device=x.device) if amount else None)
    return cat([p for p in (parts[0], x, parts[1]) if p is not None], dim)


# ------------------------------------------------------------------------------ conv1d, pooling


def conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """1-d convolution: input [N, C_in, L] (or [C_in, L]), weight [C_out, C_in / groups, k],
    bias [C_out]; as torch.nn.functional.conv1d (padding an int, a 1-tuple, 'valid' or
    'same'). Runs the conv2d kernels on a height-1 view. `F.conv1d(x, w, padding=1)`."""
    if input.ndim not in (2, 3) or weight.ndim != 3:
        raise ValueError(f"conv1d: expected input [N, C, L] or [C, L] and weight [C_out, C_in / "
                         f"groups, k], got shapes {tuple(input.shape)} and "
                         f"{tuple(weight.shape)}")
    one = {}
    for name, v in (("stride", stride), ("padding", padding), ("dilation", dilation)):
        if isinstance(v, (tuple, list)):
            if len(v) != 1:
                raise ValueError(f"conv1d: {name} must be an int or a 1-tuple, got {v}")
            v = v[0]
        one[name] = v if isinstance(v, str) else (0 if name == "padding" else 1, v)
    y = conv2d(input.unsqueeze(-2), weight.unsqueeze(2), bias, one["stride"], one["padding"],
               one["dilation"], groups)
    return y.squeeze(-2)


def _bins(size, out):
    """torch's adaptive pooling windows: [floor(i * size / out), ceil((i + 1) * size / out))."""
    return [((i * size) // out, -(-((i + 1) * size) // out)) for i in range(out)]


def adaptive_avg_pool2d(input, output_size):
    """Average pooling to a fixed output plane: input [N, C, H, W] or [C, H, W], output_size
    an int or (oh, ow) (None keeps that dim). Output bin i covers [floor(i H / oh),
    ceil((i + 1) H / oh)), as torch. `F.adaptive_avg_pool2d(x, 1)` (global pooling: one mean)."""
    if input.ndim not in (3, 4):
        raise ValueError(f"adaptive_avg_pool2d: expected a 3-d or 4-d input, got shape "
                         f"{tuple(input.shape)}")
    if isinstance(output_size, int):
        output_size = (output_size, output_size)
    h, w = input.shape[-2:]
    oh, ow = (h if output_size[0] is None else output_size[0],
              w if output_size[1] is None else output_size[1])
    if oh <= 0 or ow <= 0:
        raise ValueError(f"adaptive_avg_pool2d: output_size must be positive, got {output_size}")
    if (oh, ow) == (1, 1):
        return input.mean((-2, -1), keepdim=True)
    if h % oh == 0 and w % ow == 0:
        kernel = (h // oh, w // ow)
        x = input if input.ndim == 4 else input.unsqueeze(0)
        y = avg_pool2d(x, kernel, kernel)
        return y if input.ndim == 4 else y.squeeze(0)
    rows = []
    for top, bottom in _bins(h, oh):
        band = _narrow(input, input.ndim - 2, top, bottom - top)
        rows.append(cat([_narrow(band, band.ndim - 1, a, b - a).mean((-2, -1), keepdim=True)
                         for a, b in _bins(w, ow)], -1))
    return cat(rows, -2)


# ------------------------------------------------------------------------------ conv_transpose2d


class ConvTranspose2d(Function):
    """The transposed convolution: the input gradient of conv2d(z, w) for dy = x, where z is
    [N, C_out, Ho, Wo] and w [C_in, C_out / groups, kh, kw] is read as conv2d's weight (C_in
    outputs). Backward (dedicated kernels, once differentiable): dx = conv2d(dy, w) and dw =
    conv2d's weight gradient for input dy and output gradient x."""
    once_differentiable = True

    @staticmethod
    def forward(ctx, x, w, out_shape, stride, padding, dilation, groups):
        ctx.args = stride, padding, dilation, groups
        ctx.save_for_backward(x, w)
        b = get_backend()
        # conv2d_backward takes its input's geometry from an array: one element, expanded
        shape_only = b.empty((1,), dtypes.get_dtype(x.dtype), x.device).expand(out_shape)
        return b.conv2d_backward(x, shape_only, w, stride, padding, dilation, groups,
                                 True, False, False)[0]

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved
        needs, b = ctx.needs_input_grad, get_backend()
        raw = dy._data
        dx = b.conv2d(raw, w._data, None, *ctx.args) if needs[0] else None
        dw = b.conv2d_backward(x._data, raw, w._data, *ctx.args, False, True, False)[1] \
            if needs[1] else None
        wrap = lambda r: Tensor._wrap(r) if r is not None else None  # noqa: E731
        return (wrap(dx), wrap(dw)) + (None,) * 5


def _pair(op, name, v):
    if isinstance(v, int) and not isinstance(v, bool):
        return (v, v)
    v = tuple(v)
    if len(v) != 2 or not all(isinstance(i, int) for i in v):
        raise ValueError(f"{op}: {name} must be an int or a pair of ints, got {v}")
    return v


def conv_transpose2d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1,
                     dilation=1):
    """Transposed 2-d convolution, as torch.nn.functional.conv_transpose2d: input [N, C_in, H,
    W] (or [C_in, H, W]), weight [C_in, C_out / groups, kh, kw], bias [C_out]; output plane
    Ho = (H - 1) sh - 2 ph + dh (kh - 1) + oph + 1. `F.conv_transpose2d(x, w, stride=2)`."""
    if input.ndim == 3:
        return conv_transpose2d(input.unsqueeze(0), weight, bias, stride, padding,
                                output_padding, groups, dilation).squeeze(0)
    op = "conv_transpose2d"
    stride, padding, dilation, output_padding = (_pair(op, n, v) for n, v in (
        ("stride", stride), ("padding", padding), ("dilation", dilation),
        ("output_padding", output_padding)))
    if input.ndim != 4 or weight.ndim != 4:
        raise ValueError(f"{op}: expected input [N, C_in, H, W] and weight [C_in, C_out / groups, "
                         f"kh, kw], got shapes {tuple(input.shape)} and {tuple(weight.shape)}")
    if groups < 1 or input.shape[1] != weight.shape[0] or weight.shape[0] % groups:
        raise ValueError(f"{op}: input of shape {tuple(input.shape)} does not match weight of "
                         f"shape {tuple(weight.shape)} with groups={groups} (input channels must "
                         "equal weight.shape[0], a multiple of groups)")
    for s, d, o in zip(stride, dilation, output_padding):
        if s < 1 or d < 1 or min(padding) < 0 or o < 0 or (o >= s and o >= d):
            raise ValueError(f"{op}: stride {stride}, dilation {dilation} must be >= 1, padding "
                             f"{padding} >= 0 and output_padding {output_padding} smaller than "
                             "the stride or the dilation")
    c_out = weight.shape[1] * groups
    if bias is not None and tuple(bias.shape) != (c_out,):
        raise ValueError(f"{op}: bias of shape {tuple(bias.shape)} does not match {c_out} "
                         "output channels")
    out_hw = [(size - 1) * s - 2 * p + d * (k - 1) + o + 1 for size, s, p, d, k, o in
              zip(input.shape[2:], stride, padding, dilation, weight.shape[2:], output_padding)]
    if min(out_hw) < 1:
        raise ValueError(f"{op}: the output plane {tuple(out_hw)} of input {tuple(input.shape)} "
                         "is empty")
    y = ConvTranspose2d.apply(input, weight, (input.shape[0], c_out, *out_hw), stride, padding,
                              dilation, groups)
    return y if bias is None else y + bias.reshape(1, c_out, 1, 1)


# ------------------------------------------------------------------------------ interpolate


def _axis_sources(n_in, n_out, scale_factor, mode, align_corners):
    """(i0, i1, weight of i1) per output position of one axis, torch's formulas (host side)."""
    dst = np.arange(n_out, dtype=np.float64)
    if mode == "nearest":
        scale = 1.0 / scale_factor if scale_factor else n_in / n_out
        i0 = np.minimum(np.floor(dst * scale), n_in - 1).astype(np.int64)
        return i0, i0, np.zeros(n_out)
    if align_corners:
        scale = (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
        src = dst * scale
    else:
        scale = 1.0 / scale_factor if scale_factor else n_in / n_out
        src = np.maximum((dst + 0.5) * scale - 0.5, 0.0)
    i0 = np.minimum(np.floor(src), n_in - 1).astype(np.int64)
    i1 = np.minimum(i0 + 1, n_in - 1)
    return i0, i1, src - i0


def _gather_axis(x, dim, positions):
    shape = [1] * x.ndim
    shape[dim] = len(positions)
    full_shape = list(x.shape)
    full_shape[dim] = len(positions)
    index = tensor(positions, dtype=dtypes.int64, device=x.device).reshape(shape)
    return gather_along(x, index.expand(full_shape), dim)


def interpolate(input, size=None, scale_factor=None, mode="nearest", align_corners=None,
                recompute_scale_factor=None):
    """Resize the plane of a 4-d input [N, C, H, W], as torch.nn.functional.interpolate:
    mode "nearest" or "bilinear" (align_corners False by default), to `size` or by
    `scale_factor` (one of the two). Separable: one gather (nearest) or two gathers and a blend
    (bilinear) per axis; the gradient scatters back. `F.interpolate(x, scale_factor=2)`."""
    op = "interpolate"
    if input.ndim != 4:
        raise ValueError(f"{op}: expected a 4-d input [N, C, H, W], got shape "
                         f"{tuple(input.shape)}")
    if mode not in ("nearest", "bilinear"):
        raise ValueError(f"{op}: mode must be 'nearest' or 'bilinear', got {mode!r}")
    if mode == "nearest" and align_corners is not None:
        raise ValueError(f"{op}: align_corners is only for the interpolating modes (bilinear)")
    if (size is None) == (scale_factor is None):
        raise ValueError(f"{op}: give exactly one of size and scale_factor")
    h, w = input.shape[2:]
    if size is not None:
        size = (size, size) if isinstance(size, int) else tuple(size)
        factors = (None, None)
    else:
        factors = (scale_factor, scale_factor) if isinstance(scale_factor, (int, float)) \
            else tuple(scale_factor)
        size = tuple(int(np.floor(n * f)) for n, f in zip((h, w), factors))
        if recompute_scale_factor:
            factors = (None, None)
    if len(size) != 2 or min(size) < 1:
        raise ValueError(f"{op}: the output plane {size} of input {tuple(input.shape)} must be "
                         "2 positive sizes")
    x = input
    for dim, n_in, n_out, factor in ((2, h, size[0], factors[0]), (3, w, size[1], factors[1])):
        if n_in == n_out and factor in (None, 1, 1.0):
            continue
        i0, i1, frac = _axis_sources(n_in, n_out, factor, mode, bool(align_corners))
        if mode == "nearest":
            x = _gather_axis(x, dim, i0)
            continue
        shape = [1] * 4
        shape[dim] = n_out
        t = tensor(frac, dtype=x.dtype, device=x.device).reshape(shape)
        x = _gather_axis(x, dim, i0) * (1.0 - t) + _gather_axis(x, dim, i1) * t
    return x

"""The flat-shift weight gradient: stride-1, undilated, "same"-size convolutions (output plane =
input plane: the ResNet-style 3x3 / pad 1 layers, MNIST's 5x5 / pad 2) over contiguous NCHW
arrays. There a tap (i, j) moves every pixel by one constant along the flattened plane,
    x[n, c, p + i - PH, q + j - PW] = x_flat[n, c, pix + (i - PH) * W + (j - PW)],
exact wherever the column q + j - PW stays inside [0, W) (the "wrap" test: outside it the
flat index lands on the neighbouring row, and the term must be zero), and zero wherever the
flat index leaves [0, H*W) (the rows above and below: padding). So dy's tile is a plain
rectangle of the [N*Co, H*W] matrix, which TMA loads straight into shared memory (USE_TMA,
Hopper), and x's the rectangle at a shifted column, one masked load with a single bound and
the wrap test per pixel. (TMA cannot load x's: on an H100 with Triton 3.6 a start column
that is not a 16-byte multiple is an illegal instruction.) With few channels a tile's columns
span taps (MNIST conv1: all 25 in one tile); float32 on small planes reads x as one
zero-padded plane per kernel column, so that its tiles are TMA rectangles too
(_shifted_planes). Measured against the implicit GEMM (implicit_gemm.py), the forward and
input gradient written this way were slower (notes/PERF.md), so only the weight gradient
takes it.

When it applies (`applies`, routing.py): Settings.flat_shift, one group of at least
Settings.shift_min_channels input channels, stride 1, no dilation, output plane = input
plane, contiguous dy and x; on a GPU only where TMA can read dy (Hopper, 16-byte aligned
arrays and planes: the pointer-load form is slower there than the implicit GEMM's kernel).
The interpreter runs the pointer-load form.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..launch import INTERPRET, cdiv, next_power_of_2
from ..plans import empty, run
from .common import dot_fp32, menu_kind, round_up, run_tuned, split_share, tma_capable
from .tf32 import split_tf32, store_split


@triton.jit
def _flat_tile(ptr, row, col, keep, ROWS, COLS, BR: tl.constexpr, BC: tl.constexpr):
    """The [BR, BC] rectangle at (row, col) of a contiguous [ROWS, COLS] matrix where keep[BC]
    (the wrap test of its columns, or True) holds, zero elsewhere (what a TMA load of it
    returns, with keep True): one masked load, so that the tile goes straight to shared memory
    (no pass in registers after)."""
    r = row + tl.arange(0, BR)
    c = col + tl.arange(0, BC)
    ok = (r < ROWS)[:, None] & ((c >= 0) & (c < COLS) & keep)[None, :]
    return tl.load(ptr + r.to(tl.int64)[:, None] * COLS + c[None, :], mask=ok, other=0.0)




@triton.jit
def _shifted_taps_tile(ptr, row0, pix0, shift, dq, C_IN, HW, W, col_ok,
                       BR: tl.constexpr, BC: tl.constexpr):
    """The [BR, BC] tile of x [N*C, HW] whose row r is channel row0 + r's row of the (image,
    channel) matrix at pixels pix0 + shift[r] + k (shift and dq, the tap's column offset, per
    row: rows of several taps), zero where that pixel leaves the plane, wraps into the next row
    (q + dq outside [0, W)) or where pix0 + k is past the plane (dy's zeros there)."""
    pix = pix0 + tl.arange(0, BC)
    q = pix % W
    src = pix[None, :] + shift[:, None]
    qs = q[None, :] + dq[:, None]
    ok = col_ok[:, None] & (pix < HW)[None, :] & (src >= 0) & (src < HW) & (qs >= 0) & (qs < W)
    return tl.load(ptr + row0.to(tl.int64)[:, None] * HW + src, mask=ok, other=0.0)



_SHIFT_SIZES = ["N_IMG", "H", "W"]


@triton.jit(do_not_specialize=_SHIFT_SIZES)
def _shift_wgrad_kernel(
        dy_ptr, x_ptr, dw_ptr,
        N_IMG, C_OUT, C_IN, H, W, KH, KW, PH, PW, WP, HP,
        stride_ws, stride_wo, stride_wc, stride_wi, stride_wj, lo_dy, lo_x,
        PRESPLIT: tl.constexpr, USE_TMA: tl.constexpr,
        ONE_TAP: tl.constexpr, X_TMA: tl.constexpr, INPUT_PRECISION: tl.constexpr,
        DOT_FP32: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # dw[s, o, c, i, j] = sum over the pixels of split s of dy[n, o, pix] * x[n, c, pix + (i -
    # PH)*W + j - PW] (wrap-tested in x's load mask). dy [N, Co, H*W] and x [N, C, H*W] contiguous.
    # One program: a [BLOCK_M out channels, BLOCK_N columns] tile of split s, the columns a block
    # of the flat (tap, channel) axis of length KH*KW*C, the pixels (the GEMM's K) in steps of
    # BLOCK_K within one image; split s takes an even share of the (image, step) units. Both
    # operands are K-major. ONE_TAP: a tile's columns are channels of one tap, so x's tile is one
    # shifted rectangle with a per-pixel mask; else (few channels: MNIST's conv1 has one) a tile
    # spans several taps, each row shifted by its own tap with a per-element mask, and one dy tile
    # serves them all. Rows of a one-tap tile past the channel count read the next image's
    # channels: they only reach columns never stored.
    # X_TMA (one-tap tiles, with USE_TMA): x comes as KW planes shifted by each kernel column
    # (_shifted_planes: [KW, N*C, HP, WP], zero where the shift leaves a row, PH zero rows above,
    # pitch WP), and dy on the same pitch ([N*Co, H*WP]), so that tap (i, j) of the pixels
    # p = h*WP + q is row (j*N + n)*C + c at p + i*WP: one TMA rectangle at a 16-byte aligned
    # column, no mask (the zeros are in memory). Without X_TMA, WP = W.
    # PRESPLIT: dy and x are TF32 heads with tails lo_dy / lo_x elements on (tf32.split_tf32), three
    # TF32 products per step as implicit_gemm's _conv_wgrad_kernel.
    pid = tl.program_id(0)
    split = tl.program_id(1)
    COLS = KH * KW * C_IN
    if ONE_TAP:
        ch_blocks = tl.cdiv(C_IN, BLOCK_N)
        tiles_n = KH * KW * ch_blocks
    else:
        tiles_n = tl.cdiv(COLS, BLOCK_N)
    pid_m = pid // tiles_n
    pid_n = pid - pid_m * tiles_n
    o0 = pid_m * BLOCK_M
    if ONE_TAP:
        tap = pid_n // ch_blocks
        i = tap // KW
        j = tap - i * KW
        c0 = (pid_n - tap * ch_blocks) * BLOCK_N
        ch = c0 + tl.arange(0, BLOCK_N)
        col_ok = ch < C_IN
        shift = (i - PH) * W + (j - PW)
        dw_ = j - PW
    else:
        col = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = col < COLS
        tap = col // C_IN
        ch = col - tap * C_IN
        i = tap // KW
        j = tap - i * KW
        shifts = (i - PH) * W + (j - PW)
        dqs = j - PW
    HW = H * WP  # dy's plane
    if USE_TMA:
        dy_desc = tl.make_tensor_descriptor(dy_ptr, shape=[N_IMG * C_OUT, HW], strides=[HW, 1],
                                            block_shape=[BLOCK_M, BLOCK_K])
        if PRESPLIT:
            dy_lo_desc = tl.make_tensor_descriptor(dy_ptr + lo_dy, shape=[N_IMG * C_OUT, HW],
                                                   strides=[HW, 1],
                                                   block_shape=[BLOCK_M, BLOCK_K])
    if X_TMA:
        x_desc = tl.make_tensor_descriptor(x_ptr, shape=[KW * N_IMG * C_IN, HP * WP],
                                           strides=[HP * WP, 1], block_shape=[BLOCK_N, BLOCK_K])
        if PRESPLIT:
            x_lo_desc = tl.make_tensor_descriptor(x_ptr + lo_x, shape=[KW * N_IMG * C_IN, HP * WP],
                                                  strides=[HP * WP, 1],
                                                  block_shape=[BLOCK_N, BLOCK_K])
    blocks = tl.cdiv(HW, BLOCK_K)
    u_lo, u_hi = split_share(N_IMG * blocks)
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for u in range(u_lo, u_hi):
        n = u // blocks
        pix0 = (u - n * blocks) * BLOCK_K
        row_a = n * C_OUT + o0
        if USE_TMA:
            a = dy_desc.load([row_a, pix0])
        else:
            a = _flat_tile(dy_ptr, row_a, pix0, True, N_IMG * C_OUT, HW, BLOCK_M, BLOCK_K)
        if X_TMA:
            b = x_desc.load([(j * N_IMG + n) * C_IN + c0, pix0 + i * WP])
        elif ONE_TAP:
            q = (pix0 + offs_k) % W
            keep = (q + dw_ >= 0) & (q + dw_ < W) & (pix0 + offs_k < HW)
            b = _flat_tile(x_ptr, n * C_IN + c0, pix0 + shift, keep, N_IMG * C_IN, HW,
                           BLOCK_N, BLOCK_K)
        else:
            b = _shifted_taps_tile(x_ptr, n * C_IN + ch, pix0, shifts, dqs, C_IN, HW, W, col_ok,
                                   BLOCK_N, BLOCK_K)
        if PRESPLIT:
            if USE_TMA:
                a_lo = dy_lo_desc.load([row_a, pix0])
            else:
                a_lo = _flat_tile(dy_ptr + lo_dy, row_a, pix0, True, N_IMG * C_OUT, HW,
                                  BLOCK_M, BLOCK_K)
            if X_TMA:
                b_lo = x_lo_desc.load([(j * N_IMG + n) * C_IN + c0, pix0 + i * WP])
            elif ONE_TAP:
                b_lo = _flat_tile(x_ptr + lo_x, n * C_IN + c0, pix0 + shift, keep, N_IMG * C_IN,
                                  HW, BLOCK_N, BLOCK_K)
            else:
                b_lo = _shifted_taps_tile(x_ptr + lo_x, n * C_IN + ch, pix0, shifts, dqs, C_IN,
                                          HW, W, col_ok, BLOCK_N, BLOCK_K)
            # NOTE: as implicit_gemm's, a step's products start from zero and join acc by a
            # float32 add (chained onto acc, the tensor cores' accumulation loses accuracy)
            step = tl.dot(a, b.T, input_precision="tf32")
            step = tl.dot(a_lo, b.T, acc=step, input_precision="tf32")
            step = tl.dot(a, b_lo.T, acc=step, input_precision="tf32")
            acc += step
        else:
            if DOT_FP32:
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            acc = tl.dot(a, b.T, acc=acc, input_precision=INPUT_PRECISION)

    offs_m = o0 + tl.arange(0, BLOCK_M)
    m_ok = offs_m < C_OUT
    dw_ptrs = dw_ptr + split.to(tl.int64) * stride_ws + offs_m[:, None] * stride_wo + \
        (ch * stride_wc + i * stride_wi + j * stride_wj)[None, :]
    tl.store(dw_ptrs, acc.to(dw_ptr.dtype.element_ty), mask=m_ok[:, None] & col_ok[None, :])


# The batch-inner weight gradient (float32, Hopper): stride-1, undilated, "same"-size layers


@triton.jit
def _shifted_planes_kernel(src_ptr, out_ptr, ROWS, NC, C, H, W, HP, WP, TOP, LEFT, lo,
                           stride_sn, stride_sc, stride_sh, stride_sw,
                           SPLIT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_W: tl.constexpr):
    # out[j, n*C + c, r, q] = src[n, c, r - TOP, q + j - LEFT] where that is inside src and
    # q < W, zero elsewhere: src [N, C, H, W] (any strides) to contiguous [KW, N*C, HP, WP]
    # planes, one per kernel column j (ROWS = KW*N*C*HP rows of WP). SPLIT (float32): TF32
    # heads, and their tails lo elements further on (tf32.store_split).
    # One program: BLOCK_R rows of BLOCK_W >= WP columns.
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    q = tl.arange(0, BLOCK_W)
    plane = rows // HP
    h = rows - plane * HP - TOP
    j = plane // NC
    nc = plane - j * NC
    n = nc // C
    w = q[None, :] + (j - LEFT)[:, None]
    ok = (rows < ROWS)[:, None] & (q < WP)[None, :]
    inside = ok & ((h >= 0) & (h < H))[:, None] & (q < W)[None, :] & (w >= 0) & (w < W)
    v = tl.load(src_ptr + (n.to(tl.int64) * stride_sn + (nc - n * C) * stride_sc +
                           h * stride_sh)[:, None] + w * stride_sw, mask=inside, other=0.0)
    store_split(out_ptr + rows.to(tl.int64)[:, None] * WP + q[None, :], v, lo, ok, SPLIT)



# _shift_wgrad_kernel: (K step in pixels, warps, stages), best first by the H100 sweep of
# 2026-11-24 (benchmarks/sweep_conv.py --shift; tiles of 128x128 and up run with 8 warps).
SHIFT_WGRAD_MENU = {
    "ieee": [(16, 4, 2), (32, 4, 2)],
    "tf32": [(64, 4, 3), (32, 4, 3), (16, 4, 4)],
    "tf32x3": [(32, 4, 3), (32, 8, 3), (16, 4, 3), (64, 4, 3)],  # (64: the batch-inner form's
    "half": [(128, 4, 3), (64, 8, 3), (64, 4, 3)],                # best at MNIST conv2, H200)
}



def configs(block_m, block_n, kind):
    """Configs for _shift_wgrad_kernel: the tile is fixed by the channel counts; the K step in
    pixels, warps and stages are tuned (8 warps first for tiles of 128x128 and up)."""
    if INTERPRET:
        return [triton.Config({"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": 32},
                              num_warps=4, num_stages=1)]
    menu = SHIFT_WGRAD_MENU[kind]
    if block_m * block_n >= 128 * 128:
        menu = [(bk, max(warps, 8), stages) for bk, warps, stages in menu]
    configs = {}
    for bk, warps, stages in menu:
        configs[bk, warps, stages] = triton.Config(
            {"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": bk}, num_warps=warps,
            num_stages=stages)
    return list(configs.values())


def applies(g, dy, x, s):
    """Whether the weight gradient of one group of convolution g runs here (module
    docstring)."""
    if not (s.flat_shift and g.groups == 1 and (g.sh, g.sw, g.dh, g.dw) == (1, 1, 1, 1) and
            (g.oh, g.ow) == (g.h, g.w) and g.c >= s.shift_min_channels and
            dy.is_contiguous() and x.is_contiguous()):
        return False
    return INTERPRET or uses_tma(g, dy, s)


def uses_tma(g, dy, s):
    """Whether dy's tiles come through TMA: Settings.shift_tma on a GPU whose TMA reads any
    row (Hopper), dy and its planes 16-byte aligned; never under the interpreter."""
    if INTERPRET:
        return False
    return s.shift_tma and tma_capable(dy.device) and dy.data_ptr() % 16 == 0 and \
        g.h * g.w * dy.element_size() % 16 == 0


def _use_shifted_planes(g, x, presplit, s):
    """Whether the flat-shift weight gradient (one-tap tiles, dy through TMA) reads x as
    shifted planes (shifted_planes): s.shift_planes, float32 (half types take the window
    form), planes of at most s.shift_planes_max_pixels, 3xTF32 or at least
    s.shift_planes_min_channels channels, the planes' memory at most s.shift_planes_max_bytes.

    The rule is the H100 sweep's (benchmarks/sweep_conv.py --shift, 2026-11-24; ms, masked
    loads -> planes): 14x14 k3 at 256 channels 0.614 -> 0.553 (TF32), 1.356 -> 1.052
    (3xTF32); MNIST conv2 3xTF32 0.110 -> 0.098, TF32 0.061 -> 0.064 (32 channels: x's tile
    is the small one); 28x28 and 56x56 TF32 0.50 -> 0.74 and 0.67 -> 1.20: kw copies of a
    large plane cost more than the masks they save."""
    size = g.kw * g.n * g.c * (g.h + g.kh - 1) * round_up(g.w, 4) * 4 * (1 + int(presplit))
    return s.shift_planes and x.dtype == torch.float32 and \
        (presplit or g.c >= s.shift_planes_min_channels) and \
        g.h * g.w <= s.shift_planes_max_pixels and size <= s.shift_planes_max_bytes


def shifted_planes(t, kw, top, left, hp, wp, split):
    """t [N, C, H, W] (any strides) as kw planes [N*C, hp, wp], plane j shifted left by
    j - left columns and down by top rows, zero where that leaves t or past column W
    (_shifted_planes_kernel). Returns (the contiguous [kw, N*C, hp, wp] buffer, the elements
    from it to the tails: split (float32) makes it TF32 heads, tails one buffer further on)."""
    n, c, h, w = t.shape
    out = empty((1 + int(split), kw, n * c, hp, wp), t.dtype, t.device)
    rows = kw * n * c * hp
    if rows:
        block_w = next_power_of_2(wp)
        block_r = max(1, (4096 if not INTERPRET else 16384) // block_w)
        run(_shifted_planes_kernel, (cdiv(rows, block_r),), t, out, rows, n * c, c, h, w, hp,
            wp, top, left, out[0].numel(), *t.stride(), SPLIT=split, BLOCK_R=block_r,
            BLOCK_W=block_w, num_warps=4)
    return out, out[0].numel()



def weight_grad(dy, x, part, g, tiling, splits, dot, presplit, s):
    """Launch _shift_wgrad_kernel for one group: part [splits, Co, C, kh, kw] (float32 partials,
    or dw itself with one split) of dy [N, Co, H, W] and x [N, C, H, W], contiguous. tiling:
    (BLOCK_M, BLOCK_N, tiles, one_tap) (weight_grad.py: one-tap tiles from
    Settings.shift_taps_below channels); presplit: 3xTF32 from heads and tails written first
    (with x's shifted planes where _use_shifted_planes says so)."""
    block_m, block_n, tiles, one_tap = tiling
    co, c = dy.shape[1], x.shape[1]
    kind = menu_kind(dot, x.dtype)
    use_tma = uses_tma(g, dy, s)
    planes = use_tma and one_tap and _use_shifted_planes(g, x, presplit, s)
    lo_dy = lo_x = 0
    wp, hp = g.w, g.h
    if planes:  # x as KW shifted planes of pitch wp (and dy on that pitch): every tile TMA
        wp, hp = round_up(g.w, 4), g.h + g.kh - 1
        x, lo_x = shifted_planes(x, g.kw, g.ph, g.pw, hp, wp, presplit)
        if wp != g.w or presplit:
            dy, lo_dy = shifted_planes(dy, 1, 0, 0, g.h, wp, presplit)
    elif presplit:  # heads and tails: one memory-bound pass over each operand
        dy, lo_dy = split_tf32(dy), dy.numel()
        x, lo_x = split_tf32(x), x.numel()
    key = (f"shiftw:{g.n}x{co}x{c}:{g.h}x{g.w}:k{g.kh}x{g.kw}:{dot}"
           f"{'-split' if presplit else ''}:{kind}:{str(x.dtype)[6:]}:split{splits}:"
           f"{'tma' if use_tma else 'ptr'}{'-planes' if planes else ''}:cols{block_n}")
    run_tuned(_shift_wgrad_kernel, configs(block_m, block_n, kind), key,
              lambda meta: (tiles, splits), (
        dy, x, part, g.n, co, c, g.h, g.w, g.kh, g.kw, g.ph, g.pw, wp, hp, *part.stride(),
        lo_dy, lo_x),
        dict(PRESPLIT=presplit, USE_TMA=use_tma,
             ONE_TAP=one_tap, X_TMA=planes, INPUT_PRECISION="tf32" if presplit else dot,
             DOT_FP32=dot_fp32(x.dtype)), x.device)

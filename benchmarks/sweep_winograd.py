"""Measure Winograd F(4x4, 3x3) for the float32-accuracy forward of ResNet-style 3x3 layers
against cuDNN's IEEE float32 and tritonad's convolution, same run (issue 16: "exact fp32 >= 1.0
vs cuDNN"). A measurement, not a tritonad path yet. Not part of `tritonad bench`.

    python benchmarks/sweep_winograd.py [--layers 14x14,28x28,56x56] [--out DIR]

Unfused, three steps, each timed:
- input transform: each 6x6 input window (stride 4, padding 1) of every channel into its
  36 transformed values, U [36, tiles, C] (a Triton kernel);
- 36 products M[e] = U[e] @ V[e]^T through tritonad's matmul at float32 accuracy (3xTF32),
  V [36, Co, C] the transformed weights (torch, float64; timed apart: a kernel's job later);
- output transform: 36 values of M per tile and output channel into its 4x4 outputs, plus the
  bias, stored 4 consecutive pixels a thread (a Triton kernel).
Y = A^T [(G g G^T) * (B^T d B)] A with Lavin and Gray's matrices (points 0, +-1, +-2): 36
products per 16 outputs, a quarter of direct convolution's multiply-adds, for values that
pass through transforms with coefficients up to 8 (error: relative norm against float64).

The kernels' bodies are the transforms written out (36 values a tile, no loops over
registers), generated here as text and imported from a temporary module.
"""
from __future__ import annotations

import importlib.util
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

BT = [[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0], [0, -2, -1, 2, 1, 0],
      [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]]
G = [[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6], [1 / 24, 1 / 12, 1 / 6],
     [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]]
AT = [[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]]
# name: (batch, channels, height = width, output channels)
LAYERS = {"56x56": (256, 64, 56, 64), "28x28": (256, 128, 28, 128),
          "14x14": (256, 256, 14, 256), "odd": (3, 40, 13, 24)}
BLOCK = 32  # tiles x channels a program, both transforms (64x16 and 32x64 spilled)


def _combination(coefs, names):
    """'4.0 * d0 - 5.0 * d2 + d4' for coefs [4, 0, -5, 0, 1, 0]."""
    text = ""
    for c, name in zip(coefs, names):
        if c:
            sign = "-" if c < 0 else "+"
            text += f" {sign} " + (name if abs(c) == 1 else f"{float(abs(c))} * {name}")
    return text[3:] if text.startswith(" + ") else "-" + text[3:]


def _source():
    """The two transform kernels as Python source."""
    lines = ["import triton", "import triton.language as tl", "", "",
             "@triton.jit",
             "def input_kernel(x_ptr, u_ptr, C, H, W, TH, TW, P,",
             "                 BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):",
             "    # U[e, p, c] = (B^T d B)[e] for tile p's 6x6 window d of channel c",
             "    p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)",
             "    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)",
             "    n = p // (TH * TW)",
             "    th = (p - n * (TH * TW)) // TW",
             "    tw = p - n * (TH * TW) - th * TW",
             "    h0 = th * 4 - 1",
             "    w0 = tw * 4 - 1",
             "    base = x_ptr + (n.to(tl.int64) * C * H * W)[:, None] + "
             "(c.to(tl.int64) * H * W)[None, :]",
             "    p_ok = p < P",
             "    c_ok = c < C"]
    for j in range(6):
        lines.append(f"    w_ok{j} = (w0 + {j} >= 0) & (w0 + {j} < W)")
    for i in range(6):
        lines += [f"    h = h0 + {i}", "    h_ok = p_ok & (h >= 0) & (h < H)"]
        for j in range(6):
            lines.append(f"    d{j} = tl.load(base + (h * W + w0 + {j})[:, None], "
                         f"mask=(h_ok & w_ok{j})[:, None] & c_ok[None, :], other=0.0)")
        for k in range(6):  # t[i][k] = sum_j d[i][j] B^T[k][j]
            lines.append(f"    t{i}{k} = {_combination(BT[k], [f'd{j}' for j in range(6)])}")
    lines += ["    out = u_ptr + (p.to(tl.int64) * C)[:, None] + c[None, :]",
              "    ok = p_ok[:, None] & c_ok[None, :]",
              "    plane = P.to(tl.int64) * C"]
    for k in range(6):
        for m in range(6):  # u[k][m] = sum_i B^T[k][i] t[i][m]
            value = _combination(BT[k], [f"t{i}{m}" for i in range(6)])
            lines.append(f"    tl.store(out + {k * 6 + m} * plane, {value}, mask=ok)")
    lines += ["", "",
              "@triton.jit",
              "def output_kernel(m_ptr, y_ptr, b_ptr, K, H, W, TH, TW, P,",
              "                  BLOCK_P: tl.constexpr, BLOCK_K: tl.constexpr):",
              "    # y[n, k, 4th + i, 4tw + j] = bias[k] + (A^T m A)[i, j], m = M[:, p, k]",
              "    p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)",
              "    k = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)",
              "    p_ok = p < P",
              "    k_ok = k < K",
              "    ok = p_ok[:, None] & k_ok[None, :]",
              "    src = m_ptr + (p.to(tl.int64) * K)[:, None] + k[None, :]",
              "    plane = P.to(tl.int64) * K"]
    for a in range(6):
        for b in range(6):
            lines.append(f"    m{b} = tl.load(src + {a * 6 + b} * plane, mask=ok, other=0.0)")
        for j in range(4):  # s[a][j] = sum_b m[a][b] A^T[j][b]
            lines.append(f"    s{a}{j} = {_combination(AT[j], [f'm{b}' for b in range(6)])}")
    lines += ["    bias = tl.load(b_ptr + k, mask=k_ok, other=0.0)[None, :]",
              "    n = p // (TH * TW)",
              "    th = (p - n * (TH * TW)) // TW",
              "    tw = p - n * (TH * TW) - th * TW",
              "    base = y_ptr + (n.to(tl.int64) * K * H * W)[:, None] + "
              "(k.to(tl.int64) * H * W)[None, :]",
              "    j = tl.arange(0, 4)",
              "    col = tw * 4"]
    for i in range(4):
        for j in range(4):  # y[i][j] = sum_a A^T[i][a] s[a][j]
            lines.append(f"    v{j} = {_combination(AT[i], [f's{a}{j}' for a in range(6)])}"
                         " + bias")
        lines += [
            "    # a row's 4 outputs side by side: one 16-byte store a thread (4 stores of",
            "    # every 4th pixel took 2-3x as long)",
            "    v = tl.join(tl.join(v0, v2), tl.join(v1, v3)).reshape(BLOCK_P, BLOCK_K, 4)",
            f"    row = th * 4 + {i}",
            "    ptrs = (base + (row * W + col)[:, None])[:, :, None] + j[None, None, :]",
            "    keep = (ok & (row < H)[:, None])[:, :, None] & "
            "((col[:, None, None] + j[None, None, :]) < W)",
            "    tl.store(ptrs, v, mask=keep)"]
    return "\n".join(lines) + "\n"


def _kernels():
    """The generated kernels, imported from a temporary module (triton.jit reads the source)."""
    path = os.path.join(tempfile.mkdtemp(prefix="winograd-"), "winograd_kernels.py")
    with open(path, "w") as f:
        f.write(_source())
    spec = importlib.util.spec_from_file_location("winograd_kernels", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def transformed_weights(w):
    """V [36, Co, C] = G g G^T of each 3x3 filter g (float64, rounded once)."""
    g = torch.tensor(G, dtype=torch.float64, device=w.device)
    v = torch.einsum("ai,kcij,bj->abkc", g, w.double(), g)
    return v.reshape(36, w.shape[0], w.shape[1]).float().contiguous()


def winograd_conv(kernels, x, v, bias, stop=None):
    """y = conv2d(x, w, bias, padding=1) from V = transformed_weights(w); stop "input" or "gemm"
    returns after that step (for timing the steps)."""
    import triton

    from tritonad.kernels import matmul as mm

    n, c, h, w = x.shape
    k = v.shape[1]
    th, tw = triton.cdiv(h, 4), triton.cdiv(w, 4)
    tiles = n * th * tw
    u = torch.empty((36, tiles, c), device=x.device)
    kernels.input_kernel[(triton.cdiv(tiles, BLOCK), triton.cdiv(c, BLOCK))](
        x, u, c, h, w, th, tw, tiles, BLOCK_P=BLOCK, BLOCK_C=BLOCK, num_warps=4)
    if stop == "input":
        return u
    m = mm.matmul(u, v.transpose(1, 2), precision="highest")
    if stop == "gemm":
        return m
    y = torch.empty((n, k, h, w), device=x.device)
    kernels.output_kernel[(triton.cdiv(tiles, BLOCK), triton.cdiv(k, BLOCK))](
        m, y, bias, k, h, w, th, tw, tiles, BLOCK_P=BLOCK, BLOCK_K=BLOCK, num_warps=4)
    return y


def run_layer(kernels, name):
    from tritonad.kernels import conv
    from tritonad.kernels import matmul as mm

    n, c, hw, k = LAYERS[name]
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.rand((n, c, hw, hw), device="cuda", generator=gen) * 2 - 1
    w = (torch.rand((k, c, 3, 3), device="cuda", generator=gen) * 2 - 1) / (c * 9) ** 0.5
    b = torch.rand(k, device="cuda", generator=gen)
    want = torch.nn.functional.conv2d(x.double(), w.double(), b.double(), 1, 1)

    def error(y):
        return ((y.double() - want).norm() / want.norm()).item()

    v = transformed_weights(w)
    ours = lambda: conv.conv2d(x, w, b, (1, 1), (1, 1), (1, 1))  # noqa: E731
    cudnn = lambda: torch.nn.functional.conv2d(x, w, b, 1, 1)  # noqa: E731
    row = dict(layer=name, shape=f"{n}x{c}x{hw}x{hw}->{k}",
               err_winograd=error(winograd_conv(kernels, x, v, b)), err_ours=error(ours()),
               err_cudnn=error(cudnn()))
    row["ms_cudnn"], row["ms_ours"] = common.bench(cudnn), common.bench(ours)
    steps = [common.bench(lambda: winograd_conv(kernels, x, v, b, stop)) for stop in
             ("input", "gemm", None)]
    row["ms_winograd"] = steps[2]
    row.update(ms_input=steps[0], ms_gemm=steps[1] - steps[0], ms_output=steps[2] - steps[1],
               ms_weights=common.bench(lambda: transformed_weights(w)),
               gemm_plan=mm.describe(mm.tuner.last[1]) if mm.tuner.last else "?",
               ratio_ours=row["ms_cudnn"] / row["ms_ours"],
               ratio_winograd=row["ms_cudnn"] / row["ms_winograd"])
    return row


def main(argv=None):
    def extra(parser):
        parser.add_argument("--layers", default="odd,14x14,28x28,56x56")

    args = common.parse_args(__doc__.splitlines()[0], argv, extra)
    common.require_gpu("sweep_winograd")
    import tritonad as td

    td.autotune(True)  # the 36 products: a new shape each, timed over the matmul's menu
    td.set_conv_precision("highest")
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    kernels = _kernels()
    rows = []
    for name in args.layers.split(","):
        rows.append(run_layer(kernels, name))
        r = rows[-1]
        print(f"{name}: cuDNN {r['ms_cudnn'] * 1e3:.0f} us, ours {r['ms_ours'] * 1e3:.0f} "
              f"({r['ratio_ours']:.2f}x), Winograd {r['ms_winograd'] * 1e3:.0f} "
              f"({r['ratio_winograd']:.2f}x: input {r['ms_input'] * 1e3:.0f}, products "
              f"{r['ms_gemm'] * 1e3:.0f} [{r['gemm_plan']}], output {r['ms_output'] * 1e3:.0f};"
              f" weights apart {r['ms_weights'] * 1e3:.0f}); error {r['err_winograd']:.1e} "
              f"(ours {r['err_ours']:.1e}, cuDNN {r['err_cudnn']:.1e})", flush=True)
    print(f"results: {common.save(args.out, 'sweep_winograd', rows)}")


if __name__ == "__main__":
    main()

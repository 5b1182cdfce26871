"""Sweep the implicit-GEMM convolution kernels: operand layouts and tile configs, against cuDNN.

For each layer, precision (fp32 = float32 accuracy: ours 3xTF32, or IEEE FMA with
TRITONAD_CONV_IEEE=1, cuDNN with TF32 off; tf32 = TF32 on both sides),
direction (fwd; dx = input gradient; dw = weight + bias gradient) and layout variant of the
implicit path, every config of a wide menu is timed by Triton's autotuner (its per-config
timings are read back); the launcher as the library calls it (with its weight-packing /
channels-last copies and split-K sum) is then timed beside cuDNN in the same run. Layout
variants (fields of tritonad.kernels.conv.Settings):

    nchw      pack_weights=False channels_last=False  gathers and weights read in place
    packed    pack_weights=True  channels_last=False  weights copied K-major (the default)
    nhwc      pack_weights=True  channels_last=True   the gathered source copied to NHWC too

The whole run keeps within --budget seconds (compilation dominates): the most important items
come first, later ones are skipped with a note when the budget is spent. Used to choose the
config menus (conv.implicit_gemm.GEMM_MENU / WGRAD_MENU) and the layout defaults; not part of
`tritonad bench`.

    python benchmarks/sweep_conv.py --out DIR [--budget 330] [--quick] [--precisions fp32]

--window times the window GEMM (the padded channels-last TMA forward and input gradient,
Settings.window_gemm) config by config against the implicit-GEMM kernel and cuDNN; --shift the
flat-shift weight gradient the same way (--precisions among tf32, fp32, bf16, fp16).

--wgrad sweeps the weight gradient alone, at the MNIST and the ResNet-style layers: for each
layer, precision, operand handling at fp32 (presplit: heads and tails split in a memory pass,
Settings.dw_presplit; x3dot: tl.dot's "tf32x3"), split-K count (the heuristic's, half, double)
and config of wgrad_space(), the launcher (split pass, kernel, split sum) beside cuDNN's
weight + bias gradient; every kernel is compiled first, in parallel (compile_ahead).
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

# name: (input shape, C_out, kernel, padding)
LAYERS = {"conv1": ((100, 1, 28, 28), 32, 5, 2), "conv2": ((100, 32, 14, 14), 64, 5, 2),
          "56x56-k3": ((256, 64, 56, 56), 64, 3, 1), "28x28-k3": ((256, 128, 28, 28), 128, 3, 1),
          "14x14-k3": ((256, 256, 14, 14), 256, 3, 1)}
VARIANTS = {"nchw": (False, False), "packed": (True, False), "nhwc": (True, True)}


def _knobs(**changes):
    """Set fields of conv's settings (conv.Settings) for the rest of the sweep."""
    from tritonad.kernels import conv
    conv.set_settings(dataclasses.replace(conv.current_settings(), **changes))


def _fresh_tuner(name):
    """A tuner without a cache for conv's launchers: every config of an item is timed here."""
    from tritonad.kernels.conv import common as conv_common
    from tritonad.kernels.tuning import Tuner
    conv_common.tuner = Tuner(name)
    conv_common.tuner.path = lambda: "/dev/null/none"
    return conv_common.tuner


def gemm_space():
    """(BLOCK_M pixels, BLOCK_K, warps, stages) per kind: wider than implicit_gemm.GEMM_MENU (a
    BLOCK_K above the channel count is clamped, duplicates dropped)."""
    return {"ieee": [(32, 16, 4, 2), (64, 16, 4, 2), (64, 32, 4, 2), (128, 16, 4, 2),
                     (128, 16, 8, 2), (128, 32, 8, 2), (256, 16, 8, 2), (128, 16, 4, 1)],
            "tf32": [(64, 32, 4, 3), (64, 32, 4, 4), (128, 32, 4, 3), (128, 32, 4, 4),
                     (128, 32, 8, 3), (256, 32, 8, 3), (128, 64, 8, 3), (64, 64, 4, 3)],
            "tf32x3": [(64, 32, 4, 3), (64, 32, 4, 2), (32, 32, 4, 2), (128, 32, 8, 3),
                       (128, 32, 8, 2), (64, 16, 4, 2), (128, 16, 4, 2), (64, 32, 8, 3)]}


def wgrad_space():
    """(BLOCK_K pixels, warps, stages) per kind: wider than implicit_gemm.WGRAD_MENU."""
    return {"ieee": [(16, 4, 2), (32, 4, 2), (32, 8, 2), (64, 8, 2), (16, 4, 1), (32, 4, 3)],
            "tf32": [(32, 4, 3), (32, 4, 4), (64, 4, 3), (64, 8, 3), (64, 8, 4), (128, 8, 3),
                     (128, 4, 2)],
            "tf32x3": [(32, 4, 3), (32, 4, 2), (16, 4, 2), (32, 8, 2), (64, 8, 3), (64, 8, 2),
                       (16, 2, 2), (64, 4, 2)]}


def wgrad_grid():
    """(BLOCK_K pixels, warps, stages) per kind for --wgrad (the pre-split 3xTF32 kernel streams
    four tiles per step: its stages cost twice the shared memory of a TF32 one)."""
    return {"tf32": [(32, 4, 3), (32, 4, 4), (64, 4, 3), (32, 8, 3), (64, 8, 3), (32, 8, 4),
                     (16, 4, 3), (16, 8, 4)],
            "tf32x3": [(32, 8, 3), (16, 4, 3), (32, 4, 3), (16, 8, 3), (32, 8, 2), (16, 8, 4),
                       (64, 8, 2)]}


def wgrad_main(args):
    """The --wgrad sweep (module docstring); prints one line per item, the best per layer."""
    from tritonad.kernels import conv
    from tritonad.kernels.conv import implicit_gemm, weight_grad
    from tritonad.kernels.plans import clear_plans, compile_ahead

    import tritonad as td
    td.autotune(False)
    start_all = time.perf_counter()
    layers = args.layers.split(",") if args.layers else list(LAYERS)
    items = []  # (layer, precision, presplit, split factor, config)
    for layer in layers:
        for precision in args.precisions.split(","):
            for presplit in ((True, False) if precision == "fp32" else (False,)):
                grid = wgrad_grid()["tf32x3" if precision == "fp32" else "tf32"]
                if precision == "fp32" and not presplit:
                    grid = [implicit_gemm.WGRAD_MENU["tf32x3"][0], (32, 4, 2)]
                for factor in (1.0, 0.5, 2.0):
                    items += [(layer, precision, presplit, factor, cfg) for cfg in grid]

    def setup(layer, precision, presplit, factor, cfg):
        _set_precision(precision)
        _knobs(pack_weights=True, channels_last=False, algo="implicit", dw_presplit=presplit,
               dw_split=None)
        kind = conv.menu_kind(conv.dot_precision(torch.float32, conv.call_precision()),
                              torch.float32)
        implicit_gemm.WGRAD_MENU = dict(implicit_gemm.WGRAD_MENU, **{kind: [cfg]})
        (n, c, h, w), co, k, pad = LAYERS[layer]
        _, _, tiles, _ = weight_grad.tiling("implicit", conv.Geometry(
            "sweep", (n, c, h, w), (co, c, k, k), 1, pad, 1, 1), c, co, conv.current_settings())
        base = weight_grad.splits_for(tiles, n * h * w, torch.device("cuda"),
                                      conv.current_settings())
        _knobs(dw_split=max(1, round(base * factor)))
        _fresh_tuner("conv-sweep")
        clear_plans()
        return conv.current_settings().dw_split

    problems = {layer: _problem(*LAYERS[layer]) for layer in layers}
    with compile_ahead():  # every kernel of every item, in parallel
        for item in items:
            setup(*item)
            x, w, b, dy = problems[item[0]]
            _cases(conv, x, w, b, dy, LAYERS[item[0]][3])["dw"][0]()
    torch.cuda.synchronize()
    print(f"compiled {len(items)} items in {time.perf_counter() - start_all:.0f} s", flush=True)
    rows, cudnn = [], {}
    for item in items:
        if time.perf_counter() - start_all > args.budget:
            print(f"budget spent: skipped from {item}")
            break
        layer, precision = item[0], item[1]
        splits = setup(*item)
        x, w, b, dy = problems[layer]
        ours, theirs = _cases(conv, x, w, b, dy, LAYERS[layer][3])["dw"]
        try:
            t_ours = common.bench(ours, warmup=10, rep=40)
        except Exception as err:  # noqa: BLE001 (out of shared memory, ...)
            print(f"{item}: {type(err).__name__}: {str(err)[:80]}")
            continue
        if (layer, precision) not in cudnn:
            cudnn[layer, precision] = common.bench(theirs)
        t_cudnn = cudnn[layer, precision]
        rows.append({"layer": layer, "precision": precision, "presplit": item[2],
                     "splits": splits, "config": item[4], "ours_ms": t_ours, "cudnn_ms": t_cudnn})
        how = "presplit" if item[2] else "x3dot" if precision == "fp32" else "tf32"
        print(f"{layer:9s} {precision} {how:8s} split {splits:4d} {item[4]}  ours {t_ours:.4f}  "
              f"cudnn {t_cudnn:.4f}  x{t_cudnn / t_ours:.2f}", flush=True)
    print("\nbest per layer and precision (x = cuDNN ms / ours ms)")
    for (layer, precision), t_cudnn in cudnn.items():
        for presplit in (True, False):
            sel = [r for r in rows if r["layer"] == layer and r["precision"] == precision
                   and r["presplit"] == presplit]
            if sel:
                r = min(sel, key=lambda r: r["ours_ms"])
                print(f"{layer:9s} {precision} presplit={presplit!s:5s} split {r['splits']:4d} "
                      f"{r['config']}  ours {r['ours_ms']:.4f} cudnn {t_cudnn:.4f} "
                      f"x{t_cudnn / r['ours_ms']:.2f}")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "sweep_wgrad.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print(f"\ntotal {time.perf_counter() - start_all:.0f} s")


def shift_space():
    """_shift_wgrad_kernel's configs per kind, (BLOCK_K pixels, warps, stages): wider than
    flat_shift.SHIFT_WGRAD_MENU."""
    return {"tf32": [(32, 4, 3), (64, 4, 3), (32, 8, 4), (64, 8, 3), (16, 4, 4)],
            "tf32x3": [(32, 4, 3), (16, 4, 3), (32, 8, 3), (64, 8, 2), (16, 8, 4)],
            "half": [(64, 4, 3), (32, 4, 4), (128, 8, 3), (64, 8, 3), (128, 4, 3)]}


def shift_main(args):
    """--shift: the flat-shift weight gradient (Settings.flat_shift) config by config against the
    implicit-GEMM weight gradient (its first plan: "previous"), the flat-shift kernel without
    TMA ("ptr"), with tiles whose columns span several taps at any channel count ("taps";
    Settings.shift_taps_below), with x's tiles as masked loads instead of TMA rectangles of the
    shifted planes ("masked"; Settings.shift_planes), and cuDNN, with each result's error against
    cuDNN's."""
    from tritonad.kernels import conv
    from tritonad.kernels.conv import flat_shift

    layers = args.layers.split(",") if args.layers else list(LAYERS)
    default_menu = dict(flat_shift.SHIFT_WGRAD_MENU)
    default_below = conv.current_settings().shift_taps_below
    variants = ("previous", "ptr", "taps", "masked")
    items = []  # (layer, precision, direction, config or one of the variants)
    for layer in layers:
        for precision in args.precisions.split(","):
            items += [(layer, precision, "dw", v) for v in variants]
            items += [(layer, precision, "dw", cfg) for cfg in shift_space()[_KINDS[precision]]]

    def setup(layer, precision, cfg):
        _knobs(flat_shift=cfg != "previous", shift_tma=cfg != "ptr",
               shift_taps_below=1 << 30 if cfg == "taps" else default_below,
               shift_planes=cfg != "masked",  # (the configs: planes wherever they fit)
               shift_planes_max_pixels=1 << 30, shift_planes_min_channels=0,
               window_wgrad=False, dw_split=None)
        flat_shift.SHIFT_WGRAD_MENU = default_menu
        if isinstance(cfg, tuple):
            flat_shift.SHIFT_WGRAD_MENU = dict(default_menu, **{_KINDS[precision]: [cfg]})

    _config_sweep(args, "shift", items, setup, variants)


def window_space():
    """_window_gemm_kernel's configs per kind, (BLOCK_M, BLOCK_N at most, BLOCK_K, warps,
    stages): wider than window.WINDOW_MENU."""
    return {"tf32": [(128, 128, 32, 8, 3), (256, 128, 32, 8, 3), (128, 128, 32, 4, 4),
                     (256, 128, 32, 8, 4), (128, 256, 32, 8, 3), (64, 128, 32, 4, 4),
                     (128, 64, 32, 4, 4)],
            "tf32x3": [(128, 128, 32, 8, 3), (128, 128, 16, 4, 4), (64, 128, 32, 4, 3),
                       (128, 128, 32, 8, 2), (128, 64, 32, 4, 3)],
            "half": [(128, 128, 64, 4, 3), (256, 128, 64, 8, 3), (128, 128, 64, 8, 3),
                     (128, 256, 64, 8, 3), (256, 128, 64, 8, 4), (128, 64, 64, 4, 4)]}


def window_main(args):
    """--window: the window GEMM (Settings.window_gemm) forward and input gradient, and in half
    precision its weight gradient (Settings.window_wgrad), config by config against the kernels
    they replace ("previous", their first plan) and cuDNN; at fp32 also with tl.dot's own
    "tf32x3" instead of pre-split operands ("x3dot", the menu's first config)."""
    from tritonad.kernels.conv import window

    layers = args.layers.split(",") if args.layers else [k for k in LAYERS if k != "conv1"]
    default_menu, default_wgrad = dict(window.WINDOW_MENU), list(window.WINDOW_WGRAD_MENU)
    items = []
    for layer in layers:
        for precision in args.precisions.split(","):
            for direction in ("fwd", "dx"):
                items += [(layer, precision, direction, v) for v in
                          ("previous",) + (("x3dot",) if precision == "fp32" else ())]
                items += [(layer, precision, direction, cfg)
                          for cfg in window_space()[_KINDS[precision]]]
            if precision in ("bf16", "fp16"):  # the weight gradient's window form
                items += [(layer, precision, "dw", cfg) for cfg in
                          ["previous"] + window_wgrad_space()]

    def setup(layer, precision, cfg):
        _knobs(window_gemm=cfg != "previous", window_wgrad=cfg != "previous",
               window_presplit=cfg != "x3dot", window_x3_min=0)
        window.WINDOW_MENU, window.WINDOW_WGRAD_MENU = default_menu, default_wgrad
        if isinstance(cfg, tuple) and len(cfg) == 3:
            window.WINDOW_WGRAD_MENU = [cfg]
        elif isinstance(cfg, tuple):
            window.WINDOW_MENU = dict(default_menu, **{_KINDS[precision]: [cfg]})

    _config_sweep(args, "window", items, setup, ("previous", "x3dot"))


def window_wgrad_space():
    """_window_wgrad_kernel's configs, (BLOCK_K pixels, warps, stages)."""
    return [(64, 4, 4), (128, 8, 3), (64, 8, 4), (128, 4, 3), (32, 4, 4), (128, 8, 4),
            (64, 4, 3)]


_KINDS = {"tf32": "tf32", "fp32": "tf32x3", "bf16": "half", "fp16": "half"}


def _config_sweep(args, name, items, setup, variants):
    """Time items (layer, precision, direction, config or a named variant) one by one: setup()
    sets the knobs for one, every kernel is compiled first (in parallel), then each is timed
    beside cuDNN (per layer, precision and direction) with its largest error relative to
    cuDNN's result. Prints a line per item and the best config per layer, precision and
    direction against the named variants; writes sweep_NAME.json."""
    from tritonad.kernels import conv
    from tritonad.kernels.plans import clear_plans, compile_ahead

    import tritonad as td
    td.autotune(False)
    start_all = time.perf_counter()
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16}
    problems = {}
    for layer in {item[0] for item in items}:
        base = _problem(*LAYERS[layer])
        problems[layer] = {p: tuple(t.to(dtypes.get(p, torch.float32)) for t in base)
                           for p in args.precisions.split(",")}

    def case(layer, precision, direction, cfg):
        _set_precision("tf32" if precision in dtypes else precision)
        setup(layer, precision, cfg)
        _fresh_tuner(f"conv-{name}")
        clear_plans()
        return _cases(conv, *problems[layer][precision], LAYERS[layer][3])[direction]

    with compile_ahead():
        for item in items:
            case(*item)[0]()
    torch.cuda.synchronize()
    print(f"compiled {len(items)} items in {time.perf_counter() - start_all:.0f} s", flush=True)
    rows, cudnn = [], {}
    for item in items:
        if time.perf_counter() - start_all > args.budget:
            print(f"budget spent: skipped from {item}")
            break
        layer, precision, direction, cfg = item
        ours, theirs = case(*item)
        try:
            got = ours()
            t_ours = common.bench(ours, warmup=10, rep=40)
        except Exception as err:  # noqa: BLE001 (out of shared memory, ...)
            print(f"{item}: {type(err).__name__}: {str(err)[:100]}", flush=True)
            continue
        if item[:3] not in cudnn:
            cudnn[item[:3]] = (common.bench(theirs), theirs())
        t_cudnn, want = cudnn[item[:3]]
        got = [g for g in (got if isinstance(got, tuple) else (got,)) if g is not None]
        want = [g for g in (want if isinstance(want, tuple) else (want,)) if g is not None]
        err = max(((a.float() - b.float()).abs().max() / b.float().abs().max()).item()
                  for a, b in zip(got, want))
        rows.append({"layer": layer, "precision": precision, "direction": direction,
                     "config": cfg, "ours_ms": t_ours, "cudnn_ms": t_cudnn, "err": err})
        print(f"{layer:9s} {precision} {direction:3s} {str(cfg):18s} ours {t_ours:.4f} cudnn "
              f"{t_cudnn:.4f} x{t_cudnn / t_ours:.2f} err {err:.1e}", flush=True)
    print("\nbest per layer, precision and direction (x = cuDNN ms / ours ms)")
    for (layer, precision, direction), (t_cudnn, _) in cudnn.items():
        sel = {str(r["config"]): r for r in rows
               if (r["layer"], r["precision"], r["direction"]) == (layer, precision, direction)}
        tuned = [r for r in sel.values() if isinstance(r["config"], tuple)]
        if tuned:
            r = min(tuned, key=lambda r: r["ours_ms"])
            others = ", ".join(f"{k} x{t_cudnn / sel[k]['ours_ms']:.2f}"
                               for k in variants if k in sel)
            print(f"best {layer:9s} {precision} {direction:3s} {r['config']}  ours "
                  f"{r['ours_ms']:.4f} cudnn {t_cudnn:.4f} x{t_cudnn / r['ours_ms']:.2f} "
                  f"({others}) err {r['err']:.1e}")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"sweep_{name}.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print(f"\ntotal {time.perf_counter() - start_all:.0f} s")


def table_main(args):
    """--table: every direction of every layer at both precisions with the library's own plans
    (menus as shipped, no tuning), beside cuDNN in the same run."""
    from tritonad.kernels import conv
    from tritonad.kernels.plans import clear_plans, compile_ahead

    import tritonad as td
    td.autotune(False)
    layers = args.layers.split(",") if args.layers else list(LAYERS)
    items = [(layer, precision, direction) for layer in layers
             for precision in args.precisions.split(",") for direction in ("fwd", "dx", "dw")]
    _fresh_tuner("conv-table")
    problems = {layer: _problem(*LAYERS[layer]) for layer in layers}
    clear_plans()
    with compile_ahead():
        for layer, precision, direction in items:
            _set_precision(precision)
            _cases(conv, *problems[layer], LAYERS[layer][3])[direction][0]()
    rows = []
    for layer, precision, direction in items:
        _set_precision(precision)
        ours, theirs = _cases(conv, *problems[layer], LAYERS[layer][3])[direction]
        t_ours, t_cudnn = common.bench(ours), common.bench(theirs)
        rows.append({"layer": layer, "precision": precision, "direction": direction,
                     "ours_ms": t_ours, "cudnn_ms": t_cudnn})
        print(f"table {layer:9s} {precision} {direction:3s} ours {t_ours:.4f} ms  cudnn "
              f"{t_cudnn:.4f} ms  x{t_cudnn / t_ours:.2f}", flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "conv_table.json"), "w") as f:
        json.dump(rows, f, indent=1)


def _set_precision(name):
    from tritonad.backend import set_conv_precision

    tf32 = name == "tf32"
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    set_conv_precision("high" if tf32 else "highest")


def _problem(shape, co, k, pad):
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.rand(shape, device="cuda", generator=gen) * 2 - 1
    w = (torch.rand((co, shape[1], k, k), device="cuda", generator=gen) * 2 - 1) / \
        (shape[1] * k * k) ** 0.5
    b = torch.rand(co, device="cuda", generator=gen)
    dy = torch.rand(torch.nn.functional.conv2d(x, w, b, padding=pad).shape, device="cuda",
                    generator=gen) * 2 - 1
    return x, w, b, dy


def _cases(conv, x, w, b, dy, pad):
    """direction -> (ours, cuDNN): the primitives as the library calls them, raw ATen ops."""
    args = ((1, 1), (pad, pad), (1, 1))
    aten = torch.ops.aten.convolution_backward
    shape = [w.shape[0]]
    return {
        "fwd": (lambda: conv.conv2d(x, w, b, *args),
                lambda: torch.nn.functional.conv2d(x, w, b, 1, pad)),
        "dx": (lambda: conv.conv2d_backward(dy, x, w, *args, weight_grad=False, bias_grad=False),
               lambda: aten(dy, x, w, shape, [1, 1], [pad, pad], [1, 1], False, [0, 0], 1,
                            [True, False, False])),
        "dw": (lambda: conv.conv2d_backward(dy, x, w, *args, input_grad=False),
               lambda: aten(dy, x, w, shape, [1, 1], [pad, pad], [1, 1], False, [0, 0], 1,
                            [False, True, True])),
    }


def _plan(quick, precisions=("tf32", "fp32")):
    """(layer, precision, direction, variant, wide menu?) in order of importance."""
    items = []
    for layer in ("conv2", "conv1"):
        for precision in precisions:
            for direction in ("fwd", "dx", "dw"):
                if layer == "conv1" and direction == "dx":
                    continue  # the image needs no gradient (and auto runs it on im2col)
                items.append((layer, precision, direction, "packed", True))
    for precision in precisions:
        for direction in ("fwd", "dx"):
            items += [("conv2", precision, direction, v, False) for v in ("nhwc", "nchw")]
    if not quick:
        for precision in precisions:
            items += [("56x56-k3", precision, d, "packed", False) for d in ("fwd", "dx", "dw")]
    return items


def main(argv=None):
    def extra(parser):
        parser.add_argument("--budget", type=float, default=330.0,
                            help="seconds after which remaining items are skipped")
        parser.add_argument("--precisions", default="tf32,fp32",
                            help="comma-separated among tf32, fp32 (default: both)")
        parser.add_argument("--wgrad", action="store_true",
                            help="the weight-gradient sweep (module docstring)")
        parser.add_argument("--shift", action="store_true",
                            help="the flat-shift weight gradient config by config (shift_main)")
        parser.add_argument("--window", action="store_true",
                            help="the window GEMM forward and input gradient config by config "
                                 "(window_main)")
        parser.add_argument("--table", action="store_true",
                            help="every direction with the library's plans (table_main)")
        parser.add_argument("--layers", default="",
                            help="--wgrad, --shift, --window, --table: comma-separated LAYERS "
                                 "keys")
    args = common.parse_args(__doc__.splitlines()[0], argv, extra)
    common.require_gpu("sweep_conv")
    if args.wgrad or args.table or args.shift or args.window:
        from tritonad.kernels import conv
        from tritonad.kernels.conv import flat_shift, implicit_gemm, window
        menus = ((implicit_gemm, "WGRAD_MENU"), (flat_shift, "SHIFT_WGRAD_MENU"),
                 (window, "WINDOW_MENU"), (window, "WINDOW_WGRAD_MENU"))
        defaults = conv.current_settings(), [getattr(m, name) for m, name in menus]
        # the sweeps time the direct kernels (Winograd: sweep_winograd) that they name (the
        # batch-inner form: bench conv)
        _knobs(winograd=False, batch_inner=False)
        if args.wgrad:
            wgrad_main(args)
        if args.shift:
            shift_main(args)
        if args.window:
            window_main(args)
        conv.set_settings(defaults[0])  # the table runs the library as shipped
        for (module, name), value in zip(menus, defaults[1]):
            setattr(module, name, value)
        if args.table:
            table_main(args)
        return None
    from tritonad.kernels import conv
    from tritonad.kernels.conv import implicit_gemm

    import tritonad as td

    start_all = time.perf_counter()
    td.autotune(True)
    default_gemm, default_wgrad = dict(implicit_gemm.GEMM_MENU), dict(implicit_gemm.WGRAD_MENU)
    problems, results, skipped = {}, [], []
    for layer, precision, direction, variant, wide in _plan(args.quick,
                                                            args.precisions.split(",")):
        if time.perf_counter() - start_all > args.budget:
            skipped.append(f"{layer} {precision} {direction} {variant}")
            continue
        if layer not in problems:
            problems = {layer: _problem(*LAYERS[layer])}   # one layer's tensors at a time
        x, w, b, dy = problems[layer]
        _set_precision(precision)
        pack, channels_last = VARIANTS[variant]
        _knobs(pack_weights=pack, channels_last=channels_last, algo="implicit")
        kind = conv.menu_kind(conv.dot_precision(torch.float32, conv.call_precision()),
                              torch.float32)
        implicit_gemm.GEMM_MENU = dict(default_gemm,
                                       **({kind: gemm_space()[kind]} if wide else {}))
        implicit_gemm.WGRAD_MENU = dict(default_wgrad,
                                        **({kind: wgrad_space()[kind]} if wide else {}))
        ours, theirs = _cases(conv, x, w, b, dy, LAYERS[layer][3])[direction]
        tuner = _fresh_tuner("conv-sweep")  # no cache: time every config of this item here
        from tritonad.kernels.plans import clear_plans
        clear_plans()
        t0 = time.perf_counter()
        ours()
        torch.cuda.synchronize()
        tune_s = time.perf_counter() - t0
        configs = sorted((float(t), cfg) for timings in tuner.timings.values()
                         for cfg, t in timings.items() if not isinstance(t, str))
        t_ours, t_cudnn = common.bench(ours), common.bench(theirs)
        row = {"layer": layer, "precision": precision, "direction": direction,
               "variant": variant, "menu": "wide" if wide else "default", "ours_ms": t_ours,
               "cudnn_ms": t_cudnn, "ratio": t_cudnn / t_ours, "tune_s": tune_s,
               "kernel_ms": configs[0][0] if configs else None, "configs": configs}
        results.append(row)
        print(f"{layer:8s} {precision} {direction:3s} {variant:6s} ({row['menu']:7s}) ours "
              f"{t_ours:.4f} ms  cudnn {t_cudnn:.4f} ms  x{t_cudnn / t_ours:.2f}  "
              f"(tuned {tune_s:.0f} s, {len(configs)} configs)", flush=True)
        for t, cfg in configs[:3]:
            print(f"        {t:.4f}  {cfg}", flush=True)

    # per layer and precision: the best variant of each direction, and their sum (the target)
    print("\nbest per direction (x = cuDNN ms / ours ms; above 1: faster than cuDNN)")
    summary = []
    for layer in LAYERS:
        for precision in ("fp32", "tf32"):
            rows = [r for r in results if r["layer"] == layer and r["precision"] == precision]
            if not rows:
                continue
            best = {}
            for r in rows:
                if r["direction"] not in best or r["ours_ms"] < best[r["direction"]]["ours_ms"]:
                    best[r["direction"]] = r
            ours_sum = sum(r["ours_ms"] for r in best.values())
            cudnn_sum = sum(r["cudnn_ms"] for r in best.values())
            parts = "  ".join(f"{d} {r['ours_ms']:.3f}/{r['cudnn_ms']:.3f} ({r['variant']})"
                              for d, r in best.items())
            print(f"{layer:8s} {precision}  {parts}  | sum {ours_sum:.3f} vs {cudnn_sum:.3f} "
                  f"x{cudnn_sum / ours_sum:.2f}")
            summary.append({"layer": layer, "precision": precision, "ours_ms": ours_sum,
                            "cudnn_ms": cudnn_sum, "directions": sorted(best)})
    if skipped:
        print(f"\nskipped (budget {args.budget:.0f} s spent): {'; '.join(skipped)}")
    print(f"\ntotal {time.perf_counter() - start_all:.0f} s")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "sweep_conv.json"), "w") as f:
        json.dump({"rows": results, "summary": summary, "skipped": skipped}, f, indent=1)


if __name__ == "__main__":
    main()

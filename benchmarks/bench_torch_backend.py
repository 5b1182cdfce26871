"""tritonad as a PyTorch backend (tritonad.torch_backend): unmodified PyTorch code with the
plugin on against PyTorch's own kernels, in one run on one GPU.

    python -m tritonad bench torch-backend [--quick]
    python benchmarks/bench_torch_backend.py --out bench-results [--quick] [--steps N]

Three parts, each timed with the plugin on and off:
- per-op eager cost through the dispatcher (add, relu, sum, mm, conv2d, layer_norm, softmax at
  MNIST sizes): microseconds per call of a loop of calls synchronised once at the end
  (common.per_call_us: host time included, which is what an eager program pays);
- a resnet18-shaped training step (BasicBlocks [2, 2, 2, 2], BatchNorm, channels-last, bf16
  autocast, SGD momentum, batch 128 at 224 x 224);
- a GPT training step (the gpt recipe's model: 6 blocks of LayerNorm, causal
  scaled_dot_product_attention, GELU MLP, dropout 0.2; width 384, 6 heads, context 256,
  batch 64, bf16 autocast, AdamW fused).
Steps: milliseconds per step (median of --rounds rounds of --steps steps, each round
synchronised at its end), with the loss of the last step and the count of operators that fell
back to PyTorch's kernels while the plugin was on. Ratio = PyTorch time / plugin time: above
1 means the plugin is faster. The models are defined here (torchvision is not installed) and
the tests (tests/test_torch_backend_programs.py) train the same ones.
"""
from __future__ import annotations

import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

import tritonad.torch_backend as tb  # noqa: E402


# ------------------------------------------------------------------------------------- models


class BasicBlock(nn.Module):
    """torchvision's resnet BasicBlock: two 3x3 convolutions with BatchNorm, a shortcut."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                      nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (x if self.down is None else self.down(x)))


class ResNet(nn.Module):
    """resnet18's shape (torchvision.models.resnet18): a 7x7 stride-2 stem, 3x3 max pool, four
    stages of BasicBlocks, global average pool, a linear classifier. `width` scales the
    channels (64 is resnet18) and `blocks` the stages' depths (the tests run a small one)."""

    def __init__(self, classes=1000, width=64, blocks=(2, 2, 2, 2)):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width),
                                  nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        layers, cin = [], width
        for i, depth in enumerate(blocks):
            cout = width * 2 ** i
            for j in range(depth):
                layers.append(BasicBlock(cin, cout, 2 if (j == 0 and i > 0) else 1))
                cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class SelfAttention(nn.Module):
    def __init__(self, width, heads, dropout):
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.dropout if self.training else 0.0)
        return self.drop(self.proj(y.transpose(1, 2).contiguous().view(b, t, c)))


class Block(nn.Module):
    def __init__(self, width, heads, dropout):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = SelfAttention(width, heads, dropout)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                 nn.Linear(4 * width, width), nn.Dropout(dropout))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """The gpt recipe's model (tritonad/gpt.py) in PyTorch: token and learned position
    embeddings, pre-LayerNorm blocks (dropout on the attention weights, after the projections
    and on the embeddings), a final LayerNorm and a linear head."""

    def __init__(self, vocab=65, layers=6, heads=6, width=384, context=256, dropout=0.0):
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(context, width)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.Sequential(*[Block(width, heads, dropout) for _ in range(layers)])
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)
        self.register_buffer("positions", torch.arange(context), persistent=False)

    def forward(self, idx):
        pos = self.positions[:idx.shape[1]]
        x = self.blocks(self.drop(self.tok(idx) + self.pos(pos)))
        return self.head(self.ln(x))


def resnet_step(model, opt, x, y, dtype=torch.bfloat16):
    """One training step: autocast forward, cross-entropy, backward, update; returns the loss."""
    opt.zero_grad(set_to_none=True)
    with torch.autocast(x.device.type, dtype=dtype, enabled=dtype != torch.float32):
        loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss


def gpt_step(model, opt, idx, targets, dtype=torch.bfloat16):
    opt.zero_grad(set_to_none=True)
    with torch.autocast(idx.device.type, dtype=dtype, enabled=dtype != torch.float32):
        logits = model(idx)
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))
    loss.backward()
    opt.step()
    return loss


# ---------------------------------------------------------------------------------- measuring


def _plugin(on, strict=False):
    """A context: the plugin enabled (on) or nothing."""
    import contextlib
    return tb.use(strict=strict) if on else contextlib.nullcontext()


def per_op(quick):
    """Microseconds per eager call, plugin off and on, for the ops at MNIST sizes."""
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)
    a = torch.randn(64, 128, device=dev, generator=g)
    b = torch.randn(64, 128, device=dev, generator=g)
    x = torch.randn(64, 784, device=dev, generator=g)
    w = torch.randn(784, 128, device=dev, generator=g)
    img = torch.randn(64, 1, 28, 28, device=dev, generator=g)
    k = torch.randn(32, 1, 3, 3, device=dev, generator=g)
    logits = torch.randn(64, 10, device=dev, generator=g)
    ops = {"add": lambda: a + b, "relu": lambda: torch.relu(a), "sum": lambda: a.sum(),
           "mm": lambda: x @ w, "conv2d": lambda: F.conv2d(img, k),
           "layer_norm": lambda: F.layer_norm(a, (128,)),
           "softmax": lambda: torch.softmax(logits, -1)}
    calls = 300 if quick else 3000
    rows = []
    for name, fn in ops.items():
        off = common.per_call_us(fn, calls)
        tb.reset_coverage()
        with _plugin(True):
            on = common.per_call_us(fn, calls)
        fell = sum(v["pytorch"] for v in tb.coverage().values())
        rows.append({"case": name, "torch_us": off, "plugin_us": on, "ratio": off / on,
                     "fallbacks": fell})
        print(f"  {name:12s} torch {off:8.2f} us   plugin {on:8.2f} us   ratio {off / on:.2f}x"
              f"   fallbacks {fell}", flush=True)
    return rows


def _time_steps(step, steps, rounds):
    """Median ms per step over `rounds` rounds of `steps` steps (synchronised per round)."""
    times = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(steps):
            loss = step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / steps * 1e3)
    return statistics.median(times), float(loss)


def training(name, make, steps, rounds):
    """A training step's ms with the plugin off and on (each from the same initial state)."""
    row = {"case": name}
    for side in ("torch", "plugin"):
        step = make()
        tb.reset_coverage()
        try:
            with _plugin(side == "plugin"):
                for _ in range(3):  # warm-up: compile, plans, cuDNN's choice
                    step()
                ms, loss = _time_steps(step, steps, rounds)
        except Exception as e:  # (a failing side is reported, the other parts still run)
            print(f"  {name} {side}: {type(e).__name__}: {e}", flush=True)
            ms = loss = float("nan")
            row["error"] = f"{side}: {type(e).__name__}: {e}"[:300]
        row[f"{side}_ms"], row[f"{side}_loss"] = ms, loss
        if side == "plugin":
            fell = {k: v["pytorch"] for k, v in tb.coverage().items() if v["pytorch"]}
            row["fallbacks"] = sum(fell.values())
            row["fallback_ops"] = ", ".join(sorted(fell))
    row["ratio"] = row["torch_ms"] / row["plugin_ms"]
    print(f"  {name:10s} torch {row['torch_ms']:8.2f} ms   plugin {row['plugin_ms']:8.2f} ms   "
          f"ratio {row['ratio']:.2f}x   fallbacks {row['fallbacks']} {row['fallback_ops']}",
          flush=True)
    return row


def make_resnet(batch, size):
    def make():
        torch.manual_seed(0)
        model = ResNet().cuda().to(memory_format=torch.channels_last)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-5)
        x = torch.randn(batch, 3, size, size, device="cuda").to(memory_format=torch.channels_last)
        y = torch.randint(0, 1000, (batch,), device="cuda")
        return lambda: resnet_step(model, opt, x, y)
    return make


def make_gpt(batch, context):
    def make():
        torch.manual_seed(0)
        model = GPT(context=context, dropout=0.2).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
        idx = torch.randint(0, 65, (batch, context), device="cuda")
        targets = torch.randint(0, 65, (batch, context), device="cuda")
        return lambda: gpt_step(model, opt, idx, targets)
    return make


OP_COLUMNS = [("case", "op", "{}"), ("torch_us", "torch us/call", "{:.2f}"),
              ("plugin_us", "plugin us/call", "{:.2f}"), ("ratio", "ratio", "{:.2f}x"),
              ("fallbacks", "fallbacks", "{}")]
STEP_COLUMNS = [("case", "step", "{}"), ("torch_ms", "torch ms", "{:.2f}"),
                ("plugin_ms", "plugin ms", "{:.2f}"), ("ratio", "ratio", "{:.2f}x"),
                ("torch_loss", "torch loss", "{:.4f}"), ("plugin_loss", "plugin loss", "{:.4f}"),
                ("fallbacks", "fallbacks", "{}"), ("fallback_ops", "fell back", "{}")]


def _extra(parser):
    parser.add_argument("--steps", type=int, default=None, help="steps per timed round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", choices=["ops", "resnet", "gpt"], default=None)


def main(argv=None):
    args = common.parse_args(__doc__.splitlines()[0], argv, extra=_extra)
    common.require_gpu("bench_torch_backend")
    steps = args.steps or (3 if args.quick else 10)
    op_rows, step_rows = [], []
    if args.only in (None, "ops"):
        print("per-op eager cost through the dispatcher (MNIST sizes):", flush=True)
        op_rows = per_op(args.quick)
    if args.only in (None, "resnet"):
        print("resnet18-shaped training step (bf16 autocast, channels-last):", flush=True)
        batch, size = (32, 112) if args.quick else (128, 224)
        row = training(f"resnet18 b{batch} {size}px", make_resnet(batch, size), steps,
                       args.rounds)
        step_rows.append(row)
    if args.only in (None, "gpt"):
        print("GPT training step (the gpt recipe's model, bf16 autocast, AdamW fused):",
              flush=True)
        batch, context = (16, 256) if args.quick else (64, 256)
        step_rows.append(training(f"gpt b{batch} t{context}", make_gpt(batch, context), steps,
                                  args.rounds))
    if op_rows:
        common.print_table("eager cost per call (ratio = torch us / plugin us)", op_rows,
                           OP_COLUMNS)
    if step_rows:
        common.print_table("training steps (ratio = torch ms / plugin ms)", step_rows,
                           STEP_COLUMNS)
    meta = {"steps": steps, "rounds": args.rounds, "quick": args.quick}
    path = common.save(args.out, "torch_backend", op_rows + step_rows, meta=meta)
    print(f"\nwrote {path}")
    return op_rows + step_rows


if __name__ == "__main__":
    main()

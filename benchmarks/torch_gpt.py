"""The gpt recipe (tritonad/gpt.py, `train --model gpt`) as a plain PyTorch script: the comparison
for `bench gpt` and for the whole `train` command's wall time.

    python benchmarks/torch_gpt.py --mode eager-bf16            # 2000 steps, as the recipe
    python benchmarks/torch_gpt.py --mode compile-bf16 --steps 200 --generate 500

The same data read the same way (data/shakespeare/shakespeare.txt.gz, its SHA256 checked, the
sorted distinct characters as the vocabulary, the first 90% of the characters train and the
last 10% validate), the same model (6 layers, 6 heads, width 384, context 256, learned
positions, pre-LayerNorm blocks, GELU MLP of 4x the width, dropout 0.2 on the embeddings, the
attention weights and both residual branches, head tied to the token embedding), the same init
(normal(0, 0.02), the residual projections normal(0, 0.02 / sqrt(2 * layers)), biases 0),
AdamW (fused) lr 1e-3 betas (0.9, 0.99) with weight decay 0.1 on matrices and embeddings only,
100 warm-up steps then a cosine to 1e-4, gradient clipping at norm 1.0, 64 random windows a
step, the validation loss over 20 batches every 250 steps and at the end.

Modes: eager-fp32 (float32 at PyTorch's defaults: IEEE matmul), eager-bf16 (torch.autocast
bfloat16, weights float32), compile-bf16 (the same under torch.compile of the model).
--generate N samples N characters at batch 1 after training the naive way a PyTorch user
writes it (the whole context, cropped to 256, rerun for each token; the head on the last
position only; the eager model in every mode, as compiling each context length would dominate),
each token read back to the host as a streaming sampler does.

Prints one JSON object: steady-state ms per step (the intervals between evaluations after the
first, which holds the warm-up and compilation), tokens/s, the final train and validation
loss, the start-up breakdown and the whole wall time.
"""
from __future__ import annotations

import time

_STARTED = time.perf_counter()

import argparse  # noqa: E402  (the clock above times the imports)
import gzip  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")
SHA256 = "da68ca4e8201d41a12c1d5e82d967bda85105f1dabe823d5735138bccabdd387"  # of the text
MODES = ("eager-fp32", "eager-bf16", "compile-bf16")
RECIPE = dict(layers=6, heads=6, width=384, context=256, dropout=0.2, batch=64, steps=2000,
              lr=1e-3, min_lr=1e-4, warmup=100, betas=(0.9, 0.99), weight_decay=0.1, clip=1.0,
              eval_every=250, eval_batches=20)


# ------------------------------------------------------------------------------- data


def read_corpus(data_dir=None):
    """(ids int64 numpy [N], vocab list of characters): the text as indices into its sorted
    distinct characters, as tritonad.corpus.Shakespeare builds them."""
    folder = data_dir or DATA
    candidates = [os.path.join(f, n) for f in (folder, os.path.join(folder, "shakespeare"))
                  for n in ("shakespeare.txt.gz", "shakespeare.txt")]
    path = next((p for p in candidates if os.path.isfile(p)), None)
    if path is None:
        raise SystemExit(f"torch_gpt: shakespeare.txt.gz not found in {folder}")
    with (gzip.open(path) if path.endswith(".gz") else open(path, "rb")) as f:
        content = f.read()
    if hashlib.sha256(content).hexdigest() != SHA256:
        raise SystemExit(f"torch_gpt: {path} is not the Shakespeare corpus (SHA256 mismatch)")
    vocab = sorted(set(content.decode("ascii")))
    table = np.zeros(256, np.int64)
    table[[ord(c) for c in vocab]] = np.arange(len(vocab))
    return table[np.frombuffer(content, np.uint8)], vocab


def windows(ids, batch, context):
    """(x, y) [batch, context]: windows at uniform random offsets in [0, n - context - 1) and
    the characters one position on (drawn on ids' device)."""
    starts = torch.randint(ids.shape[0] - context - 1, (batch, 1), device=ids.device)
    rows = ids[starts + torch.arange(context + 1, device=ids.device)]
    return rows[:, :-1], rows[:, 1:]


# ------------------------------------------------------------------------------- model


class CausalSelfAttention(nn.Module):
    def __init__(self, width, heads, dropout):
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.resid_drop = nn.Dropout(dropout)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.dropout if self.training else 0.0)
        return self.resid_drop(self.proj(y.transpose(1, 2).reshape(b, t, c)))


class Block(nn.Module):
    def __init__(self, width, heads, dropout):
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads, dropout)
        self.ln2 = nn.LayerNorm(width)
        self.fc = nn.Linear(width, 4 * width)
        self.act = nn.GELU()
        self.proj = nn.Linear(4 * width, width)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.drop(self.proj(self.act(self.fc(self.ln2(x)))))


class GPT(nn.Module):
    """tritonad.gpt.GPT in PyTorch, with the same parameter names."""

    def __init__(self, vocab, layers=6, heads=6, width=384, context=256, dropout=0.2):
        super().__init__()
        self.vocab, self.context = vocab, context
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(context, width)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList([Block(width, heads, dropout) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied
        residual = 0.02 / math.sqrt(2 * layers)
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif name.endswith("proj.weight"):
                nn.init.normal_(p, 0.0, residual)
            elif p.ndim >= 2:
                nn.init.normal_(p, 0.0, 0.02)

    def forward(self, idx, targets=None):
        """idx [B, T] -> the mean cross-entropy against targets [B, T]; without targets, the
        logits of the last position [B, vocab] (sampling)."""
        b, t = idx.shape
        x = self.drop(self.tok(idx) + self.pos(torch.arange(t, device=idx.device)))
        for block in self.blocks:
            x = block(x)
        x = self.ln_f(x)
        if targets is None:
            return self.head(x[:, -1])
        return F.cross_entropy(self.head(x).reshape(b * t, self.vocab), targets.reshape(b * t))

    def decay_groups(self, weight_decay):
        decay = [p for p in self.parameters() if p.ndim >= 2]
        rest = [p for p in self.parameters() if p.ndim < 2]
        return [{"params": decay, "weight_decay": weight_decay},
                {"params": rest, "weight_decay": 0.0}]


def lr_factor(step, steps, warmup, lr, min_lr):
    """tritonad.gpt.lr_factor: linear warm-up over `warmup` steps, then a cosine from lr down
    to min_lr at the last step, as a factor of lr."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return (min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * min(progress, 1.0)))) / lr


# ------------------------------------------------------------------------------- sampling


@torch.no_grad()
def generate_naive(model, prompt, tokens, cast, temperature=0.8, top_k=50):
    """Sample `tokens` ids after prompt (a list of ids) at batch 1, rerunning the model over the
    whole context (cropped to model.context) for each; returns (ids, tokens/s after the first
    token, which follows the prompt's forward)."""
    model.eval()
    device = next(model.parameters()).device
    ids = torch.tensor([prompt], device=device)
    out, stamps = list(prompt), []
    for _ in range(tokens):
        with cast:
            logits = model(ids[:, -model.context:])
        logits = logits.float() / temperature
        if top_k is not None and top_k < logits.shape[-1]:
            kth = torch.topk(logits, top_k).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        nxt = torch.multinomial(F.softmax(logits, dim=-1), 1)
        ids = torch.cat([ids, nxt], dim=1)
        out.append(int(nxt))  # streamed: each token reaches the host as it is drawn
        stamps.append(time.perf_counter())
    model.train()
    rate = (len(stamps) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 else None
    return out, rate


# ------------------------------------------------------------------------------- the run


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=MODES, default="eager-bf16")
    p.add_argument("--steps", type=int, default=RECIPE["steps"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default=None, help="default: cuda")
    p.add_argument("--data-dir", help="folder holding shakespeare.txt.gz (default: data/)")
    p.add_argument("--generate", type=int, default=0, metavar="N",
                   help="after training, sample N characters at batch 1 (the naive loop) and "
                        "report tokens/s")
    p.add_argument("--eval-every", type=int, default=RECIPE["eval_every"])
    p.add_argument("--eval-batches", type=int, default=RECIPE["eval_batches"])
    # smaller models and batches, for tests on the CPU
    for name in ("layers", "heads", "width", "context", "batch", "warmup"):
        p.add_argument(f"--{name}", type=int, default=RECIPE[name])
    p.add_argument("--dropout", type=float, default=RECIPE["dropout"])
    args = p.parse_args(argv)
    for name in ("steps", "eval_every", "eval_batches", "layers", "heads", "width", "context",
                 "batch", "warmup"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be a positive integer")
    if args.generate < 0:
        p.error("--generate must be >= 0")
    return args


def process_seconds():
    """Seconds since this process started (Linux's /proc; else since this module's import)."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.perf_counter() - _STARTED


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run(args):
    """Train (and sample); returns the result dict that main prints."""
    device = torch.device(args.device or "cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("torch_gpt: no CUDA GPU (pass --device cpu)")
    # float32 at PyTorch's defaults (IEEE matmul), as tritonad's fp32 precision
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(args.seed)
    startup = {"import": process_seconds()}

    clock = time.perf_counter()
    ids, vocab = read_corpus(args.data_dir)
    cut = int(len(ids) * 0.9)
    train_ids = torch.from_numpy(ids[:cut]).to(device)
    val_ids = torch.from_numpy(ids[cut:]).to(device)
    _sync(device)
    startup["data"] = time.perf_counter() - clock

    clock = time.perf_counter()
    r = dict(RECIPE, **{k: getattr(args, k) for k in ("layers", "heads", "width", "context",
                                                      "batch", "warmup", "dropout")})
    model = GPT(len(vocab), r["layers"], r["heads"], r["width"], r["context"],
                r["dropout"]).to(device)
    opt = torch.optim.AdamW(model.decay_groups(r["weight_decay"]), lr=r["lr"], betas=r["betas"],
                            fused=True)
    steps = args.steps
    schedule = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: lr_factor(s, steps, r["warmup"], r["lr"], r["min_lr"]))
    low = args.mode != "eager-fp32"
    cast = torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=low)
    forward = torch.compile(model) if args.mode.startswith("compile") else model
    _sync(device)
    startup["model"] = time.perf_counter() - clock
    batch, context = r["batch"], r["context"]

    def evaluate():
        forward.eval()
        total = 0.0
        with torch.no_grad(), cast:
            for _ in range(args.eval_batches):
                x, y = windows(val_ids, batch, context)
                total += forward(x, y).item()
        forward.train()
        return total / args.eval_batches

    def step():
        x, y = windows(train_ids, batch, context)
        with cast:
            loss = forward(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), r["clip"])
        opt.step()
        schedule.step()
        return loss.detach()

    history, losses, done = [], [], 0
    _sync(device)
    clock = time.perf_counter()
    for i in range(steps):
        losses.append(step())
        if i == 0:
            _sync(device)
            startup["first_step"] = time.perf_counter() - clock  # compilation included
        if (i + 1) % args.eval_every == 0 or i + 1 == steps:
            train_loss = torch.stack(losses).mean().item()  # (synchronises)
            seconds = time.perf_counter() - clock
            history.append(dict(step=i + 1, train_loss=train_loss, val_loss=evaluate(),
                                steps=i + 1 - done, seconds=seconds,
                                tokens_per_s=(i + 1 - done) * batch * context / seconds,
                                lr=opt.param_groups[0]["lr"]))
            print(json.dumps(history[-1]), file=sys.stderr, flush=True)
            losses, done = [], i + 1
            _sync(device)
            clock = time.perf_counter()
    steady = history[1:] or history  # the first interval holds the warm-up and compilation
    step_ms = 1e3 * sum(h["seconds"] for h in steady) / sum(h["steps"] for h in steady)
    result = {"framework": "torch", "mode": args.mode, "torch": torch.__version__,
              "device": str(device), "seed": args.seed, "steps": steps, "batch": batch,
              "context": context, "step_ms": step_ms,
              "steady": len(history) > 1,  # False: step_ms includes the warm-up
              "tokens_per_s": batch * context / step_ms * 1e3,
              "train_loss": history[-1]["train_loss"], "val_loss": history[-1]["val_loss"],
              "startup": startup, "history": history,
              "wall_s": process_seconds()}  # start to the last evaluation: the train command's
    if args.generate:
        prompt = [vocab.index(c) for c in "ROMEO:"]
        generate_naive(model, prompt, min(20, args.generate), cast)  # warm-up
        out, rate = generate_naive(model, prompt, args.generate, cast)
        result["generate"] = {"tokens": args.generate, "tokens_per_s": rate,
                              "text": "".join(vocab[i] for i in out)}
    return result


def main(argv=None):
    result = run(parse_args(argv))
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()

"""A character-level GPT: the `train --model gpt` recipe's model and its sampler.

GPT(vocab, layers=6, heads=6, width=384, context=256, dropout=0.2): token and learned position
embeddings, `layers` pre-LayerNorm blocks (causal self-attention, then a GELU MLP of 4x the
width, each added to the residual stream), a final LayerNorm and an output head tied to the token
embedding (one weight). Initialisation as GPT-2: weights normal(0, 0.02), the projections that
write into the residual stream normal(0, 0.02 / sqrt(2 * layers)), biases 0.

Sampling (`generate`) keeps a key/value cache per block: each new token runs the model on one
position against the cached keys and values, not on the whole context. When the context is
full, the oldest half is dropped and the cache rebuilt from the rest in one pass (learned
positions restart), so a token costs one position amortised.
"""
from __future__ import annotations

import math

from . import nn
from .autodiff.shape_ops import cat
from .nn import functional as F


class CausalSelfAttention(nn.Module):
    def __init__(self, width, heads, dropout):
        super().__init__()
        if width % heads:
            raise ValueError(f"GPT: width {width} is not a multiple of heads {heads}")
        self.heads, self.dropout = heads, dropout
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.resid_drop = nn.Dropout(dropout)

    def forward(self, x, cache=None):
        """x [B, T, C] -> [B, T, C]. cache: None (training: causal over T), or a dict holding
        this block's keys and values of the positions before x, extended in place."""
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        if cache is not None:
            if "k" in cache:
                k, v = cat([cache["k"], k], dim=2), cat([cache["v"], v], dim=2)
            cache["k"], cache["v"] = k, v
        # causal: a query at position i sees keys up to i; with a cache of S earlier keys and one
        # query (t = 1) every key is earlier, so no mask is needed
        causal = cache is None or t > 1
        y = F.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                           dropout_p=self.dropout if self.training else 0.0)
        y = y.transpose(1, 2).reshape(b, t, c)
        return self.resid_drop(self.proj(y))


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

    def forward(self, x, cache=None):
        x = x + self.attn(self.ln1(x), cache)
        return x + self.drop(self.proj(self.act(self.fc(self.ln2(x)))))


class GPT(nn.Module):
    def __init__(self, vocab, layers=6, heads=6, width=384, context=256, dropout=0.2):
        super().__init__()
        self.vocab, self.context = vocab, context
        self.config = dict(vocab=vocab, layers=layers, heads=heads, width=width,
                           context=context, dropout=dropout)
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(context, width)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList([Block(width, heads, dropout) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied: one Parameter
        residual = 0.02 / math.sqrt(2 * layers)
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif name.endswith("proj.weight"):
                nn.init.normal_(p, 0.0, residual)
            elif p.ndim >= 2:
                nn.init.normal_(p, 0.0, 0.02)

    def forward(self, idx, targets=None, caches=None, start=0):
        """idx [B, T] int64 -> logits [B, T, vocab] (and the mean cross-entropy against targets
        [B, T] when given). caches: one dict per block (generate), start: idx's first position."""
        b, t = idx.shape
        if start + t > self.context:
            raise ValueError(f"GPT: positions {start}..{start + t - 1} exceed the context "
                             f"{self.context}")
        from .tensor import arange
        x = self.drop(self.tok(idx) + self.pos(arange(start, start + t, device=idx.device)))
        for i, block in enumerate(self.blocks):
            x = block(x, None if caches is None else caches[i])
        logits = self.head(self.ln_f(x))
        if targets is None:
            return logits
        loss = F.cross_entropy(logits.reshape(b * t, self.vocab), targets.reshape(b * t))
        return logits, loss

    def decay_groups(self, weight_decay):
        """AdamW parameter groups: weight decay on matrices and embeddings, none on biases and
        LayerNorm weights."""
        decay = [p for p in self.parameters() if p.ndim >= 2]
        rest = [p for p in self.parameters() if p.ndim < 2]
        return [{"params": decay, "weight_decay": weight_decay},
                {"params": rest, "weight_decay": 0.0}]

    def generate(self, prompt, tokens, temperature=1.0, top_k=None, emit=None):
        """Sample `tokens` new tokens after prompt ([1, T] int64), one position each against
        the key/value cache; emit(token id) is called as each one is drawn. Returns the ids."""
        from .autodiff import no_grad
        if temperature <= 0:
            raise ValueError(f"generate: temperature must be positive, got {temperature}")
        if top_k is not None and not 1 <= top_k:
            raise ValueError(f"generate: top_k must be at least 1, got {top_k}")
        ids = list(prompt[0].tolist())
        if not ids:
            raise ValueError("generate: the prompt is empty")
        was_training = self.training
        self.eval()
        try:
            with no_grad():
                window = ids[-self.context:]
                caches, start = self._prefill(window, prompt.device)
                logits = caches.pop()
                for _ in range(tokens):
                    token = _sample(logits[:, -1], temperature, top_k)
                    ids.append(token)
                    if emit is not None:
                        emit(token)
                    position = start
                    if position >= self.context:  # full: keep the newest half, rebuild
                        window = ids[-(self.context // 2):]
                        caches, start = self._prefill(window, prompt.device)
                        logits = caches.pop()
                        continue
                    x = _ids(ids[-1:], prompt.device)
                    logits = self(x, caches=caches, start=position)
                    start += 1
        finally:
            self.train(was_training)
        return ids

    def _prefill(self, window, device):
        caches = [{} for _ in self.blocks]
        logits = self(_ids(window, device), caches=caches, start=0)
        return caches + [logits], len(window)


def _ids(ids, device):
    from .tensor import tensor
    return tensor([ids], device=device)


def _sample(logits, temperature, top_k):
    """One token id from logits [1, vocab]: softmax(logits / temperature) restricted to the
    top_k largest, sampled by inverse CDF with one uniform draw (all on the device; the id is
    read back to the host, as it is emitted)."""
    from .autodiff.ops import where
    from .tensor import rand
    z = logits.float() / temperature
    if top_k is not None and top_k < z.shape[-1]:
        kth = z.topk(top_k, dim=-1)[0][:, -1:]
        z = where(z < kth, float("-inf"), z)
    p = z.softmax(-1)
    cdf = p.cumsum(-1)
    u = rand(1, 1, device=logits.device) * cdf[:, -1:]
    return min(int((cdf <= u).sum().item()), z.shape[-1] - 1)  # (u at the top: rounding)


# ------------------------------------------------------------------------ the training recipe

RECIPE = dict(layers=6, heads=6, width=384, context=256, dropout=0.2, batch=64, steps=2000,
              lr=1e-3, min_lr=1e-4, warmup=100, betas=(0.9, 0.99), weight_decay=0.1, clip=1.0)


def lr_factor(step, steps, warmup, lr, min_lr):
    """The recipe's schedule as a factor of lr: linear warm-up over `warmup` steps, then a
    cosine from lr down to min_lr at the last step."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return (min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * min(progress, 1.0)))) / lr


def train(corpus, device, steps=None, batch=None, precision="bf16", seed=0, eval_every=250,
          eval_batches=20, log=None, graph=None, warmup_calls=2, startup=None, **overrides):
    """Train the recipe's GPT on corpus (first 90% of the characters; the last 10% validate).
    precision: "fp32", "bf16" (autocast; weights stay float32) or "fp16" (autocast and a
    GradScaler). graph: capture the whole step (windows, forward, backward, clip, AdamW with the
    scheduled lr, dropout) as a CUDA graph after `warmup_calls` eager steps (capture.
    ScheduledStep); default: on a CUDA device with the triton backend. startup: a dict to fill
    with the start-up breakdown (first_step, capture, tune: seconds). Returns (model, history):
    history holds, every eval_every steps and at the end, the step, the train loss (the mean
    of the steps since the last entry), the validation loss (eval_batches batches) and the
    tokens per second since the last entry."""
    import time

    from . import optim
    from .amp import PRECISIONS, for_precision
    from .autodiff import no_grad
    from .capture import CapturedStep, ScheduledStep, capture_default, synchronize
    from .generator import manual_seed
    from .kernels.tuning import Tuner
    from .nn.utils import clip_grad_norm_
    from .tensor import zeros

    if precision not in PRECISIONS:
        raise ValueError(f"gpt: precision must be fp32, bf16 or fp16, got {precision!r}")
    r = dict(RECIPE, **overrides)
    steps, batch = steps or r["steps"], batch or r["batch"]
    graph = capture_default(device) if graph is None else bool(graph)
    manual_seed(seed)
    train_ids, val_ids = corpus.split(0.9, device)
    model = GPT(corpus.vocab_size, r["layers"], r["heads"], r["width"], r["context"],
                r["dropout"]).to(device)
    opt = optim.AdamW(model.decay_groups(r["weight_decay"]), lr=r["lr"], betas=r["betas"])
    schedule = optim.lr_scheduler.LambdaLR(
        opt, lambda s: lr_factor(s, steps, r["warmup"], r["lr"], r["min_lr"]))
    cast, scaler = for_precision(precision, device)
    context = r["context"]
    loss_sum = zeros((), device=device)  # the train losses since the last log, on the device
    params = list(model.parameters())

    def train_step():
        x, y = corpus.windows(train_ids, batch, context)
        with cast:
            _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        if scaler.is_enabled():
            scaler.unscale_(opt)  # (clip the true gradients)
        clip_grad_norm_(params, r["clip"])
        scaler.step(opt)
        scaler.update()
        loss_sum.add_(loss.detach())
        return loss

    def evaluate():
        model.eval()
        total = 0.0
        with no_grad(), cast:
            for _ in range(eval_batches):
                x, y = corpus.windows(val_ids, batch, context)
                total += model(x, y)[1].item()
        model.train()
        return total / eval_batches

    step_fn = ScheduledStep(train_step, opt, steps, device, graph=graph, warmup=warmup_calls)
    tune0, capture0 = sum(t.seconds for t in Tuner.ALL), CapturedStep.capture_seconds

    def note_startup():  # (tuning and capture happen in the first steps)
        if startup is not None:
            startup.update(tune=sum(t.seconds for t in Tuner.ALL) - tune0,
                           capture=CapturedStep.capture_seconds - capture0, graph=graph)

    history, clock, done = [], time.perf_counter(), 0
    try:
        for step in range(steps):
            step_fn()
            schedule.step()
            if step == 0 and startup is not None:
                synchronize(device)
                startup["first_step"] = time.perf_counter() - clock
            if (step + 1) % eval_every == 0 or step + 1 == steps:
                train_loss = loss_sum.item() / (step + 1 - done)
                loss_sum.zero_()
                seconds = time.perf_counter() - clock
                tokens = (step + 1 - done) * batch * context / seconds
                entry = dict(step=step + 1, train_loss=train_loss, val_loss=evaluate(),
                             tokens_per_s=tokens, lr=opt.param_groups[0]["lr"])
                history.append(entry)
                if log is not None:
                    note_startup()
                    log(entry)
                clock, done = time.perf_counter(), step + 1
    finally:
        step_fn.close()
    note_startup()
    return model, history

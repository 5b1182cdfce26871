"""Host-side cost per op in eager mode (microseconds of Python per call), tritonad vs torch, and a
cProfile of eager MLP training steps. Launch-bound workloads (MNIST in eager mode) are decided by
these numbers; captured graphs remove them. Not part of `tritonad bench`.

    python benchmarks/profile_host.py
"""
from __future__ import annotations

import cProfile
import io
import pstats
import time

import torch

import common


def per_call_us(fn, n=2000):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    host = (time.perf_counter() - start) / n * 1e6
    torch.cuda.synchronize()
    return host


def main(argv=None):
    common.parse_args(__doc__.splitlines()[0], argv)
    common.require_gpu("profile_host")
    import tritonad as td
    import tritonad.nn.functional as F
    from tritonad import models, optim, train

    td.set_backend("triton")
    be = td.get_backend()
    a, b = torch.randn(128, 256, device="cuda"), torch.randn(256, device="cuda")
    w = torch.randn(100, 256, device="cuda")
    logits, target = torch.randn(128, 10, device="cuda"), torch.randint(0, 10, (128,),
                                                                         device="cuda")
    ta, tb, tw = td.from_torch(a), td.from_torch(b), td.from_torch(w)
    tl_, tt = td.from_torch(logits), td.from_torch(target)
    rows = [
        ("add (raw primitive)", lambda: be.add(a, b), lambda: torch.add(a, b)),
        ("add (Tensor op)", lambda: ta + tb, lambda: a + b),
        ("relu (Tensor op)", lambda: ta.relu(), lambda: a.relu()),
        ("sum dim 0 (Tensor op)", lambda: ta.sum(0), lambda: a.sum(0)),
        ("matmul 128x256x100 (raw)", lambda: be.matmul(a, w.t()), lambda: a @ w.t()),
        ("linear+relu (F.linear)", lambda: F.linear(ta, tw, None, activation="relu"),
         lambda: torch.relu(torch.nn.functional.linear(a, w))),
        ("cross_entropy 128x10 (F)", lambda: F.cross_entropy(tl_, tt),
         lambda: torch.nn.functional.cross_entropy(logits, target)),
        ("gather rows", lambda: ta[tt], lambda: a[target]),
    ]
    print(f"{'op':28s} {'tritonad us':>12s} {'torch us':>9s}")
    for name, ours, theirs in rows:
        print(f"{name:28s} {per_call_us(ours):12.1f} {per_call_us(theirs):9.1f}", flush=True)

    batch = 128
    train_set, _ = train.datasets("mnist")
    loader = td.data.DataLoader(train_set, batch, shuffle=True, device="cuda", limit=60 * batch)
    model = models.build("mlp").to("cuda")
    opt = optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    trainer = train.Trainer(model, opt, loader)
    order = loader.permutation()
    for i in range(5):
        trainer.eager_step(order[i * batch:(i + 1) * batch])
    torch.cuda.synchronize()
    profile = cProfile.Profile()
    start = time.perf_counter()
    profile.enable()
    for i in range(5, 55):
        trainer.eager_step(order[i * batch:(i + 1) * batch])
    profile.disable()
    torch.cuda.synchronize()
    print(f"\neager mlp step: {(time.perf_counter() - start) / 50 * 1e3:.2f} ms (under cProfile)")
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(30)
    print(out.getvalue())


if __name__ == "__main__":
    main()

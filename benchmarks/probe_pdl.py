"""Probe: per-kernel cost of a chain of tiny dependent kernels in a CUDA graph, with and without
programmatic dependent launch (PDL)."""
import torch
import triton
import triton.language as tl


@triton.jit
def _step(x_ptr, y_ptr, n, BLOCK: tl.constexpr, GDC: tl.constexpr, EARLY: tl.constexpr):
    if GDC:
        tl.extra.cuda.gdc_wait()
        if EARLY:
            tl.extra.cuda.gdc_launch_dependents()
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=m) + 1.0, mask=m)


def chain(bufs, n, gdc, early, programs):
    for i in range(len(bufs) - 1):
        _step[(programs,)](bufs[i], bufs[i + 1], n, BLOCK=1024, GDC=gdc, EARLY=early,
                           launch_pdl=gdc, num_warps=4)


def time_graph(fn, reps=20):
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    best = 1e9
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        g.replay()
        e.record()
        e.synchronize()
        best = min(best, s.elapsed_time(e))
    return best * 1000


print("triton", triton.__version__, torch.cuda.get_device_name())
for programs in (1, 16, 132):
    n = programs * 1024
    bufs = [torch.zeros(n, device="cuda") for _ in range(41)]
    for gdc, early in ((False, False), (True, False), (True, True)):
        us = time_graph(lambda: chain(bufs, n, gdc, early, programs))
        ok = bool((bufs[-1] == bufs[0] + 40).all())
        print(f"programs {programs:4d} pdl={gdc!s:5} early_trigger={early!s:5}: "
              f"{us / 40:.2f} us per kernel, correct={ok}")

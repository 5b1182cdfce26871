"""Data-parallel training over torch.distributed: every process runs the same step on its own
part of the data, and the gradients are averaged across processes before every update.

    # torchrun --standalone --nproc_per_node=4 my_training.py
    import tritonad as td
    from tritonad import distributed as dist
    device = dist.init_process_group()        # from torchrun's environment: cuda:LOCAL_RANK or cpu
    model = dist.DistributedDataParallel(td.models.mlp().to(device))  # rank 0's parameters
    opt = td.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loader = td.data.DataLoader(train, 64, shuffle=True, device=device, shard=dist.shard())
    for x, y in loader:                        # 64 per process: a global batch of 64 * 4
        loss = td.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()                             # averages the gradients first, then updates

tritonad.train.Trainer and `python -m tritonad train` do all of this themselves when launched
under torchrun (`torchrun --standalone --nproc_per_node=N -m tritonad train ...`).

The process group is torch.distributed's: NCCL between GPUs (one process per GPU, its device
cuda:LOCAL_RANK), gloo between CPU processes. torch.distributed only communicates here (the
torch rule, DESIGN section 2): the sums of an all-reduce happen inside the collective; every
other operation on the data (the scaling by 1 / world size, zero gradients, copies) is one of
tritonad's kernels or numpy.

When the gradients are averaged: in optimizer.step(), before the update, one all-reduce per
flat gradient buffer of the optimizer (tritonad.optim.optimizer._FlatBucket: every parameter of
a group on one device, so one collective for a whole MNIST model). Starting all-reduces while
backward still runs would overlap communication with the backward's kernels, but the autodiff
engine hands the leaves' gradients over only when the backward ends, and a model of a few MB
takes one collective of tens of microseconds; so they are averaged once, after backward, where
the optimizer reads them. Inside a captured training step (tritonad.capture, Trainer with
graph=True) the all-reduce is recorded into the CUDA graph with the rest of the step (NCCL allows
capture), so a data-parallel step is still one graph launch.
"""
from __future__ import annotations

import contextlib
import datetime
import os
import weakref

import torch
import torch.distributed as dist

from .backend import get_backend
from .nn.module import Module
from .optim import _contiguous_spans
from .optim import optimizer as _optimizer
from .tensor import Tensor

_DEVICE = None  # this process's device, set by init_process_group


# ---------------------------------------------------------------------- the process group
def launched() -> bool:
    """Whether a launcher (torchrun) started this process as one of a group: RANK and
    WORLD_SIZE are set in the environment."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def _environment_number(name):
    value = os.environ.get(name)
    if value is None:
        raise RuntimeError(f"init_process_group: the environment variable {name} is not set; "
                           "launch with torchrun (torchrun --standalone --nproc_per_node=N ...), "
                           "which sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT")
    try:
        return int(value)
    except ValueError:
        raise RuntimeError(f"init_process_group: the environment variable {name}={value!r} is "
                           "not an integer") from None


def init_process_group(device=None, backend=None, timeout_s=None) -> torch.device:
    """Join the group of processes that torchrun started (RANK, WORLD_SIZE, LOCAL_RANK,
    MASTER_ADDR, MASTER_PORT in the environment) and return this process's device.

    device: "cuda" (default when there is a GPU) gives cuda:LOCAL_RANK, made the current
    device so that kernels launch there; "cpu" gives the CPU. backend: "nccl" (default on
    GPUs) or "gloo" (default on the CPU). timeout_s: how long a collective may wait for the
    other processes (torch.distributed's default when None). Calling it again returns the
    same device."""
    global _DEVICE
    if not dist.is_available():
        raise RuntimeError("init_process_group: this build of PyTorch has no torch.distributed")
    if dist.is_initialized():
        if _DEVICE is None:  # set up by torch.distributed directly: the usual device
            _DEVICE = _local_device("cuda" if dist.get_backend() == "nccl" else "cpu")
        return _DEVICE
    rank, world = _environment_number("RANK"), _environment_number("WORLD_SIZE")
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        if name not in os.environ:
            raise RuntimeError(f"init_process_group: the environment variable {name} is not "
                               "set; launch with torchrun, which sets it")
    if not 0 <= rank < world:
        raise RuntimeError(f"init_process_group: RANK={rank} is not in 0..WORLD_SIZE-1 "
                           f"(WORLD_SIZE={world})")
    try:
        wanted = torch.device(device) if device is not None else None
    except (RuntimeError, TypeError):
        raise ValueError(f"init_process_group: device {device!r} is neither cuda nor cpu") \
            from None
    kind = wanted.type if wanted is not None else "cuda" if torch.cuda.is_available() else "cpu"
    if kind not in ("cuda", "cpu"):
        raise ValueError(f"init_process_group: device {device!r} is neither cuda nor cpu")
    if kind == "cuda" and wanted is not None and wanted.index is not None and \
            wanted.index != _environment_number("LOCAL_RANK"):
        raise ValueError(f"init_process_group: device {device!r}, but each process takes the "
                         f"GPU of its local rank, here cuda:{os.environ['LOCAL_RANK']}; pass "
                         "device='cuda'")
    if backend is None:
        backend = "nccl" if kind == "cuda" else "gloo"
    if backend not in ("nccl", "gloo"):
        raise ValueError(f"init_process_group: backend {backend!r}; use nccl (GPUs) or gloo")
    if backend == "nccl" and kind != "cuda":
        raise ValueError("init_process_group: NCCL connects GPUs; use backend='gloo' on the CPU")
    local = _local_device(kind)
    options = {} if timeout_s is None else {"timeout": datetime.timedelta(seconds=timeout_s)}
    dist.init_process_group(backend, rank=rank, world_size=world, **options)
    _DEVICE = local
    return local


def _local_device(kind) -> torch.device:
    if kind == "cpu":
        return torch.device("cpu")
    local = _environment_number("LOCAL_RANK")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if local >= count:
        raise RuntimeError(f"init_process_group: this is local process {local} but the machine "
                           f"has {count} GPU(s); start at most {count} processes per machine "
                           "(torchrun --nproc_per_node)")
    torch.cuda.set_device(local)
    return torch.device("cuda", local)


def is_initialized() -> bool:
    """Whether this process belongs to a process group (init_process_group ran)."""
    return dist.is_available() and dist.is_initialized()


def get_rank() -> int:
    """This process's number in the group, 0 to world size - 1 (0 without a group)."""
    return dist.get_rank() if is_initialized() else 0


def get_world_size() -> int:
    """How many processes train together (1 without a group)."""
    return dist.get_world_size() if is_initialized() else 1


def is_main_process() -> bool:
    """Whether this process is rank 0, the one that prints and writes files."""
    return get_rank() == 0


def shard() -> tuple:
    """(rank, world size): this process's part of the data, DataLoader(..., shard=shard())."""
    return get_rank(), get_world_size()


def local_device():
    """The device init_process_group gave this process (None before it)."""
    return _DEVICE


def barrier():
    """Wait until every process of the group gets here (nothing without a group)."""
    if is_initialized():
        dist.barrier()


def destroy_process_group():
    """Leave the process group; parameters replicated so far are no longer averaged."""
    global _DEVICE
    _AVERAGER.forget()
    if is_initialized():
        dist.destroy_process_group()
    _DEVICE = None


# ---------------------------------------------------------------------- collectives
def broadcast_(arrays, src=0):
    """Overwrite raw arrays with process src's values, in place (as bytes: any dtype)."""
    backend = get_backend()
    for raw in arrays:
        if raw.numel() == 0:
            continue
        staged = raw if raw.is_contiguous() else backend.contiguous(raw)
        dist.broadcast(staged.view(-1).view(torch.uint8), src)
        if staged is not raw:
            backend.copy_(raw, staged)


def sum_(arrays):
    """Replace each raw array by its sum over the processes, in place (metrics)."""
    for raw in arrays:
        dist.all_reduce(raw, dist.ReduceOp.SUM)


def average_(arrays):
    """Replace raw floating-point arrays by their mean over the processes, in place: arrays
    that lie side by side in one buffer take one all-reduce (a sum) and one scaling kernel."""
    if not arrays:
        return
    backend, world = get_backend(), get_world_size()
    spans, copies = _contiguous_spans(arrays)
    for span in spans:
        dist.all_reduce(span, dist.ReduceOp.SUM)
        if world > 1:
            backend.mul(span, 1.0 / world, out=span)
    for raw, staged in copies:
        backend.copy_(raw, staged)


# ---------------------------------------------------------------------- gradient averaging
class _GradientAverager:
    """The optimizer's gradient hook (optim.optimizer.GRADIENT_HOOKS): before an update, it
    averages the gradients of replicated parameters (those of a DistributedDataParallel) over
    the processes.

    Every process must take part in the same collectives in the same order, so a replicated
    parameter without a gradient on this process gets a zero one (a parameter this process's
    batch did not reach contributes zero to the average) and the whole buffer is averaged."""

    def __init__(self):
        self.replicated = {}         # id(parameter) -> weakref to it
        self.averaged = set()        # ids whose current gradients reduce_gradients() averaged
        self.kinds = weakref.WeakKeyDictionary()  # flat bucket -> whether it is replicated

    def add(self, params):
        if self not in _optimizer.GRADIENT_HOOKS:
            _optimizer.GRADIENT_HOOKS.append(self)
        for p in params:
            self.replicated[id(p)] = weakref.ref(p)

    def forget(self):
        self.replicated.clear()
        self.averaged.clear()
        self.kinds = weakref.WeakKeyDictionary()

    def is_replicated(self, p) -> bool:
        ref = self.replicated.get(id(p))
        return ref is not None and ref() is p

    def _kind(self, params, where):
        """Whether the parameters are replicated (all of them) or not (none): one group of an
        optimizer cannot mix them, the others would drift apart between processes."""
        flags = [self.is_replicated(p) for p in params]
        if any(flags) and not all(flags):
            alone = [tuple(p.shape) for p, f in zip(params, flags) if not f]
            raise RuntimeError(f"{where}: a parameter group mixes parameters of a "
                               f"DistributedDataParallel model with {len(alone)} other(s) "
                               f"(shapes {alone}), whose gradients would not be averaged "
                               "across processes; wrap the module that holds them too, or "
                               "give them an optimizer of their own")
        return bool(flags) and all(flags)

    def _consume(self, params) -> bool:
        """Whether reduce_gradients() averaged these gradients already (forgotten now)."""
        if not self.averaged:
            return False
        ids = [id(p) for p in params]
        done = all(i in self.averaged for i in ids)
        self.averaged.difference_update(ids)
        return done

    def reduce_bucket(self, bucket, present):
        """A fused optimizer's flat bucket, its gradients collected: average its gradient
        buffer in one all-reduce. Returns which slots have a gradient now (all of them)."""
        if bucket not in self.kinds:
            self.kinds[bucket] = self._kind(bucket.params, "optimizer.step")
        if not self.kinds[bucket] or self._consume(bucket.params):
            return present
        if not all(present):
            backend = get_backend()
            for i, here in enumerate(present):
                if not here:
                    backend.fill_(bucket.grad_views[i], 0.0)
                    bucket.params[i].grad = Tensor._wrap(bucket.grad_views[i])
        average_([bucket.grad_flat])
        for p in bucket.params:
            p.grad._bump_version()
        return [True] * len(present)

    def reduce_params(self, params):
        """A hand-written optimizer's parameters: average the gradients of the replicated ones."""
        params = [p for p in params if self.is_replicated(p)]
        if params and not self._consume(params):
            _average_gradients(params)


def _average_gradients(params):
    """Give every parameter a gradient (zeros where it has none) and average them all."""
    backend = get_backend()
    for p in params:
        if p.grad is None:
            buffer = p._grad_buffer
            if buffer is None:
                buffer = backend.empty(p.shape, p.dtype, p.device)
            backend.fill_(buffer, 0.0)
            p.grad = Tensor._wrap(buffer)
    average_([p.grad._data for p in params])
    for p in params:
        p.grad._bump_version()


_AVERAGER = _GradientAverager()


class DistributedDataParallel(Module):
    """A model trained by every process of the group at once, as
    torch.nn.parallel.DistributedDataParallel: `model = DistributedDataParallel(model)`.

    At construction, the parameters and buffers of process 0 overwrite everyone's, so all
    processes start from the same model. Calling it runs the module. A tritonad optimizer's
    step() then averages the gradients of its parameters over the processes before the update
    (one all-reduce per flat gradient buffer); for an update of your own, call
    `model.reduce_gradients()` after backward() (an optimizer.step() that follows does not
    average again). Gradient clipping sees the averaged gradients only after reduce_gradients():
    clip_grad_norm_ before it clips each process's own. Every process must give gradients to
    the same parameters (one without a gradient here counts as zero in the average).

    state_dict() keys start with "module." as torch's; `model.module` is the wrapped module.
    device_ids, output_device, dim, bucket_cap_mb, find_unused_parameters, check_reduction,
    gradient_as_bucket_view and static_graph are accepted for torch code and change nothing
    (one process per device; the optimizer's flat buffers are the buckets; unused parameters
    average as zeros); process_group must be None (the default group). The averaging runs in
    tritonad.optim.Optimizer.step(): an optimizer that overrides step() itself must call
    model.reduce_gradients() first.
    """

    def __init__(self, module, device_ids=None, output_device=None, dim=0,
                 broadcast_buffers=True, process_group=None, bucket_cap_mb=None,
                 find_unused_parameters=False, check_reduction=False,
                 gradient_as_bucket_view=False, static_graph=False):
        super().__init__()
        if not isinstance(module, Module):
            raise TypeError(f"DistributedDataParallel: expected a tritonad nn.Module, got "
                            f"{type(module).__name__}")
        if not is_initialized():
            raise RuntimeError("DistributedDataParallel: no process group; call "
                               "tritonad.distributed.init_process_group() first, in a process "
                               "that torchrun started")
        if process_group is not None:
            raise NotImplementedError("DistributedDataParallel: process_group= is not "
                                      "supported; the model is replicated over the default "
                                      "group of init_process_group()")
        self.module = module
        self.broadcast_buffers = bool(broadcast_buffers)
        params = [p for p in module.parameters() if p.requires_grad]
        if dist.get_backend() == "nccl":
            on_cpu = sorted({name for name, p in module.named_parameters()
                             if p.device.type != "cuda"})
            if on_cpu:
                raise RuntimeError(f"DistributedDataParallel: NCCL communicates GPU memory but "
                                   f"parameters {', '.join(on_cpu[:4])} are on the CPU; move "
                                   f"the model first: model.to({str(local_device())!r})")
        broadcast_(p._data for p in list(module.parameters()) + list(module.buffers()))
        _AVERAGER.add(params)
        self._params = params

    def forward(self, *args, **kwargs):
        if self.broadcast_buffers:  # buffers follow process 0's, as torch's DDP does
            buffers = [b._data for b in self.module.buffers()]
            if buffers:
                broadcast_(buffers)
        return self.module(*args, **kwargs)

    def reduce_gradients(self):
        """Average the gradients of the replicated parameters over the processes now (zeros
        where one has none); the next optimizer.step() will not average them again."""
        _average_gradients(self._params)
        _AVERAGER.averaged.update(id(p) for p in self._params)

    @contextlib.contextmanager
    def no_sync(self):
        """torch's context for gradient accumulation; nothing to do here: the gradients are
        averaged once, by the optimizer.step() that follows the accumulated backward passes."""
        yield

    def extra_repr(self):
        return f"world_size={get_world_size()}"


def __getattr__(name):  # a missing PyTorch name says what to use instead (see _hints.py)
    from ._hints import missing
    raise missing(__name__, name, globals())

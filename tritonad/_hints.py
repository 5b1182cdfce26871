"""What to use instead of a PyTorch name that tritonad lacks: the AttributeError of a missing
name in `tritonad`, `tritonad.nn`, `tritonad.optim` and `tritonad.data` says it.

    >>> td.optim.LBFGS
    AttributeError: module 'tritonad.optim' has no attribute 'LBFGS'; not supported yet;
    tritonad.optim has the optimizers SGD, Adam, AdamW, Adadelta, ... and the schedulers ...

Each of those modules ends with `def __getattr__(name): raise missing(__name__, name)`;
Python calls it only for names the module does not have, so an entry below never hides a real
attribute (a name added later simply stops being missing).
"""
from __future__ import annotations

_NOT_YET = "not supported yet"
_DTYPES = ("tritonad has float64, float32, float16, bfloat16, int64, int32, uint8 and bool")

HINTS = {
    "tritonad": {
        "as_tensor": "use td.tensor(data) (a copy) or td.from_numpy(array)",
        "FloatTensor": "use td.tensor(data, dtype=td.float32)",
        "LongTensor": "use td.tensor(data, dtype=td.int64)",
        "mm": "use td.matmul(a, b) or a @ b", "bmm": "use td.matmul(a, b) or a @ b",
        "clip": "use td.clamp(x, min, max)",
        "inference_mode": "use td.no_grad()",
        "randint": "not available; (td.rand(n) * high).long() draws from [0, high)",
        "Generator": "not available; seed with td.manual_seed(seed), or give a DataLoader "
                     "generator=<int seed> of its own",
        "set_float32_matmul_precision": "use td.set_matmul_precision('highest' | 'high')",
        "backends": "td.set_backend('triton' | 'numpy') picks the backend; "
                    "td.set_matmul_precision and td.set_conv_precision set TF32 use",
        "compile": "not needed: every tritonad op is a Triton kernel already; "
                   "tritonad.train.Trainer(graph=True) captures a training step in a CUDA graph",
        "jit": "not needed: every tritonad op is a Triton kernel already",
        "autograd": "use td.grad(outputs, inputs) and tensor.backward(); gradient checks are in "
                    "tritonad.autodiff.gradcheck",
        "datasets": "torchvision.datasets' MNIST and FashionMNIST are in tritonad.data",
        "int16": _DTYPES, "int8": _DTYPES, "uint16": _DTYPES, "uint32": _DTYPES,
        "uint64": _DTYPES, "complex64": _DTYPES, "complex128": _DTYPES,
        "float8_e4m3fn": _DTYPES, "float8_e5m2": _DTYPES,
        **dict.fromkeys(("sin", "cos", "einsum",
                         "topk", "sort", "cumsum", "linspace", "eye", "log1p", "expm1", "erf",
                         "amp", "onnx", "fx"), _NOT_YET),
    },
    "tritonad.nn": {
        "SiLU": "not available; use x * x.sigmoid()",
        "L1Loss": "not available; use (output - target).abs().mean()",
        "AdaptiveAvgPool2d": "not available; for an output of 1x1 use x.mean((2, 3), "
                             "keepdim=True), otherwise nn.AvgPool2d with a fitting kernel",
        "Dropout2d": "not available; nn.Dropout drops single elements",
        "DataParallel": "not available; for several GPUs use "
                        "tritonad.distributed.DistributedDataParallel under torchrun",
        "parallel": "tritonad.distributed has DistributedDataParallel (under torchrun)",
        **dict.fromkeys(("BatchNorm1d", "BatchNorm2d", "LayerNorm", "GroupNorm", "Embedding",
                         "LSTM", "GRU", "RNN", "Transformer", "MultiheadAttention",
                         "ConvTranspose2d", "Conv1d", "Conv3d", "GELU", "LeakyReLU", "ELU",
                         "Softplus", "BCELoss", "BCEWithLogitsLoss", "SmoothL1Loss",
                         "HuberLoss", "KLDivLoss", "ParameterList", "Upsample",
                         "Unflatten"), _NOT_YET),
    },
    "tritonad.optim": dict.fromkeys(
        ("LBFGS", "SparseAdam", "Adamax", "NAdam", "RAdam", "ASGD", "Rprop",
         "ReduceLROnPlateau", "CyclicLR", "PolynomialLR", "ChainedScheduler",
         "CosineAnnealingWarmRestarts"), _NOT_YET),
    "tritonad.distributed": {
        "DistributedSampler": "use DataLoader(..., shard=tritonad.distributed.shard()): each "
                              "process gets its own part of every epoch",
    },
    "tritonad.data": {
        "get_worker_info": "not needed: the DataLoader runs in the calling process "
                           "(num_workers is accepted and ignored)",
        **dict.fromkeys(("ChainDataset", "Sampler", "RandomSampler",
                         "SequentialSampler", "BatchSampler", "WeightedRandomSampler",
                         "SubsetRandomSampler"),
                        "not supported yet; DataLoader(dataset, batch_size, shuffle, drop_last, "
                        "generator) covers sequential and shuffled sampling"),
        "DistributedSampler": "use DataLoader(dataset, batch_size, shuffle, "
                              "shard=tritonad.distributed.shard()): each process its own part",
        **dict.fromkeys(("CIFAR10", "CIFAR100", "KMNIST", "EMNIST", "QMNIST", "SVHN",
                         "ImageFolder", "ImageNet"),
                        "not available; any map-style dataset (a class with __getitem__ and "
                        "__len__) works with DataLoader"),
    },
}


def _available(module_name: str, namespace: dict) -> str:
    """What the module offers in place of a missing class, read from it now (so that classes
    added later are listed): its optimizers and schedulers, layers, or datasets."""
    def subclasses(base):
        return [name for name, value in namespace.items() if isinstance(value, type) and
                issubclass(value, base) and value is not base and not name.startswith("_")]

    if module_name == "tritonad.optim":
        from .optim.lr_scheduler import LRScheduler
        from .optim.optimizer import Optimizer
        return (f"tritonad.optim has the optimizers {', '.join(subclasses(Optimizer))} and the "
                f"schedulers {', '.join(subclasses(LRScheduler))}")
    if module_name == "tritonad.nn":
        from .nn.module import Module
        return f"tritonad.nn has {', '.join(subclasses(Module))}"
    if module_name == "tritonad.data":
        datasets = [name for name, value in namespace.items() if isinstance(value, type) and
                    value.__module__ == module_name and hasattr(value, "__getitem__")]
        return f"tritonad.data has DataLoader and the datasets {', '.join(datasets)}"
    return ""


def missing(module_name: str, name: str, namespace: dict) -> AttributeError:
    """The AttributeError for `module_name.name`, with what to use instead where we know."""
    message = f"module {module_name!r} has no attribute {name!r}"
    if name.startswith("_"):  # Python and tools probe for these; a plain error
        return AttributeError(message)
    hint = HINTS.get(module_name, {}).get(name)
    offer = _available(module_name, namespace) if name[:1].isupper() or hint else ""
    details = "; ".join(part for part in (hint, offer) if part)
    return AttributeError(f"{message}; {details}" if details else message)

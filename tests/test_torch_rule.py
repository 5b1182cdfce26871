"""The torch rule (DESIGN §2), enforced by reading the source of tritonad/.

Inside tritonad/ (the numpy backend included) torch may allocate, make metadata views,
move memory between host and device, name dtypes, devices, streams and graphs, and communicate
between processes (torch.distributed's process groups and collectives: all_reduce, broadcast,
all_gather, barrier, ...). Everything that computes is one of our kernels. The scan flags:
- any `torch.<name>` outside the allowed set (torch.exp, torch.zeros, torch.nn, ...), and any
  `torch.distributed.<name>` (or `dist.<name>` after `import torch.distributed as dist`) that is
  not communication (torch.distributed.nn, DTensor, FSDP, ... compute);
- compute methods called on raw arrays: on `<expr>._data`, on the raw arguments of a Function's
  forward, and on anything at all inside tritonad/kernels/ (where every array is raw).
"""
import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1] / "tritonad"
EXEMPT = set()

ALLOWED_TORCH = {
    # allocation
    "empty", "empty_like", "empty_strided",
    # metadata views and transfers
    "as_strided", "from_numpy", "device", "Size", "Tensor", "is_tensor",
    # dtypes
    "dtype", "float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8",
    "uint8", "bool", "long", "half", "float", "double", "finfo", "iinfo",
    # devices, streams, events, graphs, memory statistics
    "cuda", "Stream", "Event", "version", "__version__", "backends", "profiler",
    "distributed",
}
ALLOWED_CUDA = {
    "is_available", "current_device", "device_count", "set_device", "synchronize", "Stream",
    "Event", "stream", "current_stream", "default_stream", "CUDAGraph", "graph",
    "graph_pool_handle", "is_current_stream_capturing", "get_device_name",
    "get_device_properties", "get_device_capability", "memory_allocated",
    "max_memory_allocated", "reset_peak_memory_stats", "memory_reserved", "mem_get_info",
    "empty_cache", "device", "make_graphed_callables",
}
# the current device and stream, as Triton's own launcher reads them (the lean launch path), and
# raw memory from torch's caching allocator (a descriptor kernel's scratch, as Triton takes it)
ALLOWED_C = {"_cuda_getCurrentRawStream", "_cuda_getDevice",
             "_cuda_cudaCachingAllocator_raw_alloc", "_cuda_cudaCachingAllocator_raw_delete"}
# process groups and collectives: communication (the sums of an all-reduce happen inside the
# collective); the rest of torch.distributed (nn, tensor, fsdp, optim, ...) computes
ALLOWED_DISTRIBUTED = {
    "is_available", "is_initialized", "init_process_group", "destroy_process_group",
    "get_rank", "get_world_size", "get_backend", "is_nccl_available", "is_gloo_available",
    "new_group", "Backend", "ProcessGroup", "ReduceOp", "GroupMember", "group", "Work",
    "TCPStore", "FileStore", "HashStore", "PrefixStore", "Store",
    "all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce",
    "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "gather",
    "scatter", "send", "recv", "isend", "irecv", "batch_isend_irecv", "P2POp", "barrier",
    "monitored_barrier", "broadcast_object_list", "all_gather_object",
}
COMPUTE_METHODS = {
    "abs", "add", "add_", "addmm", "all", "any", "argmax", "argmin", "bmm", "cat", "clamp",
    "clamp_", "clip", "clone", "contiguous", "copy_", "cos", "cumsum", "div", "div_", "double",
    "exp", "fill_", "float", "gather", "half", "index_add_", "index_select", "log",
    "masked_fill", "matmul", "max", "mean", "min", "mm", "mul", "mul_", "neg", "norm", "pow",
    "relu", "scatter_add_", "sigmoid", "sin", "softmax", "sort", "sqrt", "square", "sub", "sub_",
    "sum", "tanh", "topk", "var", "where", "zero_", "long", "int", "bfloat16", "type",
    "masked_scatter", "normal_", "uniform_", "random_", "bernoulli_", "nonzero", "unique",
}


def _sources():
    for path in sorted(ROOT.rglob("*.py")):
        if path.name not in EXEMPT:
            yield path


def _torch_attribute_chain(node, aliases=None):
    """For torch.a.b -> ["a", "b"] (and for d.b after `import torch.a as d`); None when the root
    is not the name torch or an alias of a torch module."""
    chain = []
    while isinstance(node, ast.Attribute):
        chain.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and node.id == "torch":
        return list(reversed(chain))
    if isinstance(node, ast.Name) and aliases and node.id in aliases:
        return aliases[node.id] + list(reversed(chain))
    return None


def _torch_aliases(tree):
    """Names bound to torch submodules: {"dist": ["distributed"]} for `import
    torch.distributed as dist` or `from torch import distributed as dist`."""
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname and a.name.startswith("torch."):
                    aliases[a.asname] = a.name.split(".")[1:]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and \
                (node.module == "torch" or node.module.startswith("torch.")):
            for a in node.names:
                aliases[a.asname or a.name] = node.module.split(".")[1:] + [a.name]
    return aliases


# tritonad/torch_backend/ names PyTorch's aten operators (torch.ops.aten.add.Tensor) to run them on
# our kernels, and hooks PyTorch's dispatcher (torch.utils._python_dispatch); naming an operator
# computes nothing. Its fallback to PyTorch's own kernel is `func(*args)`, the point of a fallback.
ALLOWED_TORCH_BACKEND = {"ops", "utils", "library", "_ops"}


def _forbidden(chain, torch_backend=False):
    """Whether the torch attribute chain (["cuda", "graph"]) is outside the rule."""
    if torch_backend and chain[0] in ALLOWED_TORCH_BACKEND:
        return False
    if chain[0] == "_C":
        return not (len(chain) == 2 and chain[1] in ALLOWED_C)
    if chain[0] not in ALLOWED_TORCH:
        return True
    if chain[0] == "cuda" and len(chain) > 1:
        return chain[1] not in ALLOWED_CUDA
    if chain[0] == "distributed" and len(chain) > 1:
        return chain[1] not in ALLOWED_DISTRIBUTED
    return False


def _violations(path):
    tree = ast.parse(path.read_text(), filename=str(path))
    aliases = _torch_aliases(tree)
    in_kernels = "kernels" in path.parts
    torch_backend = "torch_backend" in path.parts
    parents = {id(child): node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    forward_args = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "forward":
            names = {a.arg for a in node.args.args[1:]}  # the raw arrays (after ctx)
            for inner in ast.walk(node):
                forward_args[id(inner)] = names
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and not isinstance(parents.get(id(node)), ast.Attribute):
            chain = _torch_attribute_chain(node, aliases)
            if chain and _forbidden(chain, torch_backend):
                found.append((node.lineno, "torch." + ".".join(chain)))
        if isinstance(node, ast.Import):
            modules = [a.name.split(".")[1:] for a in node.names if a.name.startswith("torch.")]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                (node.module == "torch" or node.module.startswith("torch.")):
            modules = [node.module.split(".")[1:] + [a.name] for a in node.names]
        else:
            modules = []
        for chain in modules:
            if chain and (chain[0] == "nn" or (chain[0] == "distributed" and _forbidden(chain))):
                found.append((node.lineno, "import of torch." + ".".join(chain)))
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        method, target = node.func.attr, node.func.value
        if method not in COMPUTE_METHODS or _torch_attribute_chain(target, aliases) is not None:
            continue
        on_raw = isinstance(target, ast.Attribute) and target.attr == "_data"
        on_forward_arg = isinstance(target, ast.Name) and target.id in forward_args.get(id(node), ())
        # in kernels/ every array is raw; tl.*, gl.* (Gluon), math.* and numpy calls are not
        # torch
        in_kernel_code = in_kernels and not (isinstance(target, ast.Name) and
                                             target.id in ("tl", "gl", "triton", "math", "np",
                                                           "libdevice"))
        if on_raw or on_forward_arg or in_kernel_code:
            found.append((node.lineno, f".{method}() on raw memory"))
    return found


@pytest.mark.parametrize("path", list(_sources()), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_torch_computation_inside_tritonad(path):
    bad = _violations(path)
    assert not bad, f"{path.relative_to(ROOT.parent)}: torch computes here:\n" + "\n".join(
        f"  line {line}: {what}" for line, what in bad)


def test_the_scan_catches_violations(tmp_path):
    """The checker itself: each forbidden pattern is found, allowed ones are not."""
    sample = tmp_path / "kernels" / "sample.py"
    sample.parent.mkdir()
    sample.write_text(
        "import torch\n"
        "a = torch.empty(3)\n"            # allowed
        "b = torch.zeros(3)\n"            # computes
        "c = a.contiguous()\n"            # computes (in kernels/)
        "d = torch.nn.functional.relu(a)\n"
        "e = torch.cuda.synchronize()\n"  # allowed
        "f = torch.cuda.amp.autocast()\n"  # not in the allowed cuda set
        "g = torch._C._cuda_getDevice()\n"  # allowed: where launches go
        "h = torch._C._nn.linear(a, a)\n"  # computes
        "class F:\n"
        "    def forward(ctx, x):\n"
        "        return x.sum()\n"        # computes on a raw forward argument
        "import torch.distributed as dist\n"
        "dist.all_reduce(a._data, dist.ReduceOp.SUM)\n"  # allowed: communication on raw memory
        "torch.distributed.broadcast(a._data.view(torch.uint8), 0)\n"  # allowed
        "dist.all_reduce(a._data.sum())\n"  # computes (the sum), then communicates
        "dist.nn.functional.all_reduce(a)\n"  # torch.distributed.nn: autograd compute
        "from torch.distributed import barrier, tensor\n"  # DTensor computes
        "from torch import distributed as d\n"
        "d.barrier(); d.fsdp.fully_shard(a)\n"  # the second computes
    )
    lines = sorted(line for line, _ in _violations(sample))
    assert lines == [3, 4, 5, 7, 9, 12, 16, 17, 18, 20]

"""tritonad: a small deep-learning framework whose every operator is a Triton kernel.

    import tritonad as td
    x = td.tensor([[1., 2.], [3., 4.]], requires_grad=True)
    (x @ x).relu().sum().backward()
    print(x.grad)
"""
from torch import device as _torch_device

from . import dtypes
from .autodiff import enable_grad, grad, is_grad_enabled, no_grad, set_grad_enabled
from .autodiff.ops import (abs, add, amax, amin, argmax, argmin, div, eq, exp, ge, gt, le, log,
                           lt, matmul, max, maximum, mean, min, minimum, mul, ne, neg, pow, relu,
                           reshape, sigmoid, softmax, log_softmax, logsumexp, sqrt, sub, sum,
                           tanh,
                           transpose, var, where, clamp, permute, flatten, unsqueeze, squeeze)
from .autodiff.ops import std
from .autodiff.ops import reduce_all as all, reduce_any as any  # noqa: A001  (td.all, td.any)
from .autodiff.shape_ops import cat, stack
from .autodiff.scan_ops import (argsort, cummax, cummin, cumprod, cumsum,  # noqa: F401
                                logcumsumexp, sort, topk)  # scans, sorting and tensor ops
from .autodiff.tensor_ops import bmm, einsum, mm, tril, triu  # noqa: F401
# embeddings and indexing
from .autodiff.index_ops import (gather, index_add, index_put, index_select,  # noqa: F401
                                 masked_fill, masked_select, scatter, scatter_add,
                                 scatter_reduce, take_along_dim)
from .autodiff import elementwise as _elementwise
globals().update({name: f for name, f in _elementwise.FUNCTIONS.items()  # the table's ops
                  if name not in globals() and name not in ("clamp_tensor", "gelu_tanh")},
                 gelu=_elementwise.gelu)  # (add, sub, div, clamp: ops' forms with their options)
from .backend import (Backend, autotune, autotuning, conv_precision, get_backend,
                      matmul_precision, register_backend, set_backend, set_conv_precision,
                      set_matmul_precision, set_sync_checks, sync_checks, use_backend)
from .dtypes import (DType, bfloat16, float16, float32, float64, int32, int64, uint8)
from .dtypes import bool_ as bool  # noqa: A001  (td.bool, as torch.bool)
from .generator import get_rng_state, initial_seed, manual_seed, seed, set_rng_state
from .tensor import (Tensor, arange, empty, empty_like, from_numpy, from_torch, full, full_like,
                     is_tensor, normal, ones, ones_like, rand, rand_like, randn, randn_like,
                     randperm, tensor, uniform, zeros, zeros_like)
from . import reference  # noqa: F401,E402  (registers the numpy backend)
from . import kernels  # noqa: F401,E402  (registers the triton backend)
from . import nn  # noqa: F401,E402
from . import corpus, data, optim  # noqa: F401,E402
from . import amp  # noqa: F401,E402
from .amp import autocast, get_autocast_dtype, is_autocast_enabled  # noqa: F401,E402
from . import distributed  # noqa: F401,E402
from .serialization import load, save  # noqa: F401,E402

from . import accelerator, cuda  # noqa: F401,E402  (td.cuda.is_available() and friends)
# ---- the small pieces: eye, linspace, randint, isclose, unbind, legacy constructors, linalg
from .conveniences import (BFloat16Tensor, BoolTensor, ByteTensor, DoubleTensor,  # noqa: E402
                           FloatTensor, HalfTensor, IntTensor, LongTensor, allclose, chunk, eye,
                           isclose, linspace, logspace, randint, split, unbind)
from .generator import Generator  # noqa: E402
from . import linalg  # noqa: F401,E402
from . import utils  # noqa: F401,E402  (td.utils.data, as torch.utils.data)

device = _torch_device  # td.device("cuda"): torch's device type, which tritonad tensors carry
half = float16
float = float32  # noqa: A001
double = float64
long = int64
concat = concatenate = cat

__version__ = "0.1.0"


def __getattr__(name):  # a missing PyTorch name says what to use instead (see _hints.py)
    from ._hints import missing
    raise missing(__name__, name, globals())

"""What to use instead of a PyTorch name that tritonad lacks: the AttributeError of a missing
name in `tritonad`, `tritonad.nn`, `tritonad.nn.functional`, `tritonad.optim` and
`tritonad.data`, and of a missing Tensor method (`missing_method`), says it.

    >>> td.optim.LBFGS
    AttributeError: module 'tritonad.optim' has no attribute 'LBFGS'; not supported yet;
    tritonad.optim has the optimizers SGD, Adam, AdamW, Adadelta, ... and the schedulers ...

Each of those modules ends with `def __getattr__(name): raise missing(__name__, name)`;
Python calls it only for names the module does not have, so an entry below never hides a real
attribute (a name added later simply stops being missing).
"""
from __future__ import annotations

_NOT_YET = "not supported yet"


def _names(text):
    return tuple(text.split())


_DTYPES = ("tritonad has float64, float32, float16, bfloat16, int64, int32, uint8 and bool")

HINTS = {
    "tritonad": {
        "as_tensor": "use td.tensor(data) (a copy) or td.from_numpy(array)",
        "clip": "use td.clamp(x, min, max)",
        "inference_mode": "use td.no_grad()",
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
        **dict.fromkeys(("onnx", "fx"), _NOT_YET),
    },
    "tritonad.nn": {
        "DataParallel": "not available; for several GPUs use "
                        "tritonad.distributed.DistributedDataParallel under torchrun",
        "parallel": "tritonad.distributed has DistributedDataParallel (under torchrun)",
        **dict.fromkeys(("Transformer", "TransformerDecoderLayer", "Conv3d"), _NOT_YET),
    },
    "tritonad.nn.functional": {
        "relu_": "use F.relu(x)", "logsigmoid": "use x.sigmoid().log()",
        "softmin": "use F.softmax(-x, dim)",
        "max_pool2d_with_indices": "use F.max_pool2d(x, ..., return_indices=True)",
        **dict.fromkeys(("dropout3d", "alpha_dropout",
                         "feature_alpha_dropout"),
                        "not available; F.dropout drops single elements"),
        **dict.fromkeys(_names("""
            adaptive_avg_pool1d adaptive_avg_pool3d adaptive_max_pool1d
            adaptive_max_pool1d_with_indices adaptive_max_pool2d
            adaptive_max_pool2d_with_indices adaptive_max_pool3d
            adaptive_max_pool3d_with_indices affine_grid avg_pool1d avg_pool3d
            bilinear celu celu_ channel_shuffle conv3d conv_tbc conv_transpose1d
            conv_transpose3d cosine_embedding_loss ctc_loss elu_ embedding_bag
            fractional_max_pool2d fractional_max_pool2d_with_indices
            fractional_max_pool3d fractional_max_pool3d_with_indices gaussian_nll_loss
            glu grid_sample grouped_mm gumbel_softmax hardshrink hardsigmoid hardtanh_
            hinge_embedding_loss instance_norm leaky_relu_ local_response_norm
            lp_pool1d lp_pool2d lp_pool3d margin_ranking_loss max_pool1d
            max_pool1d_with_indices max_pool3d max_pool3d_with_indices max_unpool1d
            max_unpool2d max_unpool3d multi_head_attention_forward multi_margin_loss
            multilabel_margin_loss multilabel_soft_margin_loss native_channel_shuffle
            pdist pixel_shuffle pixel_unshuffle poisson_nll_loss prelu rrelu rrelu_
            scaled_grouped_mm scaled_mm selu selu_ soft_margin_loss softshrink
            softsign tanhshrink threshold threshold_ triplet_margin_loss
            triplet_margin_with_distance_loss upsample upsample_bilinear
            upsample_nearest"""), _NOT_YET),
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


# torch's other names for Tensor methods we have
METHOD_ALIASES = {
    "absolute": "abs", "multiply": "mul", "divide": "div", "true_divide": "div",
    "subtract": "sub", "negative": "neg", "greater": "gt", "greater_equal": "ge", "less": "lt",
    "less_equal": "le", "not_equal": "ne", "swapaxes": "transpose", "swapdims": "transpose",
    "moveaxis": "permute", "movedim": "permute", "ravel": "flatten", "unflatten": "reshape",
    "tile": "repeat", "tensor_split": "split", "split_with_sizes": "split",
    "sum_to_size": "sum", "nelement": "numel"}

# Tensor methods of torch that tritonad's Tensor lacks. An in-place `name_` says to use the
# out-of-place form where that exists or has a hint (see missing_method), so only the other
# in-place names are listed here.
METHOD_HINTS = {
    **{alias: f"use x.{ours}(...)" for alias, ours in METHOD_ALIASES.items()},
    **dict.fromkeys(("mm", "bmm", "mv", "dot", "vdot", "inner"),
                    "use a @ b (td.matmul)"),
    "outer": "use a.unsqueeze(1) * b.unsqueeze(0)",
    "ndimension": "use x.ndim", "is_floating_point": "use x.dtype.is_floating_point",
    "is_cpu": "use x.device.type == 'cpu'", "nbytes": "use x.numel() * x.element_size()",
    "itemsize": "use x.element_size()",
    "trunc": "use x.div(1, rounding_mode='trunc')", "fix": "use x.div(1, rounding_mode='trunc')",
    "floor": "use x.div(1, rounding_mode='floor')",
    "floor_divide": "use a.div(b, rounding_mode='floor')",
    "ceil": "use -((-x).div(1, rounding_mode='floor'))",
    "log1p": "use (1 + x).log()", "expm1": "use x.exp() - 1", "exp2": "use 2 ** x",
    "log2": "use x.log() / math.log(2)", "log10": "use x.log() / math.log(10)",
    "logical_not": "use ~mask (a bool tensor)", "logical_and": "use td.where(a, b, False)",
    "logical_or": "use td.where(a, True, b)",
    "count_nonzero": "use (x != 0).sum(dim)", "nansum": "use td.where(x == x, x, 0.0).sum()",
    "allclose": "use ((a - b).abs() <= atol + rtol * b.abs()).all()",
    "isclose": "use (a - b).abs() <= atol + rtol * b.abs()",
    "equal": "use a.shape == b.shape and bool((a == b).all())",
    "index_select": "use x[indices] or x[:, indices] (integer indexing)",
    "take_along_dim": "use integer indexing", "narrow": "use slicing: x[:, start:start + length]",
    "select": "use indexing: x[:, i]", "unbind": "use x.split(1, dim) (then squeeze)",
    "logsumexp": "use x.amax(dim, keepdim=True) + (x - x.amax(dim, keepdim=True)).exp()"
                 ".sum(dim, keepdim=True).log()",
    "byte": "use x.to(td.uint8)", "char": _DTYPES, "short": _DTYPES, "cfloat": _DTYPES,
    "cdouble": _DTYPES, "chalf": _DTYPES,
    "storage_offset": "tritonad tensors keep their torch memory in x.torch()",
    "uniform_": "use td.rand(shape) * (high - low) + low (or nn.init.uniform_ on a parameter)",
    "normal_": "use td.randn(shape) * std + mean (or nn.init.normal_ on a parameter)",
    **dict.fromkeys(_names("""
        H acos acos_ acosh acosh_ addbmm addbmm_ addcdiv_ addcmul_ addmm
        addmm_ addmv addmv_ addr addr_ adjoint aminmax angle apply_ arccos arccos_ arccosh
        arccosh_ arcsin arcsin_ arcsinh arcsinh_ arctan arctan2 arctan2_ arctan_ arctanh
        arctanh_ argsort argwhere as_strided as_strided_ as_strided_scatter as_subclass asin
        asin_ asinh asinh_ atan atan2 atan2_ atan_ atanh atanh_ baddbmm baddbmm_ bernoulli
        bernoulli_ bincount bitwise_and bitwise_and_ bitwise_left_shift bitwise_left_shift_
        bitwise_or bitwise_or_ bitwise_right_shift bitwise_right_shift_ bitwise_xor
        bitwise_xor_ cauchy_ ccol_indices cholesky cholesky_inverse cholesky_solve clamp_max
        clamp_max_ clamp_min clamp_min_ coalesce col_indices conj conj_physical
        conj_physical_ const_data_ptr copysign copysign_ corrcoef cos cos_ cosh cosh_ cov
        cross crow_indices cummax cummin cumprod cumprod_ cumsum cumsum_ deg2rad deg2rad_
        dense_dim dequantize det diag diag_embed diagflat diagonal diagonal_scatter diff
        digamma digamma_ dim_order dist dsplit eig erf erf_ erfc erfc_ erfinv erfinv_
        exponential_ fill_diagonal_ flip fliplr flipud float_power float_power_ fmax fmin fmod
        fmod_ frac frac_ frexp gather gcd gcd_ geometric_ geqrf ger get_device grad_dtype
        hardshrink hash_tensor heaviside heaviside_ histc histogram hsplit hypot hypot_ i0 i0_
        igamma igamma_ igammac igammac_ imag index index_add index_add_ index_copy
        index_copy_ index_fill index_fill_ index_put index_put_ index_reduce index_reduce_
        indices int_repr inverse ipu is_coalesced is_complex is_conj is_distributed
        is_inference is_ipu is_maia is_meta is_mkldnn is_mps is_mtia is_neg is_nested
        is_nonzero is_pinned is_quantized is_same_size is_set_to is_shared is_signed is_sparse
        is_sparse_csr is_vulkan is_xla is_xpu isneginf isposinf isreal istft kron kthvalue
        layout lcm lcm_ ldexp ldexp_ lerp lerp_ lgamma lgamma_ log_normal_ logaddexp
        logaddexp2 logcumsumexp logdet logical_xor logical_xor_ logit logit_ lstsq lu
        lu_solve mH map2_ map_ masked_scatter masked_scatter_ masked_select matrix_exp
        matrix_power median mode module_load msort mtia multinomial mvlgamma mvlgamma_ name
        nan_to_num nan_to_num_ nanmean nanmedian nanquantile narrow_copy new
        new_empty_strided nextafter nextafter_ nonzero nonzero_static orgqr ormqr output_nr
        pin_memory pinverse polygamma polygamma_ positive prelu prod put put_
        q_per_channel_axis q_per_channel_scales q_per_channel_zero_points q_scale
        q_zero_point qr qscheme quantile rad2deg rad2deg_ random_ real record_stream
        register_hook register_post_accumulate_grad_hook reinforce remainder remainder_ renorm
        renorm_ repeat_interleave resize resize_ resize_as resize_as_ resize_as_sparse_
        resolve_conj resolve_neg retains_grad roll rot90 round round_ row_indices scatter
        scatter_ scatter_add scatter_add_ scatter_reduce scatter_reduce_ select_scatter set_
        sgn sgn_ share_memory_ signbit sin sin_ sinc sinc_ sinh sinh_ slice_inverse
        slice_scatter slogdet smm solve sort sparse_dim sparse_mask sparse_resize_
        sparse_resize_and_clear_ sspaddmm stft storage storage_type svd symeig take tan tan_
        to_dense to_mkldnn to_padded_tensor to_sparse to_sparse_bsc to_sparse_bsr
        to_sparse_coo to_sparse_csc to_sparse_csr topk trace triangular_solve tril tril_ triu
        triu_ unfold unique unique_consecutive unsafe_chunk unsafe_split
        unsafe_split_with_sizes untyped_storage values volatile vsplit xlogy xlogy_ xpu"""),
        _NOT_YET),
}


def missing_method(cls, name: str) -> AttributeError:
    """The AttributeError for `tensor.name`, with what to use instead where we know: an
    in-place `name_` whose out-of-place form exists points at it."""
    message = f"{cls.__name__!r} object has no attribute {name!r}"
    if name.startswith("_"):
        return AttributeError(message)
    hint = METHOD_HINTS.get(name)
    stem = name[:-1]
    if name.endswith("_") and hint is None:
        ours = METHOD_ALIASES.get(stem, stem)
        if hasattr(cls, ours + "_"):
            hint = f"use x.{ours}_(...)"
        elif hasattr(cls, ours) or stem in METHOD_HINTS:
            out_of_place = f"use x = x.{ours}(...)" if hasattr(cls, ours) else METHOD_HINTS[stem]
            hint = (f"out of place, {out_of_place}; in place there are add_, sub_, mul_, div_, "
                    "clamp_, fill_, zero_ and copy_")
    return AttributeError(f"{message}; {hint}" if hint else message)


def _available(module_name: str, namespace: dict) -> str:
    """What the module offers in place of a missing class, read from it now (so that classes
    added later are listed): its optimizers and schedulers, layers, or datasets."""
    def subclasses(base):  # (by the base's name: this module imports none of tritonad)
        return [name for name, value in namespace.items() if isinstance(value, type) and
                name != base and not name.startswith("_") and
                any(c.__name__ == base and c.__module__.startswith("tritonad.")
                    for c in value.__mro__[1:])]

    if module_name == "tritonad.optim":
        return (f"tritonad.optim has the optimizers {', '.join(subclasses('Optimizer'))} and "
                f"the schedulers {', '.join(subclasses('LRScheduler'))}")
    if module_name == "tritonad.nn":
        return f"tritonad.nn has {', '.join(subclasses('Module'))}"
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

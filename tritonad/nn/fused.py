"""FusedMLP: a ReLU MLP whose training step (forward, cross-entropy, backward) is one backend
call instead of a dozen per-op kernels and an autodiff graph.

    model = nn.FusedMLP.from_sequential(nn.Sequential(
        nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10)))
    for x, y in loader:
        opt.zero_grad()
        loss = model.loss_and_grads(x, y)   # the mean cross-entropy; .grad filled as backward()
        opt.step()

It is an nn.Sequential of the same layers: calling it runs the ordinary forward (for evaluation,
other losses, higher-order gradients), its state_dict is the Sequential's key for key, and
`to_sequential()` gives the plain Sequential back (the same Parameters, no copy).

What fuses (backend primitive mlp_cross_entropy_grads_, three kernels on a GPU): an optional
Flatten(1, -1), then Linear, ReLU, Linear or Linear, ReLU, Linear, ReLU, Linear, float32 with
biases, every parameter trainable; each width after the first layer at most MLP_MAX_WIDTH (256)
and at most MLP_MAX_CLASSES (64) classes; inputs [N, in_features] (or [N, ...] flattening to
it); int64 (or int32) class indices. Outside these limits (or with grad mode off, or parameters
on another device than x) loss_and_grads falls back to the per-op path, F.cross_entropy(model(x),
target).backward(), with the same result up to float rounding.
"""
from __future__ import annotations

from .. import dtypes
from ..backend import MLP_MAX_CLASSES, MLP_MAX_WIDTH, backend_of
from ..tensor import Tensor, zeros
from .layers import Flatten, Linear, ReLU, Sequential

_PLAIN = ([Linear, ReLU, Linear], [Linear, ReLU, Linear, ReLU, Linear])


def fusable(model, input_shape=None):
    """Why `model` cannot train with the fused MLP step (a sentence), or None if it can.
    input_shape: the shape of its inputs [N, ...], when known."""
    if not isinstance(model, Sequential):
        return f"it is a {type(model).__name__}, not a Sequential of Linear and ReLU layers"
    layers = list(model.children())
    flatten = bool(layers) and type(layers[0]) is Flatten
    if flatten:
        if (layers[0].start_dim, layers[0].end_dim) != (1, -1):
            return "its Flatten is not Flatten(1, -1)"
        layers = layers[1:]
    if [type(layer) for layer in layers] not in _PLAIN:
        names = ", ".join(type(layer).__name__ for layer in layers)
        return (f"its layers are {names}; the fused step takes Linear, ReLU, Linear (and "
                "optionally ReLU, Linear)")
    if not flatten and input_shape is not None and len(input_shape) != 2:
        return f"inputs of shape {tuple(input_shape)} need a Flatten first"
    linears = layers[0::2]
    for layer in linears:
        for name, p in (("weight", layer.weight), ("bias", layer.bias)):
            if p is None:
                return "a Linear has no bias"
            if p.dtype is not dtypes.float32:
                return f"a Linear's {name} is {p.dtype.name}, not float32"
            if not p.requires_grad:
                return f"a Linear's {name} does not require grad"
    for layer in linears[1:-1]:
        if layer.out_features > MLP_MAX_WIDTH:
            return (f"a hidden layer is {layer.out_features} wide; the fused step takes at "
                    f"most {MLP_MAX_WIDTH} after the first layer")
    if linears[-1].out_features > MLP_MAX_CLASSES:
        return (f"it has {linears[-1].out_features} classes; the fused step takes at most "
                f"{MLP_MAX_CLASSES}")
    if input_shape is not None:
        features = 1
        for n in input_shape[1:]:
            features *= n
        if features != linears[0].in_features:
            return (f"inputs of shape {tuple(input_shape)} have {features} features, the first "
                    f"Linear takes {linears[0].in_features}")
    return None


class FusedMLP(Sequential):
    """A ReLU MLP (an nn.Sequential of [Flatten,] Linear, ReLU, Linear[, ReLU, Linear]) with a
    fused training step: `loss_and_grads(x, target)` (module docstring)."""

    def __init__(self, *modules):
        super().__init__(*modules)
        why = fusable(self)
        if why is not None:
            raise ValueError(f"FusedMLP: cannot fuse this network: {why}")

    @classmethod
    def from_sequential(cls, sequential):
        """A FusedMLP of the same layers (shared Parameters: training one trains the other)."""
        why = fusable(sequential)
        if why is not None:
            raise ValueError(f"FusedMLP.from_sequential: cannot fuse this network: {why}")
        fused = cls.__new__(cls)
        Sequential.__init__(fused, *sequential.children())
        fused.train(sequential.training)
        return fused

    def to_sequential(self):
        """The plain nn.Sequential of the same layers."""
        plain = Sequential(*self.children())
        plain.train(self.training)
        return plain

    @property
    def linears(self):
        return [m for m in self.children() if type(m) is Linear]

    def loss_and_grads(self, x, target, rows=None, cursor=None, advance=False, metrics=None):
        """The mean cross-entropy of the network on a batch, with every parameter's gradient
        accumulated into its .grad as loss.backward() would (written straight into an
        optimizer's gradient buffer when .grad is None). Returns the loss, a 0-d tensor with no
        history (do not call backward on it).

        x: [N, in_features] or [N, ...] (flattened), target: [N] int64 class indices. The batch:
        all N rows; or rows [B] (int64 sample indices into x and target); or the row at
        `cursor` of a table rows [R, B] (cursor += 1 afterwards if `advance`), how a captured
        step reads its batch. metrics: None or (loss_total, correct) scalar tensors that the
        summed row losses and the count of correct predictions are added to, on the device."""
        from ..autodiff.grad_mode import is_grad_enabled
        from ..autodiff.nn_ops import cross_entropy_with_metrics, mlp_cross_entropy_grads

        flat = x if x.ndim == 2 else x.reshape(x.shape[0], -1)
        why = fusable(self, tuple(flat.shape))
        devices = {p.device for p in self.parameters()} | {flat.device, target.device}
        if why is None and is_grad_enabled() and len(devices) == 1:
            if metrics is None:
                metrics = (zeros((), device=flat.device),
                           zeros((), dtype=dtypes.int64, device=flat.device))
            return mlp_cross_entropy_grads(self.linears, flat, target, *metrics, rows=rows,
                                           cursor=cursor, advance=advance)
        # outside the fused step's limits: the same loss and gradients, per op
        if rows is not None:
            index = rows if cursor is None else _row_at(rows, cursor, advance)
            flat, target = flat[index], target[index]
        logits = self(flat)
        if metrics is None:
            from ..autodiff.nn_ops import cross_entropy
            loss = cross_entropy(logits, target)
        else:
            loss = cross_entropy_with_metrics(logits, target, *metrics)
        loss.backward()
        return loss.detach()


def _row_at(table, cursor, advance):
    """The index row a cursor points at, read on the device (the fallback of a fused call)."""
    raw = table._data if isinstance(table, Tensor) else table
    cursor_raw = cursor._data if isinstance(cursor, Tensor) else cursor
    out = Tensor._wrap(backend_of(raw).empty(raw.shape[1:], dtypes.int64, raw.device))
    backend_of(raw).take_row_(raw, cursor_raw, out._data, advance=advance)
    if isinstance(cursor, Tensor):
        cursor._bump_version()
    return out

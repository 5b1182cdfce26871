"""Parameter: a leaf Tensor that a Module registers as learnable."""
from __future__ import annotations

from ..tensor import Tensor, tensor


class Parameter(Tensor):
    """A Tensor that requires grad and is registered by the Module it is assigned to.

    `nn.Parameter(td.zeros(3))` shares the memory of the tensor it wraps.
    """

    __slots__ = ()

    def __init__(self, data=None, requires_grad=True):
        if data is None:
            data = tensor([])
        if not isinstance(data, Tensor):
            data = tensor(data)
        self._init(data._data)
        self.requires_grad = requires_grad

    def __repr__(self):
        return "Parameter containing:\n" + super().__repr__()

    def __reduce_ex__(self, protocol):
        raise TypeError("tritonad tensors are not pickled; save state dicts with td.save")

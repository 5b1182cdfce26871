"""nn.ParameterList and nn.ParameterDict: Parameters held in a list or by name, registered with
the container (so that parameters(), state_dict(), .to() and optimizers see them), as torch's.
A plain Tensor put in either is wrapped as a Parameter, as torch does."""
from __future__ import annotations

from ..tensor import Tensor
from .module import Module
from .parameter import Parameter


def _as_parameter(container, where, value):
    if isinstance(value, Parameter):
        return value
    if isinstance(value, Tensor):
        return Parameter(value)
    raise TypeError(f"{container}: {where} is a {type(value).__name__}, not a Tensor or "
                    "Parameter")


class ParameterList(Module):
    """Parameters in a list: index, iterate, append, extend; registered as "0", "1", ...
    `self.scales = nn.ParameterList(nn.Parameter(td.ones(4)) for _ in range(3))`"""

    def __init__(self, values=None):
        super().__init__()
        if values is not None:
            self.extend(values)

    def _index(self, i):
        if not isinstance(i, int) or isinstance(i, bool):
            raise TypeError(f"ParameterList indices must be ints or slices, got "
                            f"{type(i).__name__}")
        if not -len(self) <= i < len(self):
            raise IndexError(f"ParameterList: index {i} is out of range for {len(self)} "
                             "parameters")
        return i % len(self)

    def __getitem__(self, i):
        items = list(self._parameters.values())
        return ParameterList(items[i]) if isinstance(i, slice) else items[self._index(i)]

    def __setitem__(self, i, value):
        i = self._index(i)
        self.register_parameter(str(i), _as_parameter("ParameterList", f"item {i}", value))
        # (register_parameter re-inserts the key last; keep the list order)
        order = sorted(self._parameters.items(), key=lambda kv: int(kv[0]))
        self._parameters.clear()
        self._parameters.update(order)

    def __len__(self):
        return len(self._parameters)

    def __iter__(self):
        return iter(self._parameters.values())

    def __iadd__(self, values):
        return self.extend(values)

    def append(self, value):
        n = len(self)
        self.register_parameter(str(n), _as_parameter("ParameterList", f"item {n}", value))
        return self

    def extend(self, values):
        for value in values:
            self.append(value)
        return self

    def extra_repr(self):
        return "\n".join(f"({k}): Parameter containing: [{p.dtype.name} of size "
                         f"{tuple(p.shape)}]" for k, p in self._parameters.items())


class ParameterDict(Module):
    """Parameters by name (strings), in insertion order: [], get, keys, values, items, update,
    pop, `in`.  `self.heads = nn.ParameterDict({"a": nn.Parameter(td.zeros(3))})`"""

    def __init__(self, parameters=None):
        super().__init__()
        if parameters is not None:
            self.update(parameters)

    def __getitem__(self, key):
        try:
            return self._parameters[key]
        except KeyError:
            raise KeyError(f"ParameterDict has no parameter {key!r}; it has "
                           f"{list(self._parameters)}") from None

    def __setitem__(self, key, value):
        if not isinstance(key, str):
            raise TypeError(f"ParameterDict keys must be strings, got {type(key).__name__}")
        self.register_parameter(key, _as_parameter("ParameterDict", repr(key), value))

    def __delitem__(self, key):
        del self._parameters[key]

    def __contains__(self, key):
        return key in self._parameters

    def __len__(self):
        return len(self._parameters)

    def __iter__(self):
        return iter(self._parameters)

    def keys(self):
        return self._parameters.keys()

    def values(self):
        return self._parameters.values()

    def items(self):
        return self._parameters.items()

    def get(self, key, default=None):
        return self._parameters.get(key, default)

    def pop(self, key):
        value = self[key]
        del self._parameters[key]
        return value

    def update(self, parameters):
        pairs = parameters.items() if hasattr(parameters, "items") else parameters
        for key, value in pairs:
            self[key] = value
        return self

    def extra_repr(self):
        return "\n".join(f"({k}): Parameter containing: [{p.dtype.name} of size "
                         f"{tuple(p.shape)}]" for k, p in self._parameters.items())

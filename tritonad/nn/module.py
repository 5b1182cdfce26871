"""Module: the base of every layer and model, with PyTorch's bookkeeping.

Assigning a Parameter or a Module to an attribute registers it; parameters(), state_dict() and
friends walk that tree in registration order, so names and layouts match torch's.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping

from .. import dtypes
from ..autodiff.grad_mode import no_grad
from ..tensor import Tensor, parse_to_args
from .parameter import Parameter


class Module:
    """Subclass and define forward(); call the module to run it.

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(784, 10)
            def forward(self, x):
                return self.fc(x.flatten(1))
    """

    def __init__(self):
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "training", True)

    # ------------------------------------------------------------------ registration
    def __setattr__(self, name, value):
        """As torch: a Parameter or Module registers (leaving no plain attribute that would hide
        it); None or a Tensor assigned to a registered name keeps that name registered."""
        if "_parameters" not in self.__dict__:
            raise AttributeError(f"{type(self).__name__}: call super().__init__() before assigning "
                                 "attributes")
        params, buffers, modules = self._parameters, self._buffers, self._modules
        if isinstance(value, Parameter):
            self._forget(name)
            params[name] = value
        elif isinstance(value, Module):
            self._forget(name)
            modules[name] = value
        elif name in params and value is None:
            params[name] = None
        elif name in modules and value is None:
            modules[name] = None
        elif name in buffers and (value is None or isinstance(value, Tensor)):
            buffers[name] = value
        else:
            for table in (params, buffers, modules):
                table.pop(name, None)
            object.__setattr__(self, name, value)

    def _forget(self, name):
        """Drop name from the plain attributes and every table, before registering it anew."""
        self.__dict__.pop(name, None)
        self.__dict__.get("_non_persistent_buffers_set", set()).discard(name)
        for table in (self._parameters, self._buffers, self._modules):
            table.pop(name, None)

    def __getattr__(self, name):
        for table in ("_parameters", "_buffers", "_modules"):
            found = self.__dict__.get(table, {})
            if name in found:
                return found[name]
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    def __delattr__(self, name):
        for table in (self._parameters, self._buffers, self._modules):
            if name in table:
                del table[name]
                return
        object.__delattr__(self, name)

    def register_parameter(self, name, param):
        if param is not None and not isinstance(param, Parameter):
            raise TypeError(f"register_parameter: {name} must be a Parameter or None")
        self._forget(name)
        self._parameters[name] = param

    def register_buffer(self, name, tensor, persistent=True):
        """State that is moved with the module but not trained (e.g. running stats), and saved
        in state_dict() unless persistent=False."""
        if not isinstance(name, str) or not name or "." in name:
            raise KeyError(f"register_buffer: the name must be a non-empty string without '.', "
                           f"got {name!r}")
        if tensor is not None and not isinstance(tensor, Tensor):
            raise TypeError(f"register_buffer: {name} must be a Tensor or None")
        self._forget(name)
        self._buffers[name] = tensor
        if not persistent:
            self.__dict__.setdefault("_non_persistent_buffers_set", set()).add(name)

    def add_module(self, name, module):
        self._forget(name)
        self._modules[name] = module

    # ------------------------------------------------------------------ traversal
    def named_modules(self, prefix=""):
        stack = [(prefix, self)]
        seen = set()
        while stack:
            name, module = stack.pop(0)
            if id(module) in seen:
                continue
            seen.add(id(module))
            yield name, module
            stack[0:0] = [((f"{name}.{n}" if name else n), m)
                          for n, m in module._modules.items() if m is not None]

    def modules(self):
        return (m for _, m in self.named_modules())

    def named_children(self):
        return ((n, m) for n, m in self._modules.items() if m is not None)

    def children(self):
        return (m for _, m in self.named_children())

    def _named(self, table, recurse):
        seen = set()
        modules = self.named_modules() if recurse else [("", self)]
        for prefix, module in modules:
            for name, value in getattr(module, table).items():
                if value is None or id(value) in seen:
                    continue
                seen.add(id(value))
                yield (f"{prefix}.{name}" if prefix else name), value

    def named_parameters(self, recurse=True):
        return self._named("_parameters", recurse)

    def parameters(self, recurse=True):
        return (p for _, p in self.named_parameters(recurse))

    def named_buffers(self, recurse=True):
        return self._named("_buffers", recurse)

    def buffers(self, recurse=True):
        return (b for _, b in self.named_buffers(recurse))

    def apply(self, fn):
        for module in list(self.modules())[::-1]:
            fn(module)
        return self

    # ------------------------------------------------------------------ state
    def state_dict(self):
        """Parameters and persistent buffers by dotted name (detached; shares memory)."""
        state = OrderedDict()
        for prefix, module in self.named_modules():
            transient = module.__dict__.get("_non_persistent_buffers_set", ())
            for table in (module._parameters, module._buffers):
                for name, value in table.items():
                    if value is not None and (table is module._parameters or
                                              name not in transient):
                        state[f"{prefix}.{name}" if prefix else name] = value.detach()
        return state

    @no_grad()
    def load_state_dict(self, state_dict, strict=True):
        """Copy values into this module's own memory (parameters keep their identity).

        strict: the keys must match exactly. Shape mismatches always raise, listing them all.
        Returns (missing_keys, unexpected_keys).
        """
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"load_state_dict: expected a dict of name -> Tensor (as "
                            f"state_dict() gives), got {type(state_dict).__name__}")
        own = self.state_dict()
        not_tensors = [f"{k} ({type(v).__name__})" for k, v in state_dict.items()
                       if k in own and not isinstance(v, Tensor)]
        if not_tensors:
            raise TypeError(f"load_state_dict into {type(self).__name__}: these values are not "
                            f"Tensors: {', '.join(not_tensors)}")
        missing = [k for k in own if k not in state_dict]
        unexpected = [k for k in state_dict if k not in own]
        wrong = [f"{k}: checkpoint {tuple(state_dict[k].shape)} vs model {own[k].shape}"
                 for k in own if k in state_dict and tuple(state_dict[k].shape) != own[k].shape]
        problems = []
        if strict and missing:
            problems.append(f"missing keys: {', '.join(missing)}")
        if strict and unexpected:
            problems.append(f"unexpected keys: {', '.join(unexpected)}")
        if wrong:
            problems.append(f"shape mismatches: {'; '.join(wrong)}")
        if problems:
            raise RuntimeError(f"load_state_dict into {type(self).__name__} failed: "
                               + " | ".join(problems))
        for key, target in own.items():
            if key in state_dict:
                target.copy_(state_dict[key])
        return missing, unexpected

    # ------------------------------------------------------------------ modes and moves
    def train(self, mode=True):
        for module in self.modules():
            object.__setattr__(module, "training", bool(mode))
        return self

    def eval(self):
        return self.train(False)

    def requires_grad_(self, flag=True):
        for p in self.parameters():
            p.requires_grad_(flag)
        return self

    def zero_grad(self, set_to_none=True):
        for p in self.parameters():
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                p.grad.zero_()

    @no_grad()
    def to(self, *args, **kwargs):
        """Move parameters and buffers (and cast the floating point ones) in place; returns self.

        Parameters keep their identity: their memory is replaced, so make optimizers after this.
        """
        device, dtype = parse_to_args(args, dict(kwargs))
        for t in list(self.parameters()) + list(self.buffers()):
            moved = t.to(device=device, dtype=dtype if t.dtype.is_floating_point else None)
            if moved._data is not t._data:
                t._data = moved._data
                t._bump_version()
                t.grad = None
        return self

    def cuda(self): return self.to("cuda")
    def cpu(self): return self.to("cpu")
    def float(self): return self.to(dtypes.float32)
    def half(self): return self.to(dtypes.float16)
    def bfloat16(self): return self.to(dtypes.bfloat16)
    def double(self): return self.to(dtypes.float64)

    # ------------------------------------------------------------------ calling and printing
    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} must define forward()")

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def extra_repr(self):
        return ""

    def __repr__(self):
        lines = [f"({name}): " + repr(m).replace("\n", "\n  ") for name, m in self.named_children()]
        head = f"{type(self).__name__}({self.extra_repr()}"
        if not lines:
            return head + ")"
        return head + "\n  " + "\n  ".join(lines) + "\n)"

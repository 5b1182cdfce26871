"""Function (forward and backward side by side), the graph it records, and the backward engine.

A Function's forward runs on raw arrays (torch tensors used as memory) through backend
primitives; its backward runs on Tensors through tritonad ops, so that with `create_graph=True`
the backward is itself recorded and can be differentiated again. Fused ops whose backward is a
dedicated kernel set `once_differentiable = True`.

The graph: every output of a recorded call points to its Context (`tensor.grad_fn`); a Context
points to the Contexts (or leaf Tensors) of its inputs. `backward()` walks it iteratively in
reverse topological order, sums fan-in gradients, un-broadcasts each gradient to its input's
shape (once, here, for every op), and frees saved tensors unless `retain_graph`.
"""
from __future__ import annotations

from collections import deque

from .. import dtypes
from ..backend import _NO_CONTEXT, _state, backend_of, get_backend, side_region
from .grad_mode import grad_mode
from ..tensor import Tensor, zeros
from .grad_mode import set_grad_enabled


# sum_to (a reduction, defined in ops.py, which imports this module): set by ops.py at import
SUM_TO = None


class Context:
    """What one recorded call keeps for its backward; it is the `grad_fn` of the call's outputs."""

    # what most Contexts keep as it starts (class attributes: set per instance only when they
    # change, which saves a recorded op ~1 us; the mappings are replaced, never changed in place)
    _saved_raw = ()
    _saved_spec = ()
    _outputs = ()          # (raw, version box) of each output
    _retained = {}         # output index -> Tensor that called retain_grad()
    _destinations = {}     # input position -> leaf gradient buffer (set by the engine)
    freed = False

    def __init__(self, function, args, needs):
        self.function = function
        self.needs_input_grad = needs
        # one edge per argument: (next Context or leaf Tensor, output index) or None, and the
        # input's (torch shape, torch dtype), which the engine fits the gradient to
        edges, meta = [], []
        for a, need in zip(args, needs):
            if need:
                edges.append((a.grad_fn if a.grad_fn is not None else a, a._output_index))
                raw = a._data
                meta.append((raw.shape, raw.dtype))
            else:
                edges.append(None)
                meta.append(None)
        self.edges = edges
        self.input_meta = meta

    @property
    def name(self):
        return self.function.__name__ + "Backward"

    # --- used inside forward --------------------------------------------------------------------
    def save_for_backward(self, *values):
        """Keep raw arrays (or Tensors) for backward; read them back as Tensors from `saved`."""
        self._saved_raw = values

    def mark_non_differentiable(self, *raws):
        self._non_differentiable = {id(r) for r in raws}

    # --- used inside backward -------------------------------------------------------------------
    def gradient_buffer(self, position):
        """Raw memory where the gradient of input `position` will be stored, when the engine can
        take it there without a copy (a leaf with a preallocated gradient buffer, e.g. from an
        optimizer's flat buffer, used once in this graph, no create_graph); else None. A backward
        may write the gradient there directly and return a Tensor of that memory."""
        return self._destinations.get(position)

    @property
    def saved(self):
        """The saved values as Tensors: inputs as the caller's Tensors, outputs as Tensors that
        lead back to this Context (so that higher-order gradients flow through them). A saved
        tensor changed in place since (through any view of its memory) is an error."""
        if self.freed:
            raise RuntimeError(
                f"{self.name}: trying to backward through the graph a second time (or to read "
                "saved tensors after they were freed). Pass retain_graph=True to the first "
                "backward() if you need to backward through the graph twice.")
        values = []
        for kind, value, version in self._saved_spec:
            if kind == "value":
                values.append(value)
                continue
            if kind == "output":
                raw, box = self._outputs[value]
                value = Tensor._wrap(raw, True, self, value, box)
            if value._version_box[0] != version:
                raise RuntimeError(
                    f"{self.name}: a tensor saved for the backward pass (shape {value.shape}) "
                    f"was modified by an in-place operation after it was saved (version "
                    f"{value._version}, expected {version}); the gradient would be wrong. Clone "
                    "it before changing it, or change it outside the differentiated computation")
            values.append(value)
        return tuple(values)

    def __repr__(self):
        return f"<{self.name}>"

    # --- bookkeeping done by Function.apply -----------------------------------------------------
    def _resolve_saved(self, args, raw_args, outputs):
        """Record what forward saved as Tensors of the caller, outputs of this call (kept as raw
        memory, so that no reference cycle forms), or constants, each with its version."""
        spec = []
        for value in self._saved_raw:
            if value is None or not hasattr(value, "dim"):  # None or a Python number
                spec.append(("value", value, None))
                continue
            if not isinstance(value, Tensor):
                inp = None
                for a, r in zip(args, raw_args):
                    if r is value and isinstance(a, Tensor):
                        inp = a
                        break
                if inp is None:
                    out = next((i for i, o in enumerate(outputs)
                                if o is not None and o._data is value), None)
                    if out is not None:
                        spec.append(("output", out, outputs[out]._version_box[0]))
                        continue
                    value = Tensor._wrap(value)
                else:
                    value = inp
            spec.append(("tensor", value, value._version_box[0]))
        self._saved_raw = ()
        self._saved_spec = spec


class Function:
    """Subclass with `forward(ctx, *args)` on raw arrays and `backward(ctx, *grads)` on Tensors.

    Call with `MyFunction.apply(*args)`. backward returns one gradient (or None) per argument.
    The backend that runs forward is the one the tensor arguments' device picks (they must all
    be on one device); forward reaches it through `get_backend()`.
    """

    once_differentiable = False
    runs_on_backend = True  # False for host <-> device transfers, which need no kernel
    is_view = False         # True: the output is a view of the first argument's memory
    # True: backward never reads the data of an incoming gradient whose _constant() is 1 (it
    # skips the multiply), so backward() from this op may seed it with unfilled memory
    skips_unit_gradient = False
    # the backend primitive that forward amounts to when nothing is recorded (forward called
    # with the same arguments), or None: apply then calls the primitive itself, the lean path
    # of eager ops that need no gradient (inference, optimizer updates, backward passes)
    primitive = None

    @staticmethod
    def forward(ctx, *args, **kwargs):
        raise NotImplementedError

    @staticmethod
    def backward(ctx, *grads):
        raise NotImplementedError

    @classmethod
    def apply(cls, *args, **kwargs):
        """Run the op on its arguments (Tensors and plain values); record it for backward when
        a Tensor argument requires a gradient and grad mode is on."""
        # The lean path: an op with a primitive and nothing to record (inference, optimizer
        # updates, backward passes) calls the backend primitive on the raw arrays, one loop
        # over the arguments and no Context (see notes/PERF.md, "Eager path", for its cost).
        state = _state
        if cls.primitive is not None and not kwargs:
            raws, first, grad = [], None, grad_mode.enabled
            for a in args:
                if isinstance(a, Tensor):
                    if grad and a._requires_grad:
                        break
                    raw = a._data
                    if first is None:
                        first = raw
                    elif raw.get_device() != first.get_device():
                        _raise_devices(cls, args)
                    raws.append(raw)
                else:
                    raws.append(a)
            else:
                if first is not None:
                    be = state.cuda if first.is_cuda else state.cpu
                    if be is None:
                        be = backend_of(first)
                    return Tensor._wrap(getattr(be, cls.primitive)(*raws), False, None, 0, None)
        return cls._apply(args, kwargs)

    @classmethod
    def _apply(cls, args, kwargs):
        # one pass over the arguments: the device, whether any needs a gradient, the raw arrays
        device = first = None
        needs_any = False
        raw_args, needs = [], []
        for a in args:
            if isinstance(a, Tensor):
                raw = a._data
                if first is None:
                    first, device = raw, raw.get_device()
                elif raw.get_device() != device:
                    _raise_devices(cls, args)
                need = a._requires_grad
                needs_any = needs_any or need
                raw_args.append(raw)
                needs.append(need)
            else:
                raw_args.append(a)
                needs.append(False)
        state = _state
        enabled = grad_mode.enabled
        record = needs_any and enabled
        if record:
            ctx = Context(cls, args, tuple(needs))
        else:
            ctx = _NoContext()
        previous = state.current
        if first is not None and cls.runs_on_backend:
            be = state.cuda if first.is_cuda else state.cpu
            state.current = be if be is not None else backend_of(first)
        grad_mode.enabled = False
        try:
            result = cls.forward(ctx, *raw_args, **kwargs)
        finally:
            grad_mode.enabled = enabled
            state.current = previous
        # a view shares its base's version counter, so that an in-place change through any
        # view of the memory is seen by every Context that saved a tensor of it
        box = args[0]._version_box if cls.is_view else None
        wrap = Tensor._wrap
        if not isinstance(result, tuple):
            if not record:
                return wrap(result, False, None, 0, box) if result is not None else None
            if result is not None and not hasattr(ctx, "_non_differentiable"):
                # one output (the most): the bookkeeping below without its loops
                if result.dtype.is_floating_point:
                    out = wrap(result, True, ctx, 0, box)
                    ctx._output_meta = ((result.shape, result.dtype, result.device),)
                else:
                    out = wrap(result, False, None, 0, box)
                    ctx._output_meta = (None,)
                ctx._outputs = ((result, out._version_box),)
                if ctx._saved_raw:
                    ctx._resolve_saved(args, raw_args, (out,))
                return out
            result = (result,)
            single = True
        else:
            if not record:
                return tuple(wrap(r, False, None, 0, box) if r is not None else None
                             for r in result)
            single = False
        skip = getattr(ctx, "_non_differentiable", ())
        outputs = []
        for i, r in enumerate(result):
            if r is None:
                outputs.append(None)
                continue
            differentiable = r.dtype.is_floating_point and id(r) not in skip
            outputs.append(wrap(r, differentiable, ctx if differentiable else None, i, box))
        ctx._outputs = tuple((o._data, o._version_box) if o is not None else (None, None)
                             for o in outputs)
        # (no zeros are made up for an output that takes no gradient: indices, masks)
        ctx._output_meta = tuple((o._data.shape, o._data.dtype, o._data.device)
                                 if o is not None and o._requires_grad else None
                                 for o in outputs)
        if ctx._saved_raw:
            ctx._resolve_saved(args, raw_args, outputs)
        return outputs[0] if single else tuple(outputs)


def _raise_devices(cls, args):
    found = [(tuple(a.shape), str(a.device)) for a in args if isinstance(a, Tensor)]
    names = sorted({d for _, d in found})
    raise RuntimeError(f"{cls.__name__.lower()}: expected all tensors on one device, but found "
                       f"tensors on {' and '.join(names)} (shape, device: {found}); move them "
                       "with .to(device)")


class _NoContext:
    """Stands in for Context when nothing is recorded: saving is a no-op."""

    needs_input_grad = ()

    def save_for_backward(self, *values):
        pass

    def mark_non_differentiable(self, *raws):
        pass


class _NotTwiceDifferentiable(Function):
    """Stands where a once-differentiable op's gradient would need its own backward."""

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError(f"{ctx.op_name} is once-differentiable: its backward is a fused kernel, "
                           "so higher-order gradients cannot flow through it")


def _guard_once_differentiable(name, grad):
    ctx = Context(_NotTwiceDifferentiable, (), ())
    ctx.op_name = name
    ctx._outputs = ((grad._data, grad._version_box),)
    ctx._output_meta = ((grad._data.shape, grad._data.dtype, grad._data.device),)
    return Tensor._wrap(grad._data, requires_grad=True, grad_fn=ctx, output_index=0,
                        version_box=grad._version_box)


# ---------------------------------------------------------------------------------- the engine


def _graph_order(roots):
    """Contexts reachable from `roots` with the number of edges pointing at each, and the number
    of edges pointing at each leaf (iterative: no recursion limit)."""
    dependencies, leaf_uses = {}, {}
    seen = set()
    stack = [ctx for ctx in roots]
    for ctx in roots:
        dependencies.setdefault(ctx, 0)
    while stack:
        ctx = stack.pop()
        if id(ctx) in seen:
            continue
        seen.add(id(ctx))
        for edge in ctx.edges:
            if edge is None:
                continue
            nxt = edge[0]
            if not isinstance(nxt, Context):
                leaf_uses[id(nxt)] = leaf_uses.get(id(nxt), 0) + 1
                continue
            dependencies[nxt] = dependencies.get(nxt, 0) + 1
            stack.append(nxt)
    return dependencies, leaf_uses


def _fit_gradient(grad, meta, name, position):
    """Sum a gradient back to its input's shape (un-broadcast) and cast it to the input's dtype."""
    shape, dtype = meta  # torch's, as the raw input had them
    raw = grad._data
    if raw.shape != shape:
        shape = tuple(shape)
        if not _broadcasts_to(shape, tuple(raw.shape)):
            raise RuntimeError(f"{name} returned a gradient of shape {grad.shape} for input "
                               f"{position}, whose shape {shape} does not broadcast to it")
        grad = SUM_TO(grad, shape)
    if grad._data.dtype != dtype:
        grad = grad.to(dtypes.get_dtype(dtype))
    return grad


def _broadcasts_to(shape, target):
    if len(shape) > len(target):
        return False
    return all(s == t or s == 1 for s, t in zip(shape[::-1], target[::-1]))


def run_backward(tensors, grad_tensors, retain_graph=False, create_graph=False, inputs=None):
    """Backpropagate from `tensors` seeded with `grad_tensors`.

    With `inputs=None`, gradients accumulate into `.grad` of every leaf reached. Otherwise the
    gradients with respect to `inputs` (leaves or not) are returned and no `.grad` is touched.
    """
    captures = {}
    if inputs is not None:
        for i, t in enumerate(inputs):
            key = (t.grad_fn, t._output_index) if t.grad_fn is not None else id(t)
            captures.setdefault(key, []).append(i)
    results = [None] * (len(inputs) if inputs is not None else 0)

    buffers = {}       # Context -> {output index: grad}
    leaf_grads = {}    # id(leaf) -> (leaf, grad)

    def deliver(target, index, grad):
        if isinstance(target, Context):
            slot = buffers.setdefault(target, {})
            slot[index] = grad if index not in slot else slot[index] + grad
        else:
            _, prev = leaf_grads.get(id(target), (None, None))
            leaf_grads[id(target)] = (target, grad if prev is None else prev + grad)

    roots = []
    for t, g in zip(tensors, grad_tensors):
        if not t.requires_grad:
            raise RuntimeError(f"backward: a tensor of shape {t.shape} does not require grad and "
                               "has no grad_fn (did you compute it under no_grad, or forget "
                               "requires_grad=True on the inputs?)")
        if t.grad_fn is None:
            deliver(t, 0, g)
        else:
            deliver(t.grad_fn, t._output_index, g)
            roots.append(t.grad_fn)

    dependencies, leaf_uses = _graph_order(roots)
    direct = inputs is None and not create_graph  # may gradients go straight to leaf buffers?
    ready = deque(ctx for ctx in dependencies if dependencies[ctx] == 0)
    # (weight gradients written straight into leaf buffers may run beside the pass: the
    # region joins them before it ends, so before the leaves' accumulation below)
    with set_grad_enabled(create_graph), side_region() if direct else _NO_CONTEXT:
        while ready:
            ctx = ready.popleft()
            grads_in = buffers.pop(ctx, {})
            if ctx._retained:
                for index, t in ctx._retained.items():
                    if index in grads_in:
                        t.grad = grads_in[index] if create_graph else grads_in[index].detach()
            if captures:
                for index in range(len(ctx._output_meta)):
                    for pos in captures.get((ctx, index), ()):
                        results[pos] = grads_in.get(index)
            edges = ctx.edges
            if direct:
                destinations = None
                for i, edge in enumerate(edges):
                    if edge is not None and type(edge[0]) is not Context:
                        leaf = edge[0]
                        if leaf._grad_buffer is not None and leaf.grad is None and \
                                leaf_uses.get(id(leaf)) == 1 and id(leaf) not in leaf_grads:
                            if destinations is None:
                                destinations = {}
                            destinations[i] = leaf._grad_buffer
                if destinations is not None:
                    ctx._destinations = destinations
                elif ctx._destinations:  # (a retained graph's earlier backward set some)
                    ctx._destinations = {}
            grads = _call_backward(ctx, grads_in, create_graph)
            if not retain_graph:
                ctx.freed = True
                ctx._saved_spec = []
            meta = ctx.input_meta
            for position, edge in enumerate(edges):
                if edge is None:
                    continue
                target = edge[0]
                grad = grads[position]
                if grad is not None:
                    # (_fit_gradient inline for the common case: the input's shape and dtype)
                    raw = grad._data
                    shape, dtype = meta[position]
                    if raw.shape != shape or raw.dtype != dtype:
                        grad = _fit_gradient(grad, meta[position], ctx.name, position)
                    deliver(target, edge[1], grad)
                if type(target) is Context:
                    left = dependencies[target] - 1
                    dependencies[target] = left
                    if left == 0:
                        ready.append(target)

    handed_out = {_storage_key(g) for g in grad_tensors}
    for leaf, grad in leaf_grads.values():
        if inputs is not None:
            for pos in captures.get(id(leaf), ()):
                results[pos] = grad
            continue
        _accumulate_leaf(leaf, grad, create_graph, handed_out)
    return results


def _call_backward(ctx, grads_in, create_graph):
    output_meta = ctx._output_meta
    if len(output_meta) == 1 and 0 in grads_in:  # (one output, its gradient given: the most)
        grads_out = [grads_in[0]]
    else:
        grads_out = _output_grads(output_meta, grads_in)
    once = ctx.function.once_differentiable
    enabled = grad_mode.enabled
    grad_mode.enabled = create_graph and not once
    try:
        grads = ctx.function.backward(ctx, *grads_out)
    finally:
        grad_mode.enabled = enabled
    n = len(ctx.edges)
    if not isinstance(grads, tuple):
        grads = (grads,)
    if len(grads) != n:
        if len(grads) < n:
            grads = grads + (None,) * (n - len(grads))
        else:
            raise RuntimeError(f"{ctx.name} returned {len(grads)} gradients for {n} inputs")
    if once and create_graph:
        grads = tuple(_guard_once_differentiable(ctx.function.__name__, g) if g is not None else None
                      for g in grads)
    return grads


def _output_grads(output_meta, grads_in):
    """The gradient of each output of a Context: the one delivered, None for an output that
    takes none, or zeros for one whose gradient did not arrive."""
    grads_out = []
    for index, meta in enumerate(output_meta):
        if index in grads_in:
            grads_out.append(grads_in[index])
        elif meta is None:
            grads_out.append(None)
        else:
            grads_out.append(zeros(tuple(meta[0]), dtype=dtypes.get_dtype(meta[1]),
                                       device=meta[2]))
    return grads_out


def _storage_key(t):
    raw = t._data
    return raw.untyped_storage().data_ptr(), raw.get_device()


def _accumulate_leaf(leaf, grad, create_graph, handed_out):
    """leaf.grad += grad. A fresh gradient is adopted without a copy unless its memory was already
    handed to another leaf (so later in-place updates of one .grad never change another)."""
    if create_graph:
        leaf.grad = grad if leaf.grad is None else leaf.grad + grad
        return
    if leaf.grad is not None:
        get_backend().add(leaf.grad._data, grad._data, out=leaf.grad._data)
        return
    if leaf._grad_buffer is not None and grad._data is leaf._grad_buffer:
        leaf.grad = grad  # the backward wrote it in place (Context.gradient_buffer)
        return
    if leaf._grad_buffer is not None:
        leaf.grad = Tensor._wrap(get_backend().copy_(leaf._grad_buffer, grad._data))
        return
    key = _storage_key(grad)
    if key in handed_out or grad.grad_fn is not None:
        grad = Tensor._wrap(get_backend().contiguous(grad._data))
        key = _storage_key(grad)
    handed_out.add(key)
    leaf.grad = grad if grad.grad_fn is None else grad.detach()

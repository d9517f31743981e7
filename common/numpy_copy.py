"""The rollout's stand-in for the policy: a NumPy copy of the script's own policy function.

A rollout step on a CPU costs less with NumPy than with torch at the sizes of these networks. The
copy (`numpy_copy`) is recorded from one call of the policy function: it follows the network
wherever the script's modules lead (shared torsos, layers after a recurrent core, residual sums,
the distribution and the draw), and is checked against torch on the first step of every rollout,
where it also takes in the weights of the last update (`common.rollout_checks` checks the actions
after the rollout).

It records torch's functions and tensor methods by name (``FUNCTIONS``), and whole calls of the
layers it knows (``LAYERS``, batch norm, ``common.numpy_cells.numpy_cell`` for ``nn.LSTM`` and
``nn.GRU``, any module with a ``numpy_snapshot()`` method); it follows the user's own modules
(subclasses of torch's included) into their ``forward``. A module of torch's it does not know, a
function it has no form for, a forward hook, a branch on a value or a random draw make it refuse
with ``NoNumpyForm``, naming the module; the rollout then calls the torch policy, with one
notice."""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn as nn
from torch.nn.modules import module as torch_module
from torch.utils import _pytree as pytree

from common.cli import notice
from common.errors import NoNumpyForm
from common.numpy_cells import float32_copy, numpy_cell

NumpyFunction = Callable[[np.ndarray], np.ndarray]


def _linear(layer: nn.Linear) -> NumpyFunction:
    # a transposed view makes each matmul copy it
    weight = np.ascontiguousarray(float32_copy(layer.weight).T)
    bias = float32_copy(layer.bias) if layer.bias is not None else np.float32(0)
    return lambda x: x @ weight + bias


class _Slot:
    """A value of the recorded program: an input, or a tensor a recorded call returned."""

    def __init__(self, name: str):
        self.name = name


def _fn(name: str):
    """Register a NumPy form of torch's function or tensor method `name`, with torch's signature."""

    def register(function):
        FUNCTIONS[name] = function
        return function

    return register


FUNCTIONS: dict[str, Callable[..., Any]] = {}
"""NumPy forms of torch's functions and tensor methods, by name, with torch's arguments."""


def _identity(x: Any, *args: Any, **kwargs: Any) -> Any:
    return x


_ALIASES = {
    "add": np.add, "__add__": np.add, "__radd__": lambda x, y: y + x, "sub": np.subtract,
    "__sub__": np.subtract, "__rsub__": lambda x, y: y - x, "mul": np.multiply,
    "__mul__": np.multiply, "__rmul__": lambda x, y: y * x, "div": np.divide,
    "__truediv__": np.divide, "__rtruediv__": lambda x, y: y / x, "__matmul__": np.matmul,
    "matmul": np.matmul, "__pow__": np.power, "pow": np.power, "__neg__": np.negative,
    "neg": np.negative, "__invert__": np.invert, "logical_not": np.logical_not,
    "__and__": np.bitwise_and, "__or__": np.bitwise_or, "__xor__": np.bitwise_xor,
    "logical_and": np.logical_and, "logical_or": np.logical_or, "abs": np.abs, "__abs__": np.abs,
    "reciprocal": np.reciprocal, "rsqrt": lambda x: 1 / np.sqrt(x), "atan": np.arctan,
    "clamp_min": np.maximum, "clamp_max": np.minimum, "sign": np.sign, "floor": np.floor,
    "zeros_like": lambda x, **kwargs: np.zeros_like(x),
    "ones_like": lambda x, **kwargs: np.ones_like(x),
    "full_like": lambda x, value, **kwargs: np.full_like(x, value), "mv": np.matmul,
    "mm": np.matmul, "bmm": np.matmul, "dot": np.dot, "vdot": np.vdot,
    "outer": np.outer, "exp": np.exp, "log": np.log, "log1p": np.log1p, "expm1": np.expm1, "sqrt": np.sqrt,
    "square": np.square, "sin": np.sin, "cos": np.cos, "tanh": np.tanh, "maximum": np.maximum,
    "minimum": np.minimum, "eq": np.equal, "__eq__": np.equal, "ne": np.not_equal,
    "__ne__": np.not_equal, "lt": np.less, "__lt__": np.less, "le": np.less_equal,
    "__le__": np.less_equal, "gt": np.greater, "__gt__": np.greater, "ge": np.greater_equal,
    "__ge__": np.greater_equal, "where": np.where, "__getitem__": lambda x, index: x[index],
    "contiguous": _identity, "clone": _identity, "detach": _identity,
    "float": lambda x, memory_format=None: x.astype(np.float32, copy=False),
    "bool": lambda x, memory_format=None: x.astype(bool, copy=False),
    "long": lambda x, memory_format=None: x.astype(np.int64, copy=False),
    "unsqueeze": lambda x, dim: np.expand_dims(x, dim),
    "transpose": lambda x, dim0, dim1: np.swapaxes(x, dim0, dim1), "t": np.transpose,
    "T": lambda x: x.T, "mT": lambda x: np.swapaxes(x, -1, -2), "data": _identity,
}  # fmt: skip
FUNCTIONS.update(_ALIASES)


def _dim(dim: Any) -> Any:
    return tuple(dim) if isinstance(dim, list) else dim


def _reduction(function: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    def reduce(x, dim=None, keepdim=False, *, dtype=None):
        return function(x, axis=_dim(dim), keepdims=keepdim)

    return reduce


FUNCTIONS.update(
    sum=_reduction(np.sum), mean=_reduction(np.mean), amax=_reduction(np.amax),
    amin=_reduction(np.amin), prod=_reduction(np.prod),
)  # fmt: skip


@_fn("relu")
def _relu(x, inplace=False):
    return np.maximum(x, x.dtype.type(0))


@_fn("sigmoid")
def _sigmoid(x):
    return x.dtype.type(1) / (x.dtype.type(1) + np.exp(-x))


@_fn("silu")
def _silu(x, inplace=False):
    return x * _sigmoid(x)


@_fn("leaky_relu")
def _leaky_relu_function(x, negative_slope=0.01, inplace=False):
    return np.where(x >= 0, x, x * x.dtype.type(negative_slope))


@_fn("elu")
def _elu_function(x, alpha=1.0, inplace=False):
    return np.where(x > 0, x, x.dtype.type(alpha) * np.expm1(x))


@_fn("gelu")
def _gelu(x, approximate="none"):
    if approximate == "tanh":
        inner = np.float32(math.sqrt(2 / math.pi)) * (x + np.float32(0.044715) * x**3)
        return np.float32(0.5) * x * (1 + np.tanh(inner))
    from scipy.special import erf  # an optional dependency: without it, GELU acts in torch

    return (np.float32(0.5) * x * (1 + erf(x / np.float32(math.sqrt(2))))).astype(x.dtype)


@_fn("hardsigmoid")
def _hardsigmoid(x, inplace=False):
    return np.clip(x / x.dtype.type(6) + x.dtype.type(0.5), x.dtype.type(0), x.dtype.type(1))


@_fn("selu")
def _selu(x, inplace=False):
    alpha, scale = 1.6732632423543772, 1.0507009873554805
    return x.dtype.type(scale) * _elu_function(x, alpha)


@_fn("group_norm")
def _group_norm(x, num_groups, weight=None, bias=None, eps=1e-5):
    grouped = x.reshape(x.shape[0], num_groups, -1)
    centred = grouped - grouped.mean(-1, keepdims=True)
    variance = (centred * centred).mean(-1, keepdims=True)
    y = (centred / np.sqrt(variance + x.dtype.type(eps))).reshape(x.shape)
    channels = (-1,) + (1,) * (x.ndim - 2)
    y = y if weight is None else y * weight.reshape(channels)
    return y if bias is None else y + bias.reshape(channels)


@_fn("embedding")
def _embedding(indices, weight, padding_idx=None, max_norm=None, *args, **kwargs):
    if max_norm is not None:
        raise NoNumpyForm("an embedding with max_norm renormalises its weights in place")
    return weight[indices]


@_fn("norm")
def _norm(x, p="fro", dim=None, keepdim=False, dtype=None):
    order = 2 if p in ("fro", 2, 2.0) else p
    if dim is None:
        return np.asarray(np.linalg.norm(x.reshape(-1), order), x.dtype)
    axis = tuple(dim) if isinstance(dim, (list, tuple)) else dim
    return np.linalg.norm(x, order, axis=axis, keepdims=keepdim).astype(x.dtype)


def _spread(function: Callable) -> Callable:
    def spread(x, dim=None, unbiased=None, keepdim=False, *, correction=None):
        ddof = correction if correction is not None else (0 if unbiased is False else 1)
        axis = tuple(dim) if isinstance(dim, list) else dim
        return function(x, axis=axis, ddof=ddof, keepdims=keepdim)

    return spread


FUNCTIONS.update(var=_spread(np.var), std=_spread(np.std))


@_fn("glu")
def _glu(x, dim=-1):
    a, b = np.split(x, 2, axis=dim)
    return a * _sigmoid(b)


@_fn("erf")
def _erf(x):
    from scipy.special import erf  # an optional dependency: without it, erf acts in torch

    return erf(x).astype(x.dtype)


@_fn("einsum")
def _einsum(equation, *operands):
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = operands[0]
    return np.einsum(equation, *operands)


@_fn("rms_norm")
def _rms_norm(x, normalized_shape, weight=None, eps=None):
    axes = tuple(range(-len(normalized_shape), 0))
    eps = np.finfo(x.dtype).eps if eps is None else eps
    y = x / np.sqrt((x * x).mean(axes, keepdims=True) + x.dtype.type(eps))
    return y if weight is None else y * weight


@_fn("_weight_norm")
def _weight_norm(v, g, dim=0):
    axes = tuple(i for i in range(v.ndim) if i != dim % v.ndim)
    return v * (g / np.sqrt((v * v).sum(axes, keepdims=True)))


@_fn("softplus")
def _softplus(x, beta=1.0, threshold=20.0):
    scaled = x * x.dtype.type(beta)
    return np.where(scaled > threshold, x, np.log1p(np.exp(scaled)) / x.dtype.type(beta))


@_fn("layer_norm")
def _layer_norm_function(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    axes = tuple(range(-len(normalized_shape), 0))
    centred = x - x.mean(axes, keepdims=True)
    y = centred / np.sqrt((centred * centred).mean(axes, keepdims=True) + x.dtype.type(eps))
    return y * (1 if weight is None else weight) + (0 if bias is None else bias)


@_fn("softmax")
def _softmax(x, dim=None, _stacklevel=3, dtype=None):
    e = np.exp(x - x.max(dim, keepdims=True))
    return e / e.sum(dim, keepdims=True)


@_fn("logsumexp")
def _logsumexp(x, dim, keepdim=False):
    return np.logaddexp.reduce(
        x, axis=tuple(dim) if isinstance(dim, list) else dim, keepdims=keepdim
    )


@_fn("dropout")
def _dropout(x, p=0.5, training=True, inplace=False):
    if training:
        raise NoNumpyForm("dropout in train mode draws at random")
    return x


@_fn("batch_norm")
def _batch_norm_function(
    x, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5
):
    if training or running_mean is None:
        raise NoNumpyForm("batch norm in train mode takes the batch's statistics")
    channels = (-1,) + (1,) * (x.ndim - 2)  # axis 1
    scale = (1 if weight is None else weight) / np.sqrt(running_var + x.dtype.type(eps))
    shift = (0 if bias is None else bias) - running_mean * scale
    return x * np.reshape(scale, channels) + np.reshape(shift, channels)


LAYERS: dict[type[nn.Module], Callable[[nn.Module], NumpyFunction]] = {
    nn.Linear: _linear,
    nn.LayerNorm: lambda layer: partial(
        _layer_norm_function,
        normalized_shape=layer.normalized_shape,
        weight=None if layer.weight is None else float32_copy(layer.weight),
        bias=None if layer.bias is None else float32_copy(layer.bias),
        eps=layer.eps,
    ),
    nn.Tanh: lambda layer: np.tanh,
    nn.ReLU: lambda layer: _relu,
    nn.LeakyReLU: lambda layer: partial(_leaky_relu_function, negative_slope=layer.negative_slope),
    nn.ELU: lambda layer: partial(_elu_function, alpha=layer.alpha),
    nn.Sigmoid: lambda layer: _sigmoid,
    nn.SiLU: lambda layer: _silu,
    nn.Identity: lambda layer: _identity,
    nn.Flatten: lambda layer: partial(_flatten, start_dim=layer.start_dim, end_dim=layer.end_dim),
    nn.GELU: lambda layer: partial(_gelu, approximate=layer.approximate),
    nn.Softmax: lambda layer: partial(_softmax, dim=layer.dim),
}
"""The layer types the copy calls whole, each with the function that makes its NumPy form from a
layer (its weights as they are then)."""
BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d)


def _batch_norm(layer: nn.Module) -> NumpyFunction:
    """Batch norm as it acts in eval mode: by its running statistics."""
    weight, bias = (None if x is None else float32_copy(x) for x in (layer.weight, layer.bias))
    mean, variance = float32_copy(layer.running_mean), float32_copy(layer.running_var)
    return partial(
        _batch_norm_function,
        running_mean=mean,
        running_var=variance,
        weight=weight,
        bias=bias,
        eps=layer.eps,
    )


FUNCTIONS.update({
    "mish": lambda x, inplace=False: x * np.tanh(_softplus(x)),
    "hardtanh": lambda x, min_val=-1.0, max_val=1.0, inplace=False:
        np.clip(x, x.dtype.type(min_val), x.dtype.type(max_val)),
    "relu6": lambda x, inplace=False: np.clip(x, x.dtype.type(0), x.dtype.type(6)),
    "hardswish": lambda x, inplace=False: x * _hardsigmoid(x),
    "celu": lambda x, alpha=1.0, inplace=False:
        np.where(x > 0, x, x.dtype.type(alpha) * np.expm1(x / x.dtype.type(alpha))),
    "logsigmoid": lambda x: -_softplus(-x),
    "normalize": lambda x, p=2.0, dim=1, eps=1e-12, out=None:
        x / np.maximum(_norm(x, p, dim, keepdim=True), x.dtype.type(eps)),
    "masked_fill": lambda x, mask, value: np.where(mask, np.asarray(value, x.dtype), x),
    "repeat": lambda x, *sizes: np.tile(x, _shape(sizes)),
    "cumsum": lambda x, dim, dtype=None: np.cumsum(x, axis=dim),
    "flip": lambda x, dims: np.flip(x, axis=tuple(dims) if isinstance(dims, (list, tuple)) else dims),
    "roll": lambda x, shifts, dims=None: np.roll(x, shifts, axis=dims),
    "lerp": lambda x, end, weight: x + weight * (end - x),
    "addcmul": lambda x, tensor1, tensor2, value=1: x + value * tensor1 * tensor2,
    "softmin": lambda x, dim=None, _stacklevel=3, dtype=None: _softmax(-x, dim),
    "softsign": lambda x: x / (x.dtype.type(1) + np.abs(x)),
    **dict.fromkeys(("clamp", "clip"), lambda x, min=None, max=None: np.clip(x, min, max)),
    "linear": lambda x, weight, bias=None: x @ weight.T + bias if bias is not None else x @ weight.T,
    "log_softmax": lambda x, dim=None, _stacklevel=3, dtype=None: x - _logsumexp(x, dim, keepdim=True),
    "argmax": lambda x, dim=None, keepdim=False: x.argmax(dim, keepdims=True) if keepdim else x.argmax(dim),
    **dict.fromkeys(("reshape", "view"), lambda x, *shape: x.reshape(_shape(shape))),
    "permute": lambda x, *dims: np.transpose(x, _shape(dims)),
    **dict.fromkeys(("cat", "concat", "concatenate"), lambda tensors, dim=0: np.concatenate(tensors, axis=dim)),
    "stack": lambda tensors, dim=0: np.stack(tensors, axis=dim),
})  # fmt: skip
"""NumPy forms of one line, by torch's name, with torch's arguments"""


_IDENTITIES = {_identity, _dropout, np.broadcast_to}
"""Forms that give their input back: the copy leaves them out"""


def _extreme(reduce: Callable, arg: Callable) -> Callable:
    def extreme(x, dim=None, keepdim=False):
        if isinstance(dim, np.ndarray):  # torch.max(a, b): elementwise
            return np.maximum(x, dim) if reduce is np.amax else np.minimum(x, dim)
        if dim is None:
            return reduce(x)
        return reduce(x, dim, keepdims=keepdim), arg(x, dim, keepdims=keepdim)

    return extreme


FUNCTIONS.update(max=_extreme(np.amax, np.argmax), min=_extreme(np.amin, np.argmin))


def _shape(shape: tuple) -> tuple:
    return tuple(shape[0]) if len(shape) == 1 and not isinstance(shape[0], int) else shape


@_fn("expand")
def _expand(x, *sizes):
    sizes = _shape(sizes)
    lead = len(sizes) - x.ndim
    return np.broadcast_to(
        x, tuple(s if s != -1 else x.shape[i - lead] for i, s in enumerate(sizes))
    )


@_fn("flatten")
def _flatten(x, start_dim=0, end_dim=-1):
    start, end = start_dim % max(x.ndim, 1), end_dim % max(x.ndim, 1)
    return x.reshape(*x.shape[:start], -1, *x.shape[end + 1 :])


@_fn("unflatten")
def _unflatten(x, dim, sizes):
    dim %= x.ndim
    return x.reshape(*x.shape[:dim], *sizes, *x.shape[dim + 1 :])


@_fn("squeeze")
def _squeeze(x, dim=None):
    if dim is None:
        return np.squeeze(x)
    dims = tuple(d for d in np.atleast_1d(dim) if x.shape[d] == 1)
    return np.squeeze(x, dims) if dims else x


def _piece_index(whole: torch.Tensor, piece: torch.Tensor) -> tuple:
    """The index of `whole` that gives `piece`, a view of it cut along one axis."""
    cut = [i for i, (a, b) in enumerate(zip(whole.shape, piece.shape, strict=True)) if a != b]
    if not cut:
        return (slice(None),)
    start = (piece.data_ptr() - whole.data_ptr()) // whole.element_size() // whole.stride(cut[0])
    return (*(slice(None),) * cut[0], slice(start, start + piece.shape[cut[0]]))


def _items(indices: list[tuple]) -> Callable[[np.ndarray], tuple[np.ndarray, ...]]:
    get = operator.itemgetter(*indices)
    return (lambda x: (get(x),)) if len(indices) == 1 else get


_NUMPY_DTYPES = {
    torch.float32: np.float32, torch.float64: np.float64, torch.int64: np.int64,
    torch.int32: np.int32, torch.bool: np.bool_, torch.uint8: np.uint8,
}  # fmt: skip

SHAPE_QUERIES = {
    "size", "dim", "ndimension", "numel", "nelement", "__len__", "is_floating_point", "stride",
    "is_contiguous", "element_size", "get_device", "__hash__", "shape", "dtype", "device", "ndim",
    "is_cuda", "requires_grad", "layout", "is_sparse",
}  # fmt: skip
"""Calls whose answer is no tensor and depends on shapes only: the copy works at the recorded ones"""


def _module_form(module: nn.Module) -> Callable[..., Any] | None:
    """The NumPy form of a call of a known torch module, with its arguments; None where the module
    is the user's own (followed into) or a container."""
    kind = type(module)
    if kind in (nn.Dropout, nn.Dropout1d, nn.AlphaDropout) and not module.training:
        return _identity
    if kind in LAYERS:
        return LAYERS[kind](module)
    if kind in BATCH_NORMS:
        return _batch_norm(module)
    if kind in (nn.LSTM, nn.GRU):
        return numpy_cell(module)
    if callable(getattr(module, "numpy_snapshot", None)):
        return module.numpy_snapshot()
    return None


def _has_form(module: nn.Module) -> bool:
    kind = type(module)
    return (
        (kind in BATCH_NORMS and not module.training and module.running_var is not None)
        or kind in LAYERS
        or kind in (nn.LSTM, nn.GRU)
        or (kind in (nn.Dropout, nn.Dropout1d, nn.AlphaDropout) and not module.training)
        or callable(getattr(module, "numpy_snapshot", None))
    )


class _Line(NamedTuple):
    target: str
    form: Any  # a NumPy function, a module (its form is made at each refresh), or None: an item
    arguments: Any  # (args, kwargs) with slots, or (source, path) for an item of a result
    where: str


class _Recorder(torch.overrides.TorchFunctionMode):
    """Records the calls a policy function makes on tensors that depend on its inputs or on the
    network's weights: torch's functions and tensor methods, and whole calls of the modules the
    copy knows."""

    def __init__(self, network: nn.Module):
        super().__init__()
        self.slots: dict[int, str] = {}  # id of a tensor -> the program's name for it
        self.alive: list[torch.Tensor] = []  # every tensor named, so that no id is reused
        self.values: dict[str, torch.Tensor] = {}  # what torch computed, by name
        self.lines: list[_Line] = []
        self.constants: dict[str, Any] = {}
        self.weights = {self.name(x, "w"): x for x in (*network.parameters(), *network.buffers())}
        self.overwritten: set[str] = set()  # names whose tensor an in-place line changed later
        self.inside = 0  # how deep in a known module's call
        self.busy = False
        self.where = [type(network).__name__]
        self.names = {module: name for name, module in network.named_modules()}
        self.handles = []
        for module in network.modules():
            self.handles += [
                module.register_forward_pre_hook(self._enter, with_kwargs=True),
                module.register_forward_hook(self._leave, with_kwargs=True),
            ]
        self.hook_ids = {handle.id for handle in self.handles}

    def describe(self, module: nn.Module) -> str:
        name = self.names.get(module)
        return f"{type(module).__name__} at {name}" if name else type(module).__name__

    def _known(self, module: nn.Module) -> bool:
        """Whether a call of `module` is recorded whole, by its NumPy form: a layer the copy knows,
        with no hook or parametrization of the user's (a module with one is followed into, and so
        are the user's own modules and torch's that the copy has no form for)."""
        hooks = [*module._forward_hooks, *module._forward_pre_hooks]
        return (
            _has_form(module)
            and not set(hooks) - self.hook_ids
            and not torch.nn.utils.parametrize.is_parametrized(module)
        )

    def _enter(self, module, args, kwargs):
        self.where.append(self.describe(module))
        if self.inside or self._known(module):
            self.inside += 1

    def _leave(self, module, args, kwargs, output):
        self.where.pop()
        if not (self.inside and (self.inside > 1 or self._known(module))):
            return
        self.inside -= 1
        weights = [*module.parameters(), *module.buffers()]
        if self.inside or not self._depends((args, kwargs, weights)):
            return
        self.busy = True
        self.where.append(self.describe(module))
        inplace = getattr(module, "inplace", False)
        self._line(module, args, kwargs, output, inplace=inplace)
        self.where.pop()
        self.busy = False

    def _depends(self, value: Any) -> bool:
        return any(isinstance(x, torch.Tensor) and id(x) in self.slots for x in _leaves(value))

    def name(self, tensor: torch.Tensor, kind: str = "v") -> str:
        self.alive.append(tensor)
        self.slots[id(tensor)] = name = f"{kind}{len(self.alive)}"
        self.values[name] = tensor
        return name

    def _line(self, form: Any, args: Any, kwargs: Any, output: Any, inplace: bool = False) -> None:
        """A line of the program: `form` of `args` and `kwargs` gives `output` (`inplace`: in the
        first argument, whose name then stands for the result)."""
        where = self.where[-1]
        if isinstance(output, torch.Tensor):
            first = args[0] if args else None
            if output is first and not inplace:  # its input back (x.float() of floats): same name
                return
            same_elements = not inplace and (
                isinstance(first, torch.Tensor)
                and id(first) in self.slots
                and output.dtype == first.dtype
                and output.numel() == first.numel()
            )
            if (
                same_elements
                and output.shape == first.shape
                and (
                    form in _IDENTITIES
                    or (output.data_ptr() == first.data_ptr() and output.stride() == first.stride())
                )
            ):
                self.alive.append(output)  # contiguous, clone, an identity: the same name
                self.slots[id(output)] = self.slots[id(first)]
                return
            if (
                same_elements
                and output.data_ptr() == first.data_ptr()
                and output.is_contiguous()
                and first.is_contiguous()
            ):  # a view that reshapes (flatten, view, squeeze): at the recorded shapes
                args, kwargs, form = (first, tuple(output.shape)), {}, np.reshape
            arguments = self.template((args, kwargs))
            if inplace and id(output) in self.slots:  # torch's value under the old name is gone
                self.overwritten.add(self.slots[id(output)])
            self.lines.append(_Line(self.name(output), form, arguments, where))
            return
        target = f"s{len(self.lines)}"
        self.lines.append(_Line(target, form, self.template((args, kwargs)), where))
        for path, leaf in _paths(output):
            if isinstance(leaf, torch.Tensor):
                self.lines.append(_Line(self.name(leaf), None, (target, path), where))

    def template(self, value: Any) -> Any:
        """`value` with each tensor as its slot: a name, or a NumPy constant (made of neither
        inputs nor weights)."""
        if isinstance(value, torch.Tensor):
            if id(value) in self.slots:
                return _Slot(self.slots[id(value)])
            name = f"c{len(self.constants)}"
            self.constants[name] = _numpy(value)
            return _Slot(name)
        if isinstance(value, (tuple, list)):
            return type(value)(self.template(x) for x in value)
        if isinstance(value, dict):
            return {key: self.template(x) for key, x in value.items()}
        if isinstance(value, slice) and any(isinstance(x, torch.Tensor) for x in _leaves(value)):
            raise NoNumpyForm(f"a slice bounded by a tensor in {self.where[-1]}")
        return value

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        output = func(*args, **kwargs)
        if self.busy or self.inside or not self._depends((args, kwargs)):
            return output
        self.busy = True  # the recorder's own calls on tensors are not the policy's
        try:
            self._record(func, args, kwargs, output)
        finally:
            self.busy = False
        return output

    def _record(self, func: Callable, args: tuple, kwargs: dict, output: Any) -> None:
        name = getattr(func, "__name__", repr(func))
        if name == "__get__":  # a property: x.shape, x.T
            name = getattr(getattr(func, "__self__", None), "__name__", name)
        if not any(isinstance(x, torch.Tensor) for x in pytree.tree_leaves(output)):
            if name in SHAPE_QUERIES:
                return
            raise NoNumpyForm(f"{name}() reads a value of the network in {self.where[-1]}")
        if name.endswith("_") and not name.endswith("__") and output is args[0]:
            # in place: as its out-of-place form, where no other tensor views the one it changes
            viewed = args[0]._base is not None or any(x._base is args[0] for x in self.alive)
            if self.slots[id(args[0])].startswith("w"):  # a state kept from call to call
                raise NoNumpyForm(f"{name} changes a weight or buffer in {self.where[-1]}")
            if name[:-1] not in FUNCTIONS or viewed:
                raise NoNumpyForm(f"the in-place {name} in {self.where[-1]}")
            self._line(FUNCTIONS[name[:-1]], args, kwargs, output, inplace=True)
            return
        if (name.endswith("_") and not name.endswith("__")) or kwargs.get("out") is not None:
            raise NoNumpyForm(f"the in-place {name} in {self.where[-1]}")
        if name == "__getitem__" and any(
            isinstance(x, torch.Tensor) and x.dtype in (torch.bool, torch.uint8)
            for x in _leaves(args[1:])
        ):
            raise NoNumpyForm(
                f"a mask picks a number of elements that depends on values in {self.where[-1]}"
            )
        if name == "where" and len(args) + len(kwargs) == 1:
            raise NoNumpyForm(
                f"where(condition) gives a number of elements that depends on values in {self.where[-1]}"
            )
        if "dropout" in name and kwargs.get("training", args[2] if len(args) > 2 else True):
            raise NoNumpyForm(f"{name} in train mode draws at random in {self.where[-1]}")
        if name in ("expand_as", "expand", "broadcast_to", "broadcast_tensors"):
            # They read only shapes, fixed here: expanding a weight is done once per refresh.
            for x, y in zip(
                args if name == "broadcast_tensors" else args[:1], tensors_in(output), strict=True
            ):
                if id(x) in self.slots:
                    self._line(np.broadcast_to, (x, tuple(y.shape)), {}, y)
            return
        if name in ("chunk", "split") and isinstance(output, tuple):
            # views at the recorded shapes: one C call that indexes each (np.split costs microseconds)
            pieces = [_piece_index(args[0], piece) for piece in output]
            self._line(_items(pieces), args[:1], {}, output)
            return
        if name in ("to", "type_as", "type") and isinstance(output, torch.Tensor):
            dtype = _NUMPY_DTYPES.get(output.dtype)
            if dtype is None:
                raise NoNumpyForm(f"no NumPy form for the dtype {output.dtype} in {self.where[-1]}")
            self._line(_cast(dtype), args[:1], {}, output)
            return
        first = args[0] if args else None
        if (
            name not in FUNCTIONS
            and isinstance(output, torch.Tensor)
            and isinstance(first, torch.Tensor)
            and output.data_ptr() == first.data_ptr()
            and output.numel() == first.numel()
            and output.dtype == first.dtype
            and output.is_contiguous()
            and first.is_contiguous()
        ):  # a view that only reshapes (unflatten, view_as, ...): at the recorded shapes
            self._line(np.reshape, (first, tuple(output.shape)), {}, output)
            return
        if name not in FUNCTIONS:
            raise NoNumpyForm(f"no NumPy form for torch's {name} in {self.where[-1]}")
        self._line(FUNCTIONS[name], args, kwargs, output, inplace=bool(kwargs.get("inplace")))

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()


def _leaves(value: Any) -> list[Any]:
    """The leaves of `value`, those in slices too."""
    leaves = []
    for x in pytree.tree_leaves(value):
        leaves += [x.start, x.stop, x.step] if isinstance(x, slice) else [x]
    return [x for x in leaves if x is not None]


def _cast(dtype: type) -> Callable[[np.ndarray], np.ndarray]:
    return lambda x: x.astype(dtype, copy=False)


def _numpy(tensor: torch.Tensor) -> np.ndarray:
    """A NumPy copy: float32 for floating point (the copy computes in float32), else as it is."""
    if tensor.is_floating_point():
        return float32_copy(tensor)
    return tensor.detach().cpu().numpy().copy()


def _paths(value: Any, path: tuple = ()) -> list[tuple[tuple, Any]]:
    if isinstance(value, (tuple, list)):
        return [pair for i, x in enumerate(value) for pair in _paths(x, (*path, i))]
    return [(path, value)]


def _slots(value: Any) -> set[str]:
    return {x.name for x in pytree.tree_leaves(value, is_leaf=_is_slot) if _is_slot(x)}


def _is_slot(x: Any) -> bool:
    return isinstance(x, _Slot)


class NumpyCopy:
    """A policy function recorded as NumPy code (`code`, for reading): arrays in, arrays out, at
    the recorded shapes. The lines that read weights only run once per `refresh`; the others at
    every call."""

    def __init__(self, recorder: _Recorder, inputs: list[str], outputs: Any):
        self.recorder, self.outputs = recorder, outputs
        needed, kept = _slots(outputs), []
        for line in reversed(recorder.lines):  # what the outputs need, nothing else
            if line.target in needed:
                kept.append(line)
                needed |= {line.arguments[0]} if line.form is None else _slots(line.arguments)
        kept.reverse()
        self.weights = {name: x for name, x in recorder.weights.items() if name in needed}
        per_call = set(inputs)
        for line in kept:
            read = {line.arguments[0]} if line.form is None else _slots(line.arguments)
            if read & per_call:
                per_call.add(line.target)
        self.namespace: dict[str, Any] = {"np": np, **recorder.constants}
        self.modules: dict[str, nn.Module] = {}
        prologue = [self._source(line) for line in kept if line.target not in per_call]
        body = [self._source(line) for line in kept if line.target in per_call]
        computed = [line.target for line in kept if line.target not in per_call]
        self.code = (
            "def refresh():\n"
            + "".join(f"    {line}\n" for line in prologue)
            + f"    return {{{', '.join(f'{name!r}: {name}' for name in computed)}}}\n\n"
            + f"def policy({', '.join(inputs)}):\n"
            + "".join(f"    {line}\n" for line in body)
            + f"    return {_source(outputs)}\n\n"
            + f"def every_value({', '.join(inputs)}):\n"
            + "".join(f"    {line}\n" for line in body)
            + "    return locals()\n"
        )
        exec(compile(self.code, "<numpy copy>", "exec"), self.namespace)
        self.policy = self.namespace["policy"]
        self.policy.code = self.code  # for reading: print(act.code)

    def _source(self, line: _Line) -> str:
        if line.form is None:
            source, path = line.arguments
            return f"{line.target} = {source}" + "".join(f"[{i}]" for i in path)
        if line.form is np.reshape:  # a method call: np.reshape costs a dispatch
            (source, shape), _ = line.arguments
            return f"{line.target} = {_source(source)}.reshape({shape!r})"
        function = f"f_{line.target}"
        if isinstance(line.form, nn.Module):
            self.modules[function] = line.form
        else:
            self.namespace[function] = line.form
        args, kwargs = line.arguments
        arguments = [_argument(x, self.namespace) for x in args]
        arguments += [f"{key}={_argument(x, self.namespace)}" for key, x in kwargs.items()]
        return f"{line.target} = {function}({', '.join(arguments)})"

    def refresh(self) -> None:
        """Take in the network's current weights."""
        self.namespace.update({name: _numpy(x) for name, x in self.weights.items()})
        self.namespace.update({name: _module_form(m) for name, m in self.modules.items()})
        self.namespace.update(self.namespace["refresh"]())

    def __call__(self, *inputs: np.ndarray) -> Any:
        return self.policy(*inputs)

    def agrees(self, inputs: Sequence[np.ndarray], expected: list[torch.Tensor]) -> bool:
        """Whether the copy's outputs on `inputs` are torch's `expected` ones: floats to 1e-4, and
        integers (argmax draws) but for one element, which a float32 tie may flip."""
        outputs = pytree.tree_leaves(self(*inputs))
        if len(outputs) != len(expected):
            return False
        for output, torch_output in zip(outputs, expected, strict=True):
            torch_output = torch_output.detach().cpu().numpy()
            if np.shape(output) != torch_output.shape:
                return False
            if np.issubdtype(torch_output.dtype, np.floating):
                if not np.allclose(output, torch_output, rtol=1e-4, atol=1e-4):
                    return False
            elif np.count_nonzero(output != torch_output) > 1:
                return False
        return True

    def first_difference(
        self, inputs: Sequence[np.ndarray], expected: list[torch.Tensor]
    ) -> str | None:
        """Where a new recording on its `inputs` computes otherwise than torch: the first line whose
        float value differs from torch's to 1e-4 (its module or call), whether or not the outputs
        show it (an argmax hides small differences), else the outputs if they differ (`agrees`)."""
        values = {**self.namespace, **self.namespace["every_value"](*inputs)}
        for line in self.recorder.lines:
            torch_value = self.recorder.values.get(line.target)
            if (
                line.target not in values
                or torch_value is None
                or not torch_value.is_floating_point()
                or line.target in self.recorder.overwritten
            ):
                continue
            torch_value, numpy_value = torch_value.detach().cpu().numpy(), values[line.target]
            if np.shape(numpy_value) != torch_value.shape or not np.allclose(
                numpy_value, torch_value, rtol=1e-4, atol=1e-4
            ):
                return line.where
        return None if self.agrees(inputs, expected) else "the policy's outputs"


def _argument(value: Any, namespace: dict[str, Any]) -> str:
    """Source for an argument: names for slots; constants of other kinds go in `namespace`."""
    if isinstance(value, (_Slot, int, bool, str, type(None))) or (
        isinstance(value, float) and math.isfinite(value)
    ):
        return _source(value)
    if isinstance(value, (tuple, list)):
        parts = [_argument(x, namespace) for x in value]
        if isinstance(value, list):
            return "[" + ", ".join(parts) + "]"
        return "(" + "".join(f"{p}, " for p in parts) + ")"
    name = f"k{len(namespace)}"
    namespace[name] = value
    return name


def _source(value: Any) -> str:
    if isinstance(value, _Slot):
        return value.name
    if isinstance(value, tuple):
        return "(" + "".join(f"{_source(x)}, " for x in value) + ")"
    if isinstance(value, list):
        return "[" + ", ".join(_source(x) for x in value) + "]"
    return repr(value)


def record_numpy_copy(
    policy: Callable[..., Any], inputs: Sequence[np.ndarray], network: nn.Module
) -> NumpyCopy:
    """`policy` (tensors on `network`'s device in and out; it calls `network`) as NumPy code,
    recorded from one call on `inputs` and checked there: its outputs must equal torch's to 1e-4.
    Raises NoNumpyForm naming what it cannot follow: a module or function it has no NumPy form
    for, a branch on a value, a random draw."""
    if torch_module._global_forward_hooks or torch_module._global_forward_pre_hooks:
        raise NoNumpyForm("global forward hooks are registered")
    recorder = _Recorder(network)
    tensors = _astensors_in(inputs, network)
    names = [recorder.name(x) for x in tensors]
    state = _random_states()
    try:
        with torch.no_grad(), recorder:
            expected = policy(*tensors)
    finally:
        recorder.close()
    if not all(torch.equal(a, b) for a, b in zip(state, _random_states(), strict=True)):
        raise NoNumpyForm("the policy draws from torch's generator (its own noise, a sample())")
    copy = NumpyCopy(recorder, names, recorder.template(expected))
    copy.refresh()
    where = copy.first_difference(inputs, tensors_in(expected))
    if where is not None:
        raise NoNumpyForm(f"its NumPy form computes otherwise than torch in {where}")
    recorder.alive, recorder.values = [], {}  # torch's values: only the check needed them
    return copy


def _random_states() -> list[torch.Tensor]:
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else []
    return [torch.random.get_rng_state(), *cuda]


def _astensors_in(inputs: Sequence[np.ndarray], network: nn.Module) -> list[torch.Tensor]:
    device = next(network.parameters()).device
    return [torch.as_tensor(x, device=device) for x in inputs]


def numpy_copy(
    policy: Callable[..., Any], inputs: Sequence[np.ndarray], network: nn.Module
) -> Callable[..., Any] | None:
    """A NumPy copy of `policy` (see `record_numpy_copy`), as a function (its source in `.code`), at
    `network`'s current weights, checked against torch on `inputs` (a rollout's first ones);
    recorded once per network and policy, and recorded again if the check fails. None, with one
    notice, where the copy cannot follow the policy: the caller then acts with torch."""
    # kept on the network: a copy refers to it, and they go together
    copies = network.__dict__.setdefault("_numpy_copies", {})
    key = getattr(policy, "__code__", type(policy))  # a new closure each rollout: its code
    if key in copies and copies[key] is None:
        return None
    copy = copies.get(key)
    try:
        if copy is not None:
            copy.refresh()
            with torch.no_grad():
                expected = tensors_in(policy(*_astensors_in(inputs, network)))
            if copy.agrees(inputs, expected):
                return copy.policy
        copies[key] = copy = record_numpy_copy(policy, inputs, network)
    except Exception as exc:  # whatever an edit did: the torch policy is always right
        copies[key] = None
        reason = str(exc) if isinstance(exc, NoNumpyForm) else f"{type(exc).__name__}: {exc}"
        notice(f"the rollout acts with the torch policy at every step (no NumPy copy: {reason})")
        return None
    return copy.policy


def tensors_in(outputs: Any) -> list[torch.Tensor]:
    return [x for x in pytree.tree_leaves(outputs) if isinstance(x, torch.Tensor)]

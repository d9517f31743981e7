"""NumPy copies of small torch networks, for rollouts where a torch call per step costs more than its arithmetic.

A snapshot is derived from the modules layer by layer and copies their weights, so it computes what the modules
computed when it was taken. It knows a fixed set of layer types, matched exactly (a subclass may compute something
else), and any module with a ``numpy_snapshot()`` method that returns its NumPy form. A layer it does not know, and
any forward hook (spectral norm, weight norm and many adapters are hooks or parametrizations), make it refuse with
``NoNumpyForm``; the caller then runs the torch modules instead.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.nn as nn
from torch.nn.modules import module as torch_module

from common.cli import notice
from common.errors import PolicyMismatch

NumpyFunction = Callable[[np.ndarray], np.ndarray]


class NoNumpyForm(Exception):
    """A module has no NumPy form here; the message names it."""


def _copy(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().to("cpu", torch.float32).numpy().copy()


def _linear(layer: nn.Linear) -> NumpyFunction:
    weight = _copy(layer.weight).T
    bias = _copy(layer.bias) if layer.bias is not None else np.float32(0)
    return lambda x: x @ weight + bias


def _layer_norm(layer: nn.LayerNorm) -> NumpyFunction:
    weight = _copy(layer.weight) if layer.weight is not None else np.float32(1)
    bias = _copy(layer.bias) if layer.bias is not None else np.float32(0)
    axes = tuple(range(-len(layer.normalized_shape), 0))
    eps = np.float32(layer.eps)

    def layer_norm(x: np.ndarray) -> np.ndarray:
        centred = x - x.mean(axes, keepdims=True)
        return centred / np.sqrt((centred * centred).mean(axes, keepdims=True) + eps) * weight + bias

    return layer_norm


def _leaky_relu(layer: nn.LeakyReLU) -> NumpyFunction:
    slope = np.float32(layer.negative_slope)
    return lambda x: np.where(x >= 0, x, x * slope)


def _elu(layer: nn.ELU) -> NumpyFunction:
    alpha = np.float32(layer.alpha)
    return lambda x: np.where(x > 0, x, alpha * np.expm1(x))


LAYERS: dict[type[nn.Module], Callable[[nn.Module], NumpyFunction]] = {
    nn.Linear: _linear,
    nn.LayerNorm: _layer_norm,
    nn.Tanh: lambda layer: np.tanh,
    nn.ReLU: lambda layer: lambda x: np.maximum(x, np.float32(0)),
    nn.LeakyReLU: _leaky_relu,
    nn.ELU: _elu,
    nn.Sigmoid: lambda layer: lambda x: np.float32(1) / (np.float32(1) + np.exp(-x)),
    nn.SiLU: lambda layer: lambda x: x / (np.float32(1) + np.exp(-x)),
    nn.Identity: lambda layer: lambda x: x,
}
"""The layer types a snapshot knows, each with the function that builds its NumPy form from a layer."""


def _has_forward_hooks(module: nn.Module) -> bool:
    return bool(module._forward_hooks or module._forward_pre_hooks)


def numpy_snapshot(*modules: nn.Module) -> NumpyFunction:
    """A NumPy function of float32 arrays that computes `modules` applied one after another, at their current
    weights. `nn.Sequential` containers are followed into; every other module must be a known layer type or
    have a `numpy_snapshot()` method. Raises NoNumpyForm naming the first module it cannot copy."""
    if torch_module._global_forward_hooks or torch_module._global_forward_pre_hooks:
        raise NoNumpyForm("global forward hooks are registered")
    functions: list[NumpyFunction] = []
    for module in modules:
        if _has_forward_hooks(module):
            raise NoNumpyForm(f"{module.__class__.__name__} has forward hooks")
        if type(module) is nn.Sequential:
            functions.append(numpy_snapshot(*module))
        elif type(module) in LAYERS:
            functions.append(LAYERS[type(module)](module))
        elif callable(getattr(module, "numpy_snapshot", None)):
            functions.append(module.numpy_snapshot())
        else:
            raise NoNumpyForm(f"no NumPy form for layer {module.__class__.__name__}")

    def forward(x: np.ndarray) -> np.ndarray:
        for function in functions:
            x = function(x)
        return x

    return forward


def numpy_snapshot_or_none(*modules: nn.Module) -> NumpyFunction | None:
    """`numpy_snapshot(*modules)`, or None with one notice line saying why there is none."""
    try:
        return numpy_snapshot(*modules)
    except NoNumpyForm as exc:
        notice(f"the rollout calls the torch policy at every step: {exc}")
        return None


def check_same_actions(acted: torch.Tensor, expected: torch.Tensor, scores: torch.Tensor | None = None) -> None:
    """Raise PolicyMismatch unless the rollout's `acted` actions are the `expected` ones, which the torch policy
    gives for the same observations and noise.

    NumPy and torch round float32 differently in the last bits. Continuous actions must agree to 1e-4. Discrete
    actions (pass the `scores` they are the argmax of) may differ only where the two actions' scores tie to 1e-5.
    """
    if scores is not None:
        acted_score, expected_score = scores.gather(-1, acted[:, None]), scores.gather(-1, expected[:, None])
        wrong = ~torch.isclose(acted_score, expected_score, rtol=1e-5, atol=1e-5).squeeze(-1)
    else:
        wrong = ~torch.isclose(acted, expected, rtol=1e-4, atol=1e-4).reshape(len(acted), -1).all(-1)
    if wrong.any():
        first = int(wrong.nonzero()[0, 0])
        raise PolicyMismatch(
            f"the rollout acted with another policy than the torch one (Agent.distribution and Agent.sample): "
            f"{int(wrong.sum())} of {len(wrong)} actions differ (first: {acted[first].tolist()} where the torch "
            f"policy gives {expected[first].tolist()}). The NumPy copy follows the policy's layers only; after "
            f"editing how their output becomes a distribution or a sample, run with --no-numpy-rollout"
        )

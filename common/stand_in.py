"""The rollout's stand-in for the policy, and the checks that keep it the policy.

A rollout step on a CPU costs less with NumPy than with torch at the sizes of these networks. The
stand-in is a NumPy copy of the network, derived from the modules layer by layer
(``numpy_snapshot``) and cell by cell (``numpy_cell``: any ``nn.LSTM`` or ``nn.GRU``), tried against
the torch policy before it acts (``fitting_copy``), and checked against it after every rollout: same
actions for the same noise (``check_same_actions``) and actions that are draws of the policy
(``check_draws``).

``numpy_snapshot`` knows a fixed set of layer types, matched exactly (a subclass may compute
something else), and any module with a ``numpy_snapshot()`` method that returns its NumPy form. A
layer it does not know, and any forward hook (spectral norm, weight norm and many adapters are hooks
or parametrizations), make it refuse with ``NoNumpyForm``; the caller then runs the torch modules
instead."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import numpy as np
import torch
import torch.nn as nn
from torch.nn.modules import module as torch_module

from common.cli import notice
from common.errors import PolicyMismatch, TrainingDiverged

NumpyFunction = Callable[[np.ndarray], np.ndarray]
F = TypeVar("F", bound=Callable[..., Any])


class NoNumpyForm(Exception):
    """A module has no NumPy form here; the message names it."""


def _copy(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().to("cpu", torch.float32).numpy().copy()


def _linear(layer: nn.Linear) -> NumpyFunction:
    # a transposed view makes each matmul copy it
    weight = np.ascontiguousarray(_copy(layer.weight).T)
    bias = _copy(layer.bias) if layer.bias is not None else np.float32(0)
    return lambda x: x @ weight + bias


def _layer_norm(layer: nn.LayerNorm) -> NumpyFunction:
    weight = _copy(layer.weight) if layer.weight is not None else np.float32(1)
    bias = _copy(layer.bias) if layer.bias is not None else np.float32(0)
    axes = tuple(range(-len(layer.normalized_shape), 0))
    eps = np.float32(layer.eps)

    def layer_norm(x: np.ndarray) -> np.ndarray:
        centred = x - x.mean(axes, keepdims=True)
        return (
            centred / np.sqrt((centred * centred).mean(axes, keepdims=True) + eps) * weight + bias
        )

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
"""The layer types a snapshot knows, each with the function that builds its NumPy form from a layer.
"""


def _has_forward_hooks(module: nn.Module) -> bool:
    return bool(module._forward_hooks or module._forward_pre_hooks)


def numpy_snapshot(*modules: nn.Module) -> NumpyFunction:
    """A NumPy function of float32 arrays that computes `modules` applied one after another, at
    their current weights. `nn.Sequential` containers are followed into; every other module must be
    a known layer type or have a `numpy_snapshot()` method. Raises NoNumpyForm naming the first
    module it cannot copy."""
    functions = _numpy_forms(modules)

    def forward(x: np.ndarray) -> np.ndarray:
        for function in functions:
            x = function(x)
        return x

    return forward


def _numpy_forms(modules: Iterable[nn.Module]) -> list[NumpyFunction]:
    """The NumPy forms of `modules` in order, with containers flattened and identities left out:
    each is one Python call per rollout step."""
    if torch_module._global_forward_hooks or torch_module._global_forward_pre_hooks:
        raise NoNumpyForm("global forward hooks are registered")
    functions: list[NumpyFunction] = []
    for module in modules:
        if _has_forward_hooks(module):
            raise NoNumpyForm(f"{module.__class__.__name__} has forward hooks")
        if type(module) is nn.Sequential:
            functions += _numpy_forms(module)
        elif type(module) is not nn.Identity and type(module) in LAYERS:
            functions.append(LAYERS[type(module)](module))
        elif callable(getattr(module, "numpy_snapshot", None)):
            functions.append(module.numpy_snapshot())
        elif type(module) is not nn.Identity:
            raise NoNumpyForm(f"no NumPy form for layer {module.__class__.__name__}")
    return functions


def numpy_cell(rnn: nn.Module) -> Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """One step of an `nn.LSTM` or `nn.GRU` in NumPy: (input (B, in), state (layers, B, state size))
    -> (output, state after the step). An LSTM's state is its hidden and cell states side by side,
    in that order."""
    if type(rnn) not in (nn.LSTM, nn.GRU) or _has_forward_hooks(rnn):
        raise NoNumpyForm(f"no NumPy form for the cell {rnn.__class__.__name__}")
    if (
        rnn.bidirectional
        or rnn.batch_first
        or getattr(rnn, "proj_size", 0)
        or (rnn.dropout and rnn.training)
    ):
        raise NoNumpyForm(
            "no NumPy form for a bidirectional, batch-first, projected or dropout cell"
        )
    layers = []
    for k in range(rnn.num_layers):
        weights = [_copy(getattr(rnn, f"weight_{kind}_l{k}")).T.copy() for kind in ("ih", "hh")]
        biases = [
            _copy(getattr(rnn, f"bias_{kind}_l{k}")) if rnn.bias else np.float32(0)
            for kind in ("ih", "hh")
        ]
        layers.append((*weights, *biases))
    size = rnn.hidden_size

    def sigmoid(x: np.ndarray) -> np.ndarray:
        return np.float32(1) / (np.float32(1) + np.exp(-x))

    def lstm(x: np.ndarray, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        next_state = np.empty_like(state)
        for k, (w_ih, w_hh, b_ih, b_hh) in enumerate(layers):
            hidden, cell = state[k, :, :size], state[k, :, size:]
            # input, forget, cell, output: torch's order
            gates = x @ w_ih + b_ih + hidden @ w_hh + b_hh
            # one call for all four (the cell gate's is unused): fewer NumPy calls
            squashed = sigmoid(gates)
            cell = squashed[:, size : 2 * size] * cell + squashed[:, :size] * np.tanh(
                gates[:, 2 * size : 3 * size]
            )
            x = squashed[:, 3 * size :] * np.tanh(cell)
            next_state[k, :, :size], next_state[k, :, size:] = x, cell
        return x, next_state

    def gru(x: np.ndarray, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        next_state = np.empty_like(state)
        for k, (w_ih, w_hh, b_ih, b_hh) in enumerate(layers):
            # reset, update, new: torch's order
            from_input, from_hidden = (x @ w_ih + b_ih, state[k] @ w_hh + b_hh)
            reset = sigmoid(from_input[:, :size] + from_hidden[:, :size])
            update = sigmoid(from_input[:, size : 2 * size] + from_hidden[:, size : 2 * size])
            new = np.tanh(from_input[:, 2 * size :] + reset * from_hidden[:, 2 * size :])
            x = next_state[k] = (1 - update) * new + update * state[k]
        return x, next_state

    return lstm if isinstance(rnn, nn.LSTM) else gru


def numpy_policy(
    modules: Sequence[nn.Module], log_std: torch.Tensor | None
) -> Callable[..., np.ndarray]:
    """The NumPy form of a feedforward policy, (observations, noise) -> actions: `modules` applied
    in turn give the logits, drawn from with the Gumbel-max trick (`log_std` None), or the Gaussian
    mean, drawn as mean + std * noise."""
    out = numpy_snapshot(*modules)
    if log_std is None:
        return lambda obs, noise: np.argmax(out(obs) + noise, -1)
    std = _copy(log_std.exp())
    return lambda obs, noise: out(obs) + std * noise


def numpy_recurrent_policy(
    normalise: nn.Module,
    cores: Sequence[tuple[nn.Module, nn.Module]],
    head: nn.Module,
    log_std: torch.Tensor | None,
) -> Callable[..., tuple[np.ndarray, np.ndarray]]:
    """The NumPy form of one step of a recurrent policy, (observations, state, episode starts,
    noise) -> (actions, state after the step). The state, zero where an episode starts, holds each
    core's side by side; a core is an (encoder, cell) pair, run on the `normalise`d observations.
    `head` on the first core's output gives the logits or the Gaussian mean, drawn from as
    `numpy_policy` does."""
    normalised, draw = numpy_snapshot(normalise), numpy_policy([head], log_std)
    steps, start = [], 0  # each core's encoder, cell, and part of the state
    for encoder, rnn in cores:
        size = rnn.hidden_size * (2 if isinstance(rnn, nn.LSTM) else 1)
        steps.append((numpy_snapshot(encoder), numpy_cell(rnn), slice(start, start + size)))
        start += size

    def step(obs: np.ndarray, state: np.ndarray, starts: np.ndarray, noise: np.ndarray):
        x, state = normalised(obs), state * ~starts[None, :, None]
        outputs, next_states = zip(
            *[cell(encoder(x), state[..., part]) for encoder, cell, part in steps], strict=True
        )
        return draw(outputs[0], noise), np.concatenate(next_states, -1)

    return step


def trial_inputs(obs: np.ndarray, action_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Observations `obs`, each repeated 256 times, with a draw of noise for each: what
    `fitting_copy` tries."""
    repeated = np.repeat(obs, 256, axis=0)
    return repeated, np.random.default_rng(0).standard_normal((len(repeated), action_size)).astype(
        np.float32
    )


def fitting_copy(
    build: Callable[[], F],
    reference: F,
    trial: Callable[[], tuple[np.ndarray, ...]],
    owner: nn.Module,
) -> F | None:
    """`build()`, a NumPy copy of the rollout's policy of `owner`, if it builds and gives the
    outputs of `reference` (the torch policy: the same arguments, NumPy arrays in and out) on the
    arguments `trial()`; else None, with one notice line. An edit the copy does not follow (a layer
    outside the actor, another output shape) shows here, before the copy acts. The verdict depends
    on the network's structure, not its weights, so it is tried once per `owner`; the check after
    every rollout covers the rest."""
    try:
        copy = build()
        if owner not in _fitting:
            arguments = trial()
            outputs, expected = copy(*arguments), reference(*arguments)
            pairs = zip(
                *(x if isinstance(x, tuple) else (x,) for x in (outputs, expected)), strict=True
            )
            _fitting[owner] = all(
                a.shape == b.shape and np.allclose(a, b, rtol=1e-4, atol=1e-4) for a, b in pairs
            )
        if not _fitting[owner]:
            raise NoNumpyForm("a copy of the actor gives other actions than the torch policy")
    except Exception as exc:  # whatever the edit broke: the torch policy is always right
        notice(f"the rollout calls the torch policy at every step (no NumPy copy: {exc})")
        return None
    return copy


_fitting: weakref.WeakKeyDictionary[nn.Module, bool] = weakref.WeakKeyDictionary()
"""`fitting_copy`'s verdict for each network it has tried."""


def check_same_actions(
    acted: torch.Tensor,
    expected: torch.Tensor,
    numpy_copy: bool,
    scores: torch.Tensor | None = None,
    std: torch.Tensor | None = None,
) -> None:
    """Raise PolicyMismatch unless the rollout's `acted` actions are the `expected` ones, which the
    torch policy gives for the same observations and noise.

    NumPy and torch round float32 differently. Discrete actions (pass the `scores` they are the
    argmax of) may differ only where the two actions' scores tie to 1e-5; continuous ones (pass the
    policy's `std`) must agree to 1% of a standard deviation, plus 1e-4 relative to the action. NaN
    in the torch policy's output (from an observation or a parameter) is a TrainingDiverged."""
    if torch.isnan(scores if scores is not None else expected).any():
        raise TrainingDiverged("the policy's output is NaN: an observation or a parameter is")
    if scores is not None:
        if torch.equal(acted, expected):  # nearly always: the ties below are rare
            return
        acted_score, expected_score = (
            scores.gather(-1, acted[:, None]),
            scores.gather(-1, expected[:, None]),
        )
        wrong = ~torch.isclose(acted_score, expected_score, rtol=1e-5, atol=1e-5).squeeze(-1)
    else:
        wrong = (
            ((acted - expected).abs() > 1e-2 * std + 1e-4 * expected.abs())
            .reshape(len(acted), -1)
            .any(-1)
        )
    if wrong.any():
        first = int(wrong.nonzero()[0, 0])
        advice = (
            "the NumPy copy follows the actor's layers only; after editing how their output becomes a distribution "
            "or a sample, run with --no-numpy-rollout"
            if numpy_copy
            else "the torch policy gave other actions for the same input: is it random (dropout) or does it depend "
            "on the batch (batch norm)?"
        )
        raise PolicyMismatch(
            f"the rollout acted with another policy than Agent.distribution and Agent.sample: {int(wrong.sum())} of "
            f"{len(wrong)} actions differ (first: {acted[first].tolist()} where the torch policy gives "
            f"{expected[first].tolist()}); {advice}"
        )


def check_draws(
    actions: torch.Tensor,
    probs: torch.Tensor | None = None,
    mean: torch.Tensor | None = None,
    std: torch.Tensor | None = None,
) -> None:
    """Raise PolicyMismatch when `actions` are not plausibly draws from the policy, by more than 6
    standard errors.

    Gaussian (`mean`, `std`): the mean and the variance of the standardised actions. Discrete
    (`probs`): the count of each action whose count has a variance of 25 or more (smaller ones are
    too far from normal), and the mean of the randomised probability integral transform, which is
    exactly uniform for true draws whatever the probabilities: it moves when draws are sharper or
    flatter than the policy."""
    if probs is not None:
        variance = (probs * (1 - probs)).sum(0)
        z = (torch.bincount(actions, minlength=probs.shape[-1]) - probs.sum(0)) / variance.sqrt()
        # A count is near normal only when its variance is large: a near-deterministic policy can
        # expect an action 256 times with a variance of 0.05, where two rare draws would be 9
        # standard errors.
        z = z[variance >= 25]
        ordered = probs.sort(-1, descending=True)
        rank = (ordered.indices == actions[:, None]).int().argmax(-1, keepdim=True)
        drawn = ordered.values.gather(-1, rank).squeeze(-1)
        uniform = torch.rand(len(actions), generator=torch.Generator().manual_seed(0)).to(
            probs.device
        )
        transform = ordered.values.cumsum(-1).gather(-1, rank).squeeze(-1) - drawn * uniform
        z = torch.cat([z, ((transform.mean() - 0.5) * (12 * len(actions)) ** 0.5)[None]])
    else:
        standardised = ((actions - mean) / std).flatten()
        n = len(standardised)
        z = torch.stack([standardised.mean() * n**0.5, (standardised.var() - 1) / (2 / n) ** 0.5])
    if (z.abs() > 6).any():
        raise PolicyMismatch(
            f"the rollout's actions are not draws from Agent.distribution ({z.abs().max().item():.1f} standard "
            f"errors off): Agent.sample with Agent.sampling_noise must draw from it"
        )

"""The rollout's stand-in for the policy, and the checks that keep it the policy.

A rollout step on a CPU costs less with NumPy than with torch at the sizes of these networks. The
stand-in is a NumPy copy of the script's own policy function (``numpy_copy``): recorded from one
call of it, it follows the network wherever the script's modules lead (shared torsos, layers after
a recurrent core, residual sums, the distribution and the draw), and is checked against torch on
the first step of every rollout, where it also takes in the weights of the last update. After every
rollout, the update's torch pass checks the actions again: same actions for the same noise
(``check_same_actions``) and actions that are draws of the policy (``check_draws``).

The copy records torch's functions and tensor methods by name (``FUNCTIONS``), and whole calls of
the layers it knows (``LAYERS``, ``numpy_cell`` for ``nn.LSTM`` and ``nn.GRU``, any module with a
``numpy_snapshot()`` method); it follows the user's own modules (subclasses of torch's included)
into their ``forward``. A module of torch's it does not know, a function it has no form for, a
forward hook, a branch on a value or a random draw make it refuse with ``NoNumpyForm``, naming the
module; the rollout then calls the torch policy, with one notice."""

from __future__ import annotations

import copy as copy_module
import math
import operator
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn as nn
from torch.nn.modules import module as torch_module
from torch.utils import _pytree as pytree

from common.cli import notice
from common.envs import observation_map
from common.errors import PolicyMismatch, TrainingDiverged

NumpyFunction = Callable[[np.ndarray], np.ndarray]


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


def numpy_cell(rnn: nn.Module) -> Callable[..., tuple[np.ndarray, Any]]:
    """One step of an `nn.LSTM` or `nn.GRU` in NumPy, called as torch calls it: (input (1, B, in),
    state) -> (output (1, B, hidden), state after the step), where a state is (hidden, cell) for an
    LSTM and hidden for a GRU, each (layers, B, hidden), or None for zeros."""
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
    size, lstm = rnn.hidden_size, isinstance(rnn, nn.LSTM)

    def sigmoid(x: np.ndarray) -> np.ndarray:
        return np.float32(1) / (np.float32(1) + np.exp(-x))

    def step(x: np.ndarray, state: Any = None) -> tuple[np.ndarray, Any]:
        if len(x) != 1:
            raise NoNumpyForm(f"the NumPy form of {type(rnn).__name__} takes one step at a time")
        x = x[0]
        if state is None:
            zeros = np.zeros((rnn.num_layers, len(x), size), np.float32)
            state = (zeros, zeros) if lstm else zeros
        hiddens, cells = state if lstm else (state, None)
        next_hiddens, next_cells = np.empty_like(hiddens), lstm and np.empty_like(cells)
        for k, (w_ih, w_hh, b_ih, b_hh) in enumerate(layers):
            if lstm:
                # input, forget, cell, output: torch's order
                gates = x @ w_ih + b_ih + hiddens[k] @ w_hh + b_hh
                # one call for all four (the cell gate's is unused): fewer NumPy calls
                squashed = sigmoid(gates)
                cell = squashed[:, size : 2 * size] * cells[k] + squashed[:, :size] * np.tanh(
                    gates[:, 2 * size : 3 * size]
                )
                x = next_hiddens[k] = squashed[:, 3 * size :] * np.tanh(cell)
                next_cells[k] = cell
            else:
                # reset, update, new: torch's order
                from_input, from_hidden = (x @ w_ih + b_ih, hiddens[k] @ w_hh + b_hh)
                reset = sigmoid(from_input[:, :size] + from_hidden[:, :size])
                update = sigmoid(from_input[:, size : 2 * size] + from_hidden[:, size : 2 * size])
                new = np.tanh(from_input[:, 2 * size :] + reset * from_hidden[:, 2 * size :])
                x = next_hiddens[k] = (1 - update) * new + update * hiddens[k]
        return x[None], (next_hiddens, next_cells) if lstm else next_hiddens

    return step


DRAWS = (
    "Agent.sample with Agent.sampling_noise must draw from it: a distribution family of its own needs its draw "
    "written there"
)


def check_actions(
    acted: torch.Tensor,
    policy: torch.distributions.Distribution,
    sampled: torch.Tensor | None = None,
    noise: torch.Tensor | None = None,
    explain: Callable[[torch.Tensor], str] | None = None,
    draws: str = DRAWS,
) -> None:
    """Stop the run (PolicyMismatch) unless the rollout's `acted` actions are the torch policy's:
    the `sampled` ones it draws with the same `noise` (`check_same_actions`, where given), scored
    as possible by `policy`, its distribution (a finite log-probability), and plausibly its draws
    (`check_draws`). Any torch distribution: a Categorical's actions are checked by its logits and
    probabilities, a Normal's by its mean and std, any other's by its `log_prob` and `sample`.
    `explain(wrong)`: what the message says of the steps whose actions differ (`Acting.explain`);
    `draws`: what it says of actions that are not draws (where the fix goes)."""
    if sampled is not None and noise is None:
        raise ValueError("check_actions: `sampled` needs the `noise` it was drawn with")
    if isinstance(policy, torch.distributions.Categorical):
        if sampled is not None:
            check_same_actions(acted, sampled, explain, scores=policy.logits + noise)
        check_draws(acted, probs=policy.probs, why=draws)
        return
    if sampled is not None:
        check_same_actions(acted, sampled, explain)
    scored = row_log_probs(policy, acted)
    if not torch.isfinite(scored).all():
        first = int((~torch.isfinite(scored)).nonzero()[0, 0])
        raise PolicyMismatch(
            f"Agent.distribution scores {int((~torch.isfinite(scored)).sum())} of the {len(scored)} actions the "
            f"rollout drew as impossible (first: {acted[first].tolist()}, log-probability {scored[first].item()}): "
            "the update's ratios would be NaN. The draw and the scoring part in Agent.distribution's log_prob: an "
            "unstable inverse (atanh of a tanh action that float32 rounds to the bound) or a support the draw "
            "leaves; clamp the action inside the support before scoring it, or keep what the draw inverts"
        )
    if isinstance(policy, torch.distributions.Normal):
        check_draws(acted, mean=policy.mean, std=policy.stddev, why=draws)
        return
    try:
        device = acted.device
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            fresh = policy.sample()  # the run's draws stay as they are
    except NotImplementedError:
        raise PolicyMismatch(
            f"the action check compares the rollout's actions with draws of Agent.distribution, and its "
            f"{type(policy).__name__} has no `sample`: define `sample` (or `rsample`) on the distribution's class, "
            f"as torch.distributions' own do"
        ) from None
    check_draws(acted, log_probs=(scored, row_log_probs(policy, fresh)), why=draws)


def row_log_probs(policy: torch.distributions.Distribution, actions: torch.Tensor) -> torch.Tensor:
    """`policy.log_prob(actions)`, one per row: summed over what is left after the batch axis (the
    independent dimensions of a Normal's or a Beta's action)."""
    log_probs = policy.log_prob(actions)
    return log_probs.reshape(len(actions), -1).sum(-1)


def check_same_actions(
    acted: torch.Tensor,
    expected: torch.Tensor,
    explain: Callable[[torch.Tensor], str] | None = None,
    scores: torch.Tensor | None = None,
) -> None:
    """Raise PolicyMismatch unless the rollout's `acted` actions are the `expected` ones, which the
    torch policy gives for the same observations and noise; `explain(wrong)` (a mask of the actions
    that differ) says why, where given.

    NumPy and torch round float32 differently. Categorical actions (pass the `scores` they are the
    argmax of) may differ only where the two actions' scores tie to 1e-5; other integer actions
    (a draw per part of a MultiDiscrete action, say) in one step alone, as such a tie would;
    continuous ones must agree to 1% of the action's scale (its standard deviation over the batch,
    per dimension), plus 1e-4 relative to the action. NaN in the torch policy's output (from an
    observation or a parameter) is a TrainingDiverged."""
    if torch.isnan(scores if scores is not None else expected).any():
        raise TrainingDiverged("the policy's output is NaN: an observation or a parameter is")
    if torch.equal(acted, expected):  # nearly always: the ties below are rare
        return
    if scores is not None:
        acted_score, expected_score = (
            scores.gather(-1, acted[:, None]),
            scores.gather(-1, expected[:, None]),
        )
        wrong = ~torch.isclose(acted_score, expected_score, rtol=1e-5, atol=1e-5).squeeze(-1)
    elif not expected.is_floating_point():
        wrong = (acted != expected).reshape(len(acted), -1).any(-1)
        wrong = wrong & (wrong.sum() > 1)
    else:
        flat = expected.reshape(len(expected), -1)
        scale = flat.std(0) if len(flat) > 1 else flat.abs()
        differ = (acted.reshape(flat.shape) - flat).abs() > 1e-2 * scale + 1e-4 * flat.abs()
        wrong = differ.any(-1)
    if wrong.any():
        first = int(wrong.nonzero()[0, 0])
        raise PolicyMismatch(
            f"the rollout acted with another policy than the update's: {int(wrong.sum())} of {len(wrong)} actions "
            f"differ from those it draws with the same noise (first: {acted[first].tolist()} where it gives "
            f"{expected[first].tolist()}); "
            + (
                explain(wrong)
                if explain is not None
                else "the rollout must act through Agent.distribution and Agent.sample"
            )
        )


class Acting:
    """The rollout's policy function as the loop calls it, NumPy arrays in and out: `function`
    (the NumPy copy, where `numpy_copy`, or a torch call of `torch_function`), with what it was given
    and what it gave at each call. Where the rollout's actions are not the update's, `explain` reads
    these to say which part of the rollout made them otherwise, and where the fix goes.

    `update_pass(*inputs)`: the actor's output of the update's pass for one call's inputs;
    `action_of(output)`: the actions in what the function gives; `names`: how the loop names each
    input, and `stored`, where the loop keeps it (an array (steps, envs, ...), filled in place; None
    for one it does not keep as given); `page`: the script's docs page; `starts`: which input marks
    the envs whose episode starts at the step, and `start_state`, where the state an episode starts
    from is defined (a recurrent script's), for a pass along the rollout that departs from its
    steps where an episode starts."""

    def __init__(
        self,
        function: Callable[..., Any],
        torch_function: Callable[..., Any],
        numpy_copy: bool,
        network: nn.Module,
        update_pass: Callable[..., torch.Tensor],
        names: tuple[str, ...],
        stored: tuple[Any, ...],
        page: str,
        action_of: Callable[[Any], np.ndarray] = lambda output: output,
        starts: int | None = None,
        start_state: str = "",
    ):
        self.function, self.torch_function, self.numpy_copy = function, torch_function, numpy_copy
        self.network, self.update_pass, self.names, self.page = network, update_pass, names, page
        self.stored = stored
        self.section = f'({page}, "When a check stops a run")'  # where each message points
        # batch norm's statistics as the rollout acts with them, before a train-mode pass moves them
        self.buffers = {name: buffer.clone() for name, buffer in network.named_buffers()}
        self.action_of, self.starts, self.start_state = action_of, starts, start_state
        # What each call was given and gave, copied then: where every input is an array (of a stored
        # one's shape) and the output an array or a tuple of arrays, into the next row of arrays as
        # long as the rollout, one per input and output part, made at the first call (a row costs
        # less to write than a copy, and `check` compares whole arrays); from a call that does not
        # fit them on, as copies in the lists.
        self.calls, self._rows_filled = 0, 0
        self._input_rows: list[np.ndarray] | None = None
        self._output_rows: list[np.ndarray] = []
        self._tuple_output = False
        self._given_copies: list[tuple[Any, ...]] = []
        self._gave_copies: list[Any] = []

    def __call__(self, *inputs: Any) -> Any:
        outputs = self.function(*inputs)
        k = self.calls
        self.calls = k + 1
        # Loops, not comprehensions, and no helper: no function call on the action's path.
        if k == 0:  # the rows, where the first call's inputs are arrays of the stored shapes
            parts = outputs if type(outputs) is tuple else (outputs,)
            kept = (*self.stored, *(None,) * len(parts))  # a stored input's row in its dtype
            lengths = {len(saved) for saved in self.stored if type(saved) is np.ndarray}
            rows: list[np.ndarray] | None = []
            if len(lengths) != 1 or len(inputs) != len(self.stored):
                rows = None
            for x, saved in zip((*inputs, *parts), kept, strict=True):
                if rows is None or type(x) is not np.ndarray:
                    rows = None
                    break
                if type(saved) is np.ndarray and x.shape != saved.shape[1:]:
                    rows = None
                    break
                dtype = saved.dtype if type(saved) is np.ndarray else x.dtype
                rows.append(np.empty((*lengths, *x.shape), dtype))
            if rows is not None:
                self._input_rows, self._output_rows = rows[: len(inputs)], rows[len(inputs) :]
                self._tuple_output = type(outputs) is tuple
        if self._input_rows is not None and k == self._rows_filled:
            try:
                for row, x in zip(self._input_rows, inputs, strict=True):
                    row[k] = x
                if self._tuple_output:
                    for row, part in zip(self._output_rows, outputs, strict=True):
                        row[k] = part
                else:
                    self._output_rows[0][k] = outputs
                self._rows_filled = k + 1
                return outputs
            except (IndexError, ValueError, TypeError):  # another shape, or past the rollout's end
                pass
        self._given_copies.append(tuple(_copied(x) for x in inputs))
        self._gave_copies.append(_copied(outputs))
        return outputs

    @property
    def given(self) -> list[tuple[Any, ...]]:
        """Each call's inputs, in order."""
        rows = self._input_rows or []
        in_rows = [tuple(row[k] for row in rows) for k in range(self._rows_filled)]
        return in_rows + self._given_copies

    @property
    def gave(self) -> list[Any]:
        """Each call's output, in order."""
        rows = self._output_rows
        in_rows = [tuple(row[k] for row in rows) for k in range(self._rows_filled)]
        if not self._tuple_output:
            in_rows = [output for (output,) in in_rows]
        return in_rows + self._gave_copies

    def _stacked(self) -> tuple[list[np.ndarray], Any] | None:
        """Every call's inputs, an array each, and outputs (an array, or a tuple of them for the
        parts of a tuple), where all calls are in the rows; else None."""
        if self._input_rows is None or self._given_copies:
            return None
        filled = self._rows_filled
        outputs = tuple(row[:filled] for row in self._output_rows)
        return [row[:filled] for row in self._input_rows], (
            outputs if self._tuple_output else outputs[0]
        )

    @property
    def code(self) -> str:
        """The NumPy copy's source (`print(act.code)`); empty for the torch policy."""
        return getattr(self.function, "code", "")

    def check(self, network: nn.Module, actions: torch.Tensor) -> None:
        """After the rollout, before the update's pass is checked against it: stop the run unless
        the loop called this function once per step, of `network` (the one the update trains), with
        what it stored (`stored`), and stored its `actions` (flat: steps x envs) as it gave them.
        Each message says what the loop did otherwise and where the fix goes."""
        if network is not self.network and _ids(self.network) != _ids(network):
            raise PolicyMismatch(
                f"the rollout's policy was made from another {type(self.network).__name__} than the one the update "
                f"trains: the update scores each action under its own policy, so rollout_policy must be given the "
                f"agent that trains {self.section}"
            )
        if not self.calls or len(actions) % self.calls:
            raise PolicyMismatch(
                f"the loop called its policy `act` (from rollout_policy) {self.calls} times for {len(actions)} "
                f"actions: the update draws each action from Agent.distribution and scores it there, so the loop "
                f"must take its actions from one call of `act` per step; a change to how actions are drawn belongs "
                f"in Agent.distribution {self.section}"
            )
        stacked = self._stacked()
        given = (
            stacked[0] if stacked else [[x[k] for x in self.given] for k in range(len(self.names))]
        )
        for name, saved, given_to_act in zip(self.names, self.stored, given, strict=True):
            place = None if saved is None else _first_difference(given_to_act, saved)
            if place is not None and name.startswith("noise"):
                raise PolicyMismatch(
                    f"the loop gave `act` other noise than Agent.sampling_noise drew ({name}, first at step "
                    f"{place[0]}, env {place[1]}), and the update checks and scores each action with that noise: "
                    f"a temperature or an exploration scale belongs in Agent.distribution {self.section}"
                )
            if place is not None:
                raise PolicyMismatch(
                    f"the loop gave `act` another {name} than it stored for the update (first at step {place[0]}, "
                    f"env {place[1]}): the update trains the policy on what the loop stores. To show the policy "
                    f"something else (a bonus, a feature), change the observation in make_env, with a wrapper, so "
                    f"that the rollout, the update and evaluation all see it {self.section}"
                )
        steps = self.calls
        gave = (
            self.action_of(stacked[1])
            if stacked
            else np.stack([self.action_of(x) for x in self.gave])
        )
        gave = torch.as_tensor(gave)
        gave, stored_actions = gave.reshape(steps, -1, gave[0, 0].numel()), actions.cpu()
        stored_actions = stored_actions.reshape(gave.shape).to(gave.dtype)
        changed = (gave != stored_actions).any(-1)
        if not changed.any():
            return
        step, env = (int(i) for i in changed.nonzero()[0])
        repeats = changed[1:] & (stored_actions[1:] == stored_actions[:-1]).all(-1)
        if not changed[0].any() and torch.equal(repeats, changed[1:]):
            raise PolicyMismatch(
                f"the loop replaced {int(changed.sum())} of the {changed.numel()} actions `act` drew with the env's "
                f"action of the step before (first at step {step}, env {env}): the update scores each stored action "
                f"as the policy's draw at its step. To repeat actions, repeat them inside the env: a wrapper in "
                f"make_env that steps each action k times, so that the policy acts once per k env steps {self.section}"
            )
        drew, kept = (_scalar(x[step, env]) for x in (gave, stored_actions))
        raise PolicyMismatch(
            f"the loop changed {int(changed.sum())} of the {changed.numel()} actions `act` drew before storing them "
            f"(first at step {step}, env {env}: drew {drew}, stored {kept}), as ε-greedy there does: the update "
            f"scores each stored action with its log-probability under Agent.distribution, so exploration belongs "
            f"in Agent.distribution (for ε-greedy, a mixture of its probabilities with the uniform ones) {self.section}"
        )

    def explain(self, outputs: torch.Tensor, wrong: torch.Tensor) -> str:
        """Why the actions `act` gave, as the loop stored them after `check`, are not those the
        update's pass draws, whose actor `outputs` (flat: steps x envs) are at hand, where `wrong`;
        and where the fix goes. The loop took `act`'s actions as they were, on what it stored: `act`
        itself differs."""
        steps = len(self.given)
        envs = len(wrong) // steps
        outputs = outputs.reshape(steps, envs, *outputs.shape[1:])
        step, env = divmod(int(wrong.nonzero()[0, 0]), envs)
        inputs = self.given[step]
        # the first step where what `act` gave is not what the torch function gives on its inputs (a
        # lone discrete action that differs is a float32 tie between NumPy and torch, not a cause)
        differ = [
            s for s, x in enumerate(self.given) if not _same(self.torch_function(*x), self.gave[s])
        ]
        lone_tie = len(differ) == 1 and _differs_in_one_action(
            self.torch_function(*self.given[differ[0]]), self.gave[differ[0]]
        )
        at_random = (
            "the torch policy gives other outputs on a second call with the same inputs, in eval mode: the network "
            "draws at random even there, or keeps state between calls. Tie noise in the network to module.training, "
            "as dropout does (the rollout acts in eval mode, the update trains in train mode); the randomness of the "
            f"draw itself belongs in Agent.sampling_noise and Agent.sample {self.section}"
        )
        if differ and not lone_tie:
            step, inputs = differ[0], self.given[differ[0]]
            if (
                not _same(self.torch_function(*inputs), self.torch_function(*inputs))
                or not self.numpy_copy
            ):
                return at_random
            return (
                "the NumPy copy of the policy, recorded from it and checked on the rollout's first step, gave "
                f"otherwise at step {step} than the torch policy does on the same inputs: the policy computes "
                "otherwise at other inputs (a branch on a value, state kept between calls); run with "
                f"--no-numpy-rollout, which acts through the torch policy at every step {self.section}"
            )
        with torch.no_grad():
            if not torch.equal(self.update_pass(*inputs), self.update_pass(*inputs)):
                return at_random
        rollout_modules = _modules_called(self.network, self.torch_function, inputs)
        update_modules = _modules_called(self.network, self.update_pass, inputs)
        if rollout_modules != update_modules:
            only = ", ".join(sorted(rollout_modules - update_modules)) or "nothing"
            missing = ", ".join(sorted(update_modules - rollout_modules)) or "nothing"
            return (
                f"rollout_policy's policy calls {only} where the update's pass (Agent.forward) calls {missing}: "
                f"the update trains the policy Agent.forward computes, so a network the policy acts with belongs "
                f"in Agent.forward {self.section}"
            )
        departs = _departs(self.update_pass, self.given, outputs)
        if departs is not None:
            step, env = departs
            if self.starts is not None and step > 0 and self.given[step][self.starts][env]:
                return (
                    f"the update's pass along the rollout departs from the rollout's steps at step {step}, env {env}, "
                    f"where an episode starts: the state an episode starts from must be the same in both: "
                    f"{self.start_state} {self.section}"
                )
            return (
                f"the update's pass along the rollout gives other actor outputs than Agent.forward one step at a "
                f"time on the rollout's inputs, first at step {step}, env {env}: Agent.forward must compute the same "
                f"along a sequence as step by step {self.section}"
            )
        return (
            "rollout_policy's policy calls the update's modules on the same inputs but draws otherwise, first at "
            f"step {step}, env {env}: the network's outputs agree, so the draws part after it, in one of two places. "
            "Either the rollout's policy alone changes the draw (a temperature, a scale, a clip: the update scores "
            "actions with Agent.distribution, so such a change belongs there), or the update's scoring does not "
            "give back the drawn action (Agent.distribution and Agent.sample: an unstable inverse, as atanh of a "
            "saturated tanh action, or a precision loss). To tell them apart, let rollout_policy's policy draw as "
            "the original script's does (Agent.sample of Agent.distribution of the network's output): a run that "
            f"still stops here has its cause in the update's scoring {self.section}"
        )


def _scalar(action: torch.Tensor) -> Any:
    values = action.tolist()
    return values[0] if len(values) == 1 else values


def _ids(network: nn.Module) -> set[int]:
    return {id(p) for p in network.parameters()}


def _copied(value: Any) -> Any:
    if type(value) is np.ndarray:  # nearly always: the fast path
        return value.copy()
    if isinstance(value, dict):
        return {key: _copied(part) for key, part in value.items()}
    if isinstance(value, tuple):
        return tuple(_copied(part) for part in value)
    return copy_module.deepcopy(value)


def _first_difference(given: list[Any] | np.ndarray, stored: Any) -> tuple[int, int] | None:
    """The first (step, env) where the inputs `given` at each step (a list, or one array of them)
    differ from `stored` (steps, envs, ...) read in its dtype, part by part of a dict; None where
    they agree."""
    if isinstance(stored, dict):
        places = [_first_difference([g[key] for g in given], stored[key]) for key in stored]
        return min((place for place in places if place is not None), default=None)
    stored = np.asarray(stored)
    try:
        given = given if type(given) is np.ndarray else np.stack(given)
        same = np.asarray(given, stored.dtype).reshape(stored.shape) == stored
    except ValueError:  # shapes that do not fit: the first step is as good as any
        return 0, 0
    if same.all():
        return None
    step, env = np.argwhere(~same.reshape(*stored.shape[:2], -1).all(-1))[0]
    return int(step), int(env)


def _leaves(output: Any) -> list[np.ndarray]:
    return [np.asarray(x) for x in (output if isinstance(output, tuple) else (output,))]


def _same(a: Any, b: Any) -> bool:
    """Whether two outputs of the rollout's policy function agree: its integer arrays (discrete
    actions) exactly, its float ones (continuous actions, states) to float32 rounding."""
    return all(
        np.array_equal(x, y)
        if np.issubdtype(x.dtype, np.integer)
        else np.allclose(x, y, rtol=1e-4, atol=1e-5 + 1e-4 * np.abs(y).max(initial=0))
        for x, y in zip(_leaves(a), _leaves(b), strict=True)
    )


def _differs_in_one_action(a: Any, b: Any) -> bool:
    """Whether two outputs differ in one discrete action alone."""
    parts = list(zip(_leaves(a), _leaves(b), strict=True))
    actions, rest = parts[0], parts[1:]
    return (
        np.issubdtype(actions[0].dtype, np.integer)
        and int((actions[0] != actions[1]).sum()) == 1
        and _same(tuple(x for x, _ in rest), tuple(y for _, y in rest))
    )


def _modules_called(
    network: nn.Module, function: Callable[..., Any], inputs: tuple[Any, ...]
) -> set[str]:
    """The names of `network`'s own modules (its children) that `function(*inputs)` calls."""
    names = {id(module): name for name, module in network.named_children()}
    called: set[str] = set()

    def record(module: nn.Module, args: Any) -> None:
        if id(module) in names:
            called.add(names[id(module)])

    handle = torch_module.register_module_forward_pre_hook(record)
    try:
        with torch.no_grad():
            function(*inputs)
    finally:
        handle.remove()
    return called


def _departs(
    update_pass: Callable[..., torch.Tensor], given: list[tuple[Any, ...]], outputs: torch.Tensor
) -> tuple[int, int] | None:
    """The first (step, env) where `outputs` (steps, envs, ...), the update's pass along the
    rollout, differ from `update_pass` one step at a time on the inputs `given` at each step."""
    tolerance = 1e-5 + 1e-4 * outputs.abs().max()
    for step, inputs in enumerate(given):
        with torch.no_grad():
            one_step = torch.as_tensor(update_pass(*inputs)).to(outputs.device)
        differ = (
            (one_step.reshape(outputs[step].shape) - outputs[step])
            .abs()
            .reshape(len(one_step), -1)
            .amax(-1)
        )
        if (differ > tolerance).any():
            return step, int((differ > tolerance).nonzero()[0, 0])
    return None


def check_draws(
    actions: torch.Tensor,
    probs: torch.Tensor | None = None,
    mean: torch.Tensor | None = None,
    std: torch.Tensor | None = None,
    why: str = "",
    log_probs: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> None:
    """Raise PolicyMismatch when `actions` are not plausibly draws from the policy, by more than 6
    standard errors; the message ends with `why` (where the fix goes).

    Any distribution (`log_probs`: the policy's log-probability of each row's action, and of a draw
    of its own at each row): a sign test. Two draws from one distribution are as likely to come
    either way, so the actions' log-probabilities exceed the draws' at half the rows; sharper
    actions exceed them more often, flatter or shifted ones less (ties and non-finite pairs left
    out).

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
    elif log_probs is not None:
        scored, drawn = log_probs
        kept = torch.isfinite(scored) & torch.isfinite(drawn)
        signs = torch.sign(scored[kept] - drawn[kept])
        z = signs.sum()[None] / max(int(signs.abs().sum()), 1) ** 0.5
    else:
        standardised = ((actions - mean) / std).flatten()
        n = len(standardised)
        z = torch.stack([standardised.mean() * n**0.5, (standardised.var() - 1) / (2 / n) ** 0.5])
    if (z.abs() > 6).any():
        raise PolicyMismatch(
            f"the rollout's actions are not draws from Agent.distribution ({z.abs().max().item():.1f} standard "
            f"errors off): {why or DRAWS}"
        )


def acts_otherwise_in_training(
    network: nn.Module, forward: Callable[[nn.Module, Any], Any], like: Any
) -> bool:
    """Whether `forward(net, obs)`, a call of `network`'s policy on a batch of observations, gives
    other outputs in train mode than in eval mode (dropout, batch norm, noisy layers: the user's
    choice). Tried on a copy of the network, with torch's random state kept, so that the run's draws
    and statistics are untouched, and on observations of noise shaped as `like` (a batch, or a dict
    of them): zeros, a probe's observation, would meet a new network's zero biases and show no layer
    at work. Where it does, one notice says what it means for the update. The scripts act and check
    in eval mode and update in train mode."""
    noise = np.random.default_rng(0)  # its own: the run's draws stay as they are
    obs = observation_map(lambda part: _noise_like(part, noise), like)
    try:
        copy = copy_module.deepcopy(network)
    except RuntimeError:  # the old nn.utils.weight_norm, say: the network itself, restored after
        copy = network
    state = {key: value.clone() for key, value in network.state_dict().items()}
    device = next(network.parameters()).device
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.no_grad():
        acting = _tensors(forward(copy.eval(), obs))
        training = _tensors(forward(copy.train(), obs))
    if copy is network:
        network.load_state_dict(state)
    differs = any(
        a.shape != b.shape or not torch.equal(a, b) for a, b in zip(acting, training, strict=True)
    )
    if differs:
        notice(TRAINS_OTHERWISE)
    return differs


TRAINS_OTHERWISE = (
    "the network computes otherwise in train mode (dropout, batch norm, noise): the rollout acts in eval mode "
    "and the update trains in train mode, so the first update's ratios are not exactly 1"
)


def check_replay(
    recorded: tuple[torch.Tensor, ...],
    replayed: tuple[torch.Tensor, ...],
    why: str,
    where: Callable[[int], str],
    eval_replay: Callable[[], tuple[torch.Tensor, ...]] | None = None,
    names: tuple[str, ...] = ("actor outputs", "values"),
) -> None:
    """Stop the run unless the `replayed` outputs (a pass along the rollout's steps) are the
    `recorded` ones that the rollout acted on, to float32 rounding: 1e-4 of their largest magnitude
    plus 1e-5. A step's outputs lie along the axes of the last output (the values). NaN or inf
    among the recorded ones is a TrainingDiverged.

    `replayed` may come from train mode: where it differs, `eval_replay()` (the same pass in eval
    mode, as the rollout acted) decides, and if it agrees, one notice says that the network computes
    otherwise in train mode. A difference left is a PolicyMismatch that says `why` they must agree,
    and where: `where(i)`, for the flat index i of the step of the largest difference."""
    mismatch = _replay_mismatch(recorded, replayed, names)
    if mismatch is not None and eval_replay is not None:
        mismatch = _replay_mismatch(recorded, eval_replay(), names)
        if mismatch is None:
            notice(TRAINS_OTHERWISE)
    if mismatch is not None:
        what, largest, tolerance, step = mismatch
        raise PolicyMismatch(
            f"{why}: their {what} differ by up to {largest:.3g} (tolerance {tolerance:.3g}, {where(step)})"
        )


def _replay_mismatch(
    recorded: tuple[torch.Tensor, ...], replayed: tuple[torch.Tensor, ...], names: tuple[str, ...]
) -> tuple[str, float, float, int] | None:
    """The first output of `replayed` that differs from `recorded` beyond the tolerance: its name,
    largest difference, tolerance and the flat index of its step of the largest difference."""
    steps = recorded[-1].shape
    for replayed_part, recorded_part, what in zip(replayed, recorded, names, strict=True):
        if not torch.isfinite(recorded_part).all():
            raise TrainingDiverged(
                f"the policy's {what} are NaN or inf: an observation or a parameter is"
            )
        difference = (replayed_part.detach() - recorded_part).abs().reshape(*steps, -1).amax(-1)
        tolerance = 1e-5 + 1e-4 * recorded_part.abs().max()
        if not difference.max() <= tolerance:  # NaN too
            return what, difference.max().item(), tolerance.item(), int(difference.argmax())
    return None


def _noise_like(array: np.ndarray, noise: np.random.Generator) -> np.ndarray:
    if array.dtype == np.uint8:  # images
        return noise.integers(0, 256, array.shape, dtype=np.uint8)
    if array.dtype == bool or np.issubdtype(array.dtype, np.integer):  # one-hot and flags
        return (noise.random(array.shape) < 0.5).astype(array.dtype)
    return noise.standard_normal(array.shape).astype(array.dtype)


def _tensors(outputs: Any) -> list[torch.Tensor]:
    return [x for x in pytree.tree_leaves(outputs) if isinstance(x, torch.Tensor)]


# A NumPy copy of any policy function, recorded from one run of it.


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


@_fn("mish")
def _mish(x, inplace=False):
    return x * np.tanh(_softplus(x))


@_fn("hardtanh")
def _hardtanh(x, min_val=-1.0, max_val=1.0, inplace=False):
    return np.clip(x, x.dtype.type(min_val), x.dtype.type(max_val))


@_fn("relu6")
def _relu6(x, inplace=False):
    return np.clip(x, x.dtype.type(0), x.dtype.type(6))


@_fn("hardsigmoid")
def _hardsigmoid(x, inplace=False):
    return np.clip(x / x.dtype.type(6) + x.dtype.type(0.5), x.dtype.type(0), x.dtype.type(1))


@_fn("hardswish")
def _hardswish(x, inplace=False):
    return x * _hardsigmoid(x)


@_fn("selu")
def _selu(x, inplace=False):
    alpha, scale = 1.6732632423543772, 1.0507009873554805
    return x.dtype.type(scale) * _elu_function(x, alpha)


@_fn("celu")
def _celu(x, alpha=1.0, inplace=False):
    return np.where(x > 0, x, x.dtype.type(alpha) * np.expm1(x / x.dtype.type(alpha)))


@_fn("logsigmoid")
def _logsigmoid(x):
    return -_softplus(-x)


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


@_fn("normalize")
def _normalize(x, p=2.0, dim=1, eps=1e-12, out=None):
    return x / np.maximum(_norm(x, p, dim, keepdim=True), x.dtype.type(eps))


def _spread(function: Callable) -> Callable:
    def spread(x, dim=None, unbiased=None, keepdim=False, *, correction=None):
        ddof = correction if correction is not None else (0 if unbiased is False else 1)
        axis = tuple(dim) if isinstance(dim, list) else dim
        return function(x, axis=axis, ddof=ddof, keepdims=keepdim)

    return spread


FUNCTIONS.update(var=_spread(np.var), std=_spread(np.std))


@_fn("masked_fill")
def _masked_fill(x, mask, value):
    return np.where(mask, np.asarray(value, x.dtype), x)


@_fn("repeat")
def _repeat(x, *sizes):
    return np.tile(x, _shape(sizes))


@_fn("cumsum")
def _cumsum(x, dim, dtype=None):
    return np.cumsum(x, axis=dim)


@_fn("flip")
def _flip(x, dims):
    return np.flip(x, axis=tuple(dims) if isinstance(dims, (list, tuple)) else dims)


@_fn("roll")
def _roll(x, shifts, dims=None):
    return np.roll(x, shifts, axis=dims)


@_fn("lerp")
def _lerp(x, end, weight):
    return x + weight * (end - x)


@_fn("addcmul")
def _addcmul(x, tensor1, tensor2, value=1):
    return x + value * tensor1 * tensor2


@_fn("glu")
def _glu(x, dim=-1):
    a, b = np.split(x, 2, axis=dim)
    return a * _sigmoid(b)


@_fn("softmin")
def _softmin(x, dim=None, _stacklevel=3, dtype=None):
    return _softmax(-x, dim)


@_fn("erf")
def _erf(x):
    from scipy.special import erf  # an optional dependency: without it, erf acts in torch

    return erf(x).astype(x.dtype)


@_fn("einsum")
def _einsum(equation, *operands):
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = operands[0]
    return np.einsum(equation, *operands)


@_fn("softsign")
def _softsign(x):
    return x / (x.dtype.type(1) + np.abs(x))


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


@_fn("clamp")
@_fn("clip")
def _clamp(x, min=None, max=None):
    return np.clip(x, min, max)


@_fn("linear")
def _linear_function(x, weight, bias=None):
    return x @ weight.T + bias if bias is not None else x @ weight.T


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


@_fn("log_softmax")
def _log_softmax(x, dim=None, _stacklevel=3, dtype=None):
    return x - _logsumexp(x, dim, keepdim=True)


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


_IDENTITIES = {_identity, _dropout, np.broadcast_to}
"""Forms that give their input back: the copy leaves them out"""


@_fn("argmax")
def _argmax(x, dim=None, keepdim=False):
    return x.argmax(dim, keepdims=True) if keepdim else x.argmax(dim)


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


@_fn("reshape")
@_fn("view")
def _reshape(x, *shape):
    return x.reshape(_shape(shape))


@_fn("expand")
def _expand(x, *sizes):
    sizes = _shape(sizes)
    lead = len(sizes) - x.ndim
    return np.broadcast_to(
        x, tuple(s if s != -1 else x.shape[i - lead] for i, s in enumerate(sizes))
    )


@_fn("permute")
def _permute(x, *dims):
    return np.transpose(x, _shape(dims))


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


@_fn("cat")
@_fn("concat")
@_fn("concatenate")
def _cat(tensors, dim=0):
    return np.concatenate(tensors, axis=dim)


@_fn("stack")
def _stack(tensors, dim=0):
    return np.stack(tensors, axis=dim)


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
    if kind is nn.Identity or (
        kind in (nn.Dropout, nn.Dropout1d, nn.AlphaDropout) and not module.training
    ):
        return _identity
    if kind in LAYERS:
        return LAYERS[kind](module)
    if kind in _BATCH_NORMS:
        return _batch_norm(module)
    if kind is nn.Flatten:
        return lambda x: _flatten(x, module.start_dim, module.end_dim)
    if kind is nn.GELU:
        return lambda x: _gelu(x, module.approximate)
    if kind is nn.Softmax:
        return lambda x: _softmax(x, module.dim)
    if kind in (nn.LSTM, nn.GRU):
        return numpy_cell(module)
    if callable(getattr(module, "numpy_snapshot", None)):
        return module.numpy_snapshot()
    return None


_BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d)


def _batch_norm(layer: nn.Module) -> NumpyFunction:
    """Batch norm as it acts in eval mode: by its running statistics."""
    scale = _copy(layer.weight if layer.affine else torch.ones_like(layer.running_var))
    scale /= np.sqrt(_copy(layer.running_var) + np.float32(layer.eps))
    shift = (_copy(layer.bias) if layer.affine else np.float32(0)) - _copy(
        layer.running_mean
    ) * scale

    def batch_norm(x: np.ndarray) -> np.ndarray:
        channels = (-1,) + (1,) * (x.ndim - 2)  # axis 1
        return x * scale.reshape(channels) + shift.reshape(channels)

    return batch_norm


def _has_form(module: nn.Module) -> bool:
    kind = type(module)
    return (
        (kind in _BATCH_NORMS and not module.training and module.running_var is not None)
        or kind in LAYERS
        or kind in (nn.Flatten, nn.GELU, nn.Softmax, nn.LSTM, nn.GRU)
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
                args if name == "broadcast_tensors" else args[:1], _tensors(output), strict=True
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
        return _copy(tensor)
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
    tensors = _as_tensors(inputs, network)
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
    where = copy.first_difference(inputs, _tensors(expected))
    if where is not None:
        raise NoNumpyForm(f"its NumPy form computes otherwise than torch in {where}")
    recorder.alive, recorder.values = [], {}  # torch's values: only the check needed them
    return copy


def _random_states() -> list[torch.Tensor]:
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else []
    return [torch.random.get_rng_state(), *cuda]


def _as_tensors(inputs: Sequence[np.ndarray], network: nn.Module) -> list[torch.Tensor]:
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
                expected = _tensors(policy(*_as_tensors(inputs, network)))
            if copy.agrees(inputs, expected):
                return copy.policy
        copies[key] = copy = record_numpy_copy(policy, inputs, network)
    except Exception as exc:  # whatever an edit did: the torch policy is always right
        copies[key] = None
        reason = str(exc) if isinstance(exc, NoNumpyForm) else f"{type(exc).__name__}: {exc}"
        notice(f"the rollout acts with the torch policy at every step (no NumPy copy: {reason})")
        return None
    return copy.policy

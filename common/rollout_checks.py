"""The checks that the rollout acted with the policy the update trains, and their messages.

The rollout acts through a stand-in for the policy (`common.numpy_copy`, or a torch call), wrapped
in `Acting`, which keeps what it was given and gave at each step. After every rollout the update's
torch pass checks the actions: that the loop called the policy as it stored (`Acting.check`), the
same actions for the same noise (`check_same_actions`), actions the distribution scores as possible
and that are plausibly its draws (`check_actions`, `check_draws`); the recurrent scripts' update
also replays the rollout (`check_replay`). Each stop is one `error:` line that says what differed,
the edit that most likely made it differ and where the fix goes. Any torch distribution whose draw
`Agent.sample` writes is checked (docs/ppo_fc.md, "A distribution of your own")."""

from __future__ import annotations

import copy as copy_module
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn as nn
from torch.nn.modules import module as torch_module
from torch.utils import _pytree as pytree

from common.cli import notice
from common.envs import observation_map
from common.errors import PolicyMismatch, TrainingDiverged
from common.numpy_copy import tensors_in

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
    section: str = "",
) -> None:
    """Stop the run (PolicyMismatch) unless the rollout's `acted` actions are the torch policy's:
    the `sampled` ones it draws with the same `noise` (`check_same_actions`, where given), scored
    as possible by `policy`, its distribution (a finite log-probability), and plausibly its draws
    (`check_draws`). Any torch distribution: a Categorical's actions are checked by its logits and
    probabilities, a Normal's by its mean and std, any other's by its `log_prob` and `sample`.
    `explain(wrong)`: what the message says of the steps whose actions differ (`Acting.explain`);
    `draws`: what it says of actions that are not draws (where the fix goes); `section`: the docs
    section each message ends with."""
    if sampled is not None and noise is None:
        raise ValueError("check_actions: `sampled` needs the `noise` it was drawn with")
    if sampled is not None and sampled.shape != acted.shape:
        raise PolicyMismatch(
            f"Agent.sample drew actions of shape {tuple(sampled.shape)} for the update's {len(acted)} steps, where "
            f"the rollout stored them as {tuple(acted.shape)}: a draw is one action per row of the batch it is "
            f"given, shaped as the distribution's own sample() {section}"
        )
    draws = f"{draws} {section}".strip()
    if isinstance(policy, torch.distributions.Categorical):
        if sampled is not None:
            check_same_actions(acted, sampled, explain, scores=policy.logits + noise)
        check_draws(acted, probs=policy.probs, why=draws)
        return
    if sampled is not None:
        check_same_actions(acted, sampled, explain)
    if isinstance(policy, torch.distributions.Normal):  # finite actions score finite: no log_prob
        check_draws(acted, mean=policy.mean, std=policy.stddev, why=draws)
        return
    scored = row_log_probs(policy, acted)
    if not torch.isfinite(scored).all():
        first = int((~torch.isfinite(scored)).nonzero()[0, 0])
        raise PolicyMismatch(
            f"Agent.distribution scores {int((~torch.isfinite(scored)).sum())} of the {len(scored)} actions the "
            f"rollout drew as impossible (first: {acted[first].tolist()}, log-probability {scored[first].item()}): "
            "the update's ratios would be NaN. The draw and the scoring part in Agent.distribution's log_prob: an "
            "unstable inverse (atanh of a tanh action that float32 rounds to the bound) or a support the draw "
            f"leaves; clamp the action inside the support before scoring it, or keep what the draw inverts {section}"
        )
    try:
        device = acted.device
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            fresh = policy.sample()  # the run's draws stay as they are
    except NotImplementedError:
        raise PolicyMismatch(
            f"the action check compares the rollout's actions with draws of Agent.distribution, and its "
            f"{type(policy).__name__} has no `sample`: define `sample` (or `rsample`) on the distribution's class, "
            f"as torch.distributions' own do {section}"
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
    return [np.asarray(x) for x in pytree.tree_leaves(output)]


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
        acting = tensors_in(forward(copy.eval(), obs))
        training = tensors_in(forward(copy.train(), obs))
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

"""Any torch distribution whose draw Agent.sample writes: the table of three copies of ppo_fc.py
(tests/distribution_edits.py), each trained from its copy, and the errors of the edits that cannot work, each one
`error:` line that says what to define and where."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from distribution_edits import BETA, MULTI_DISCRETE, TANH_GAUSSIAN, copy_source
from helpers import CONTINUOUS, run_in_one_process, visit_states

from common.evaluation import greedy_action

SECTION = '(docs/ppo_fc.md, "When a check stops a run")'
TORCH_ROLLOUT = (
    "notice: the rollout acts with the torch policy at every step (no NumPy copy: no NumPy form for torch's double "
    "in Agent)"
)
TABLE = {
    "tanh_gaussian": (
        TANH_GAUSSIAN,
        "ContinuousProbe5-v0",
        dict(total_timesteps=24_576, **CONTINUOUS),
    ),
    # the Beta's draw computes in float64, which the NumPy copy does not: the rollout calls torch, in 8 envs
    "beta": (
        BETA,
        "ContinuousProbe5-v0",
        dict(total_timesteps=24_576, **{**CONTINUOUS, "num_envs": 8, "num_steps": 256}),
    ),
    "multi_categorical": (MULTI_DISCRETE, "MultiDiscreteProbe-v0", dict(total_timesteps=20_480)),
}


def write_copy(edits, folder, name: str):
    """The copy's file in `folder`, and the copy imported as its own module."""
    folder.mkdir(exist_ok=True)
    path = folder / f"{name}.py"
    path.write_text(copy_source(edits))
    spec = importlib.util.spec_from_file_location(name, path)
    copy = importlib.util.module_from_spec(spec)
    sys.modules[name] = copy  # dataclasses look their module up there
    spec.loader.exec_module(copy)
    return path, copy


@pytest.mark.parametrize("name", TABLE)
def test_a_copy_with_another_distribution_trains_to_the_probe_s_target(tmp_path, capsys, name):
    edits, env_id, settings = TABLE[name]
    _, copy = write_copy(edits, tmp_path / "copy", f"copy_{name}")
    args = copy.Args(
        env_id=env_id, run_dir=str(tmp_path / "runs"), progress=False, eval_episodes=8, **settings
    )
    result = copy.train(args)
    # the NumPy copy of the policy follows the others; no other notice
    notices = [line for line in capsys.readouterr().err.splitlines() if line.startswith("notice")]
    assert notices == ([TORCH_ROLLOUT] if name == "beta" else []), notices
    agent = result.agent.eval()
    for env, observation in visit_states(env_id):
        with torch.no_grad():
            actor_out, value = agent(torch.as_tensor(observation[None], dtype=torch.float32))
        policy = agent.distribution(actor_out)
        assert value.item() == pytest.approx(env.optimal_value(args.gamma), abs=0.25), observation
        greedy = greedy_action(policy)[0].numpy()
        np.testing.assert_allclose(greedy, env.optimal_action(), atol=0.1, err_msg=str(observation))
        if name == "multi_categorical":  # each part's right choice with probability 0.9
            for part, choice in zip(policy.parts, env.optimal_action(), strict=True):
                assert part.probs[0, choice].item() >= 0.9, observation
    # evaluation acted greedily through the rule for each (a mode, or the transforms of the base's)
    assert np.mean(result.eval_returns) >= (0.99 if name == "multi_categorical" else -0.02)


def test_the_copies_train_on_pendulum_and_evaluate_and_the_edits_that_cannot_work_say_what_to_define(
    tmp_path,
):
    def variant(edits, replacements=()):
        for old, new in replacements:
            edits = (*edits, (old, new))
        return edits

    saturating = (
        variant(  # a std of e^3: most tanh actions round to the bound, where atanh is infinite
            TANH_GAUSSIAN,
            [
                (
                    "nn.Parameter(torch.zeros(1, self.action_size))",
                    "nn.Parameter(torch.full((1, self.action_size), 3.0))",
                )
            ],
        )
    )
    narrow = variant(
        TANH_GAUSSIAN,
        [
            (
                "policy.base_dist.mean + policy.base_dist.stddev * noise",
                "policy.base_dist.mean + 0.5 * noise",
            )
        ],
    )
    no_sample = variant(
        MULTI_DISCRETE,
        [("    def sample(self, sample_shape", "    def _sample(self, sample_shape")],
    )
    no_log_prob = variant(
        MULTI_DISCRETE,
        [("    def log_prob(self, action: Tensor)", "    def _log_prob(self, action: Tensor)")],
    )
    wrong_shape = (
        variant(  # a draw with a leading axis: the rollout's (1, envs, 2) stores as (envs, 2)
            MULTI_DISCRETE, [("for part, n in parts], -1)\n", "for part, n in parts], -1)[None]\n")]
        )
    )
    no_mode = variant(
        MULTI_DISCRETE, [("    @property\n    def mode(self)", "    def _mode(self)")]
    )
    copies = {
        name: write_copy(edits, tmp_path / name, f"run_{name}")[0]
        for name, edits in dict(
            tanh=TANH_GAUSSIAN,
            beta=BETA,
            saturating=saturating,
            narrow=narrow,
            no_sample=no_sample,
            no_log_prob=no_log_prob,
            wrong_shape=wrong_shape,
            no_mode=no_mode,
        ).items()
    }
    pendulum = ["--env-id", "Pendulum-v1", "--num-steps", "256", "--no-progress"]
    probe = [
        "--env-id",
        "MultiDiscreteProbe-v0",
        "--num-steps",
        "64",
        "--no-progress",
        "--total-timesteps",
        "256",
    ]
    calls = {
        "tanh": [*pendulum, "--total-timesteps", "4096", "--eval-episodes", "1"],
        "beta": [*pendulum, "--total-timesteps", "4096", "--eval-episodes", "1"],
        "saturating": [*pendulum, "--total-timesteps", "1024"],
        "narrow": [*pendulum, "--total-timesteps", "1024"],
        "no_sample": probe,
        "no_log_prob": probe,
        "wrong_shape": probe,
        "no_mode": [*probe, "--eval-episodes", "1"],
    }
    done = dict(
        zip(
            calls,
            run_in_one_process(
                [
                    [str(copies[name]), *flags, "--run-dir", str(tmp_path / "runs" / name)]
                    for name, flags in calls.items()
                ]
            ),
            strict=True,
        )
    )
    for name in ("tanh", "beta"):
        assert done[name].returncode == 0, done[name].stderr[-3000:]
        assert "eval return" in done[name].stdout, done[name].stderr[-3000:]
        notices = [line for line in done[name].stderr.splitlines() if line.startswith("notice")]
        assert notices == ([TORCH_ROLLOUT] if name == "beta" else []), notices
    expected = {
        "saturating": (
            1,
            "Agent.distribution scores",
            "as impossible",
            "clamp the action inside the support before scoring it, or keep what the draw inverts "
            + SECTION,
        ),
        "narrow": (
            1,
            "are not draws from Agent.distribution",
            "Agent.sample with Agent.sampling_noise",
            "a distribution family of its own needs its draw written there " + SECTION,
        ),
        "no_sample": (1, "its MultiCategorical has no `sample`: define `sample`", SECTION),
        "wrong_shape": (
            1,
            "error: Agent.sample drew actions of shape (1, 256, 2) for the update's 256 steps, where the rollout "
            "stored them as (256, 2): a draw is one action per row of the batch it is given, shaped as the "
            "distribution's own sample() " + SECTION,
        ),
        # raised inside common/ (by torch's base class): one line, the traceback in a file it names
        "no_log_prob": (
            1,
            "error: NotImplementedError in common/rollout_checks.py:",
            "(row_log_probs), raised by torch's Distribution.log_prob: no message; it ran run_no_log_prob.py's "
            "check_policy (line ",
            '(docs/ppo_fc.md, "When a check stops a run"); the traceback: ',
        ),
        "no_mode": (
            2,
            "Agent.distribution's MultiCategorical has none: define its `mode` property",
        ),
    }
    for name, (status, *parts) in expected.items():
        lines = done[name].stderr.strip().splitlines()
        assert done[name].returncode == status and len(lines) == 1, done[name].stderr[-3000:]
        assert lines[0].startswith("error: ") and all(part in lines[0] for part in parts), lines[0]
    saved = Path(done["no_log_prob"].stderr.strip().rsplit("the traceback: ", 1)[1])
    assert (
        "Traceback (most recent call last)" in saved.read_text()
        and "check_policy" in saved.read_text()
    )
    saved.unlink()

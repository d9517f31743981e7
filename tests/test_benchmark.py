"""The benchmark harness: the registry's baseline settings, job ids, the statistics and tables, and a tiny suite end
to end (results.json, figures, failures)."""

import json
import subprocess
import sys
import threading
import time
import typing
import warnings
from dataclasses import asdict, fields, replace
from pathlib import Path
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
import tyro
from helpers import assert_one_error_line, each_in_one_process
from scipy import stats
from tensorboard.backend.event_processing.event_accumulator import ScalarEvent

from benchmark import (
    answers_by_step,
    cases,
    ddpg_floor,
    ddpg_speed,
    recurrent_floor,
    report,
    run_report,
    tracking_cost,
)
from benchmark.baselines import build_sb3_model, make_sb3_envs
from benchmark.events import RunSummary, find_run_dirs, summarise_run
from benchmark.jobs import Job, Run, cases_to_run, make_jobs, portable, run_jobs
from benchmark.registry import (
    HARNESS_SET,
    REFERENCES,
    SCRIPTS,
    load_script,
    resolve_args,
    same_settings_flags,
    script_make_env,
)
from benchmark.report import (
    Row,
    SpeedNumbers,
    aggregates,
    git_revision,
    results_table,
    row_numbers,
    speed_numbers,
    speed_table,
)
from benchmark.run_report import against_reference, rows_of, seeds_text, speed_rows
from benchmark.statistics import iqm, iqm_interval, mean_std, median_steps_to_threshold
from common.envs import env_spaces, resolve_env_id
from common.seeding import available_cores
from common.trajectories import TrajectoryFileError

REPO = Path(__file__).resolve().parent.parent
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_case_table_lookup():
    full = cases.find_case("ppo_fc", "CartPole-v1")
    assert full.total_timesteps == 500_000 and full.threshold == 490.0
    assert cases.find_case("ppo_fc", "CartPole-v1", 100_000).threshold == 150.0
    shorter = cases.find_case("ppo_fc", "CartPole-v1", 30_000)
    # a threshold is for its own length
    assert shorter.total_timesteps == 30_000 and shorter.threshold is None
    unlisted = cases.find_case("ppo_fc", "Acrobot-v1")
    assert (
        unlisted.total_timesteps == cases.DEFAULT_TIMESTEPS
        and unlisted.threshold is None
        and not unlisted.flags
    )
    # Every case is judged (on a threshold or against a reference), or is a shorter run of a judged
    # case of its suite (the spread of more seeds at a smaller budget), or its suite is run beside
    # baselines of its own, or measures speed only (no evaluation).
    for name, suite in cases.SUITES.items():
        suite_cases = cases.suite_cases(name)
        judged_pairs = {
            (case.script, case.env_id, case.total_timesteps)
            for case in suite_cases
            if case.threshold is not None or case.reference is not None
        }
        judged = [
            any(
                (case.script, case.env_id) == (script, env_id) and case.total_timesteps <= steps
                for script, env_id, steps in judged_pairs
            )
            for case in suite_cases
        ]
        assert suite.seeds and (
            all(judged) or suite.baseline_seeds is not None or suite.eval_episodes == 0
        )
    assert [case.flags for case in cases.suite_cases("bptt")] == [
        (),
        ("--bptt-len", "32"),
        ("--bptt-len", "8"),
    ]
    # not a variant
    assert cases.find_case("ppo_lstm", "CartPoleNoVel-v1", 500_000) == cases.CARTPOLE_NOVEL_500K
    compared = [case for case in cases.CASES if case.compare_with is not None]
    for case in compared:  # another length keeps the comparison (a speed run can be shorter)
        assert cases.find_case(case.script, case.env_id, 1000).compare_with == case.compare_with


def test_a_compared_script_gets_every_setting_the_two_share():
    flags = (
        "--num-envs",
        "8",
        "--norm-obs",
        "--no-clip-vloss",
        "--target-kl",
        "0.02",
        "--rnn-hidden-size",
        "32",
    )
    derived = same_settings_flags("ppo_lstm", flags, "ppo_fc")
    lstm, fc = resolve_args("ppo_lstm", flags), resolve_args("ppo_fc", derived)
    shared = [
        field.name
        for field in fields(fc)
        if hasattr(lstm, field.name) and field.name not in HARNESS_SET
    ]
    assert "num_envs" in shared and "rnn_hidden_size" not in shared
    assert all(getattr(fc, name) == getattr(lstm, name) for name in shared)
    assert fc.num_envs == 8 and fc.norm_obs and not fc.clip_vloss and fc.target_kl == 0.02
    assert same_settings_flags("ppo_lstm", (), "ppo_lstm") == ()
    back = same_settings_flags("ppo_fc", ("--target-kl", "0.02"), "ppo_lstm")
    assert (
        resolve_args("ppo_lstm", back).target_kl == 0.02
        and resolve_args("ppo_fc", ()).target_kl is None
    )


# Flags that move every setting the baseline is given away from its default.
EVERY_SETTING_MOVED = {
    "ppo_fc": (
        "--num-envs", "2", "--num-steps", "64", "--num-minibatches", "2", "--update-epochs", "3",
        "--learning-rate", "1e-3", "--end-learning-rate", "1e-4", "--gamma", "0.95", "--gae-lambda", "0.9",
        "--clip-coef", "0.3", "--no-clip-vloss", "--no-norm-adv", "--ent-coef", "0.02", "--vf-coef", "0.7",
        "--max-grad-norm", "0.8", "--target-kl", "0.03", "--hidden-size", "32", "--norm-obs", "--norm-reward",
        "--norm-reward-clip", "5", "--torch-threads", "2",
    ),
    "ppo_lstm": (
        "--num-envs", "4", "--num-steps", "64", "--num-minibatches", "2", "--update-epochs", "3",
        "--learning-rate", "1e-3", "--end-learning-rate", "1e-4", "--gamma", "0.95", "--gae-lambda", "0.9",
        "--clip-coef", "0.3", "--clip-vloss", "--no-norm-adv", "--ent-coef", "0.02", "--vf-coef", "0.7",
        "--max-grad-norm", "0.8", "--target-kl", "0.03", "--no-norm-obs", "--norm-reward-clip", "5",
        "--torch-threads", "2", "--rnn-hidden-size", "32", "--rnn-layers", "2", "--shared-core",
    ),
    "ppo_transformer": (
        "--num-envs", "4", "--num-steps", "64", "--num-minibatches", "2", "--update-epochs", "3",
        "--learning-rate", "1e-3", "--end-learning-rate", "1e-4", "--gamma", "0.95", "--gae-lambda", "0.9",
        "--clip-coef", "0.3", "--clip-vloss", "--no-norm-adv", "--ent-coef", "0.02", "--vf-coef", "0.7",
        "--max-grad-norm", "0.8", "--target-kl", "0.03", "--no-norm-obs", "--norm-reward-clip", "5",
        "--torch-threads", "2",
    ),
    "ddpg": (
        "--num-envs", "2", "--learning-rate", "1e-3", "--anneal-lr", "--end-learning-rate", "1e-4",
        "--buffer-size", "5000", "--gamma", "0.95", "--tau", "0.01", "--batch-size", "64", "--noise", "ou",
        "--exploration-noise", "0.2", "--learning-starts", "100", "--updates-per-step", "2",
        "--policy-frequency", "3", "--hidden-size", "32", "--torch-threads", "2",
    ),
}  # fmt: skip
BASELINE_ENV = {
    "ppo_fc": "CartPole-v1",
    "ppo_lstm": "CartPole-v1",
    "ppo_transformer": "CartPole-v1",
    "ddpg": "Pendulum-v1",
}


INERT_WITHOUT = {"norm_reward_clip": "norm_reward"}
"""settings that have no effect unless another one is on"""


def ppo_read_back(model, envs, settings, args) -> dict:
    """The settings of a built SB3 PPO model, by the name of the script's `Args` field they stand for."""
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    widths = {
        name: [layer.out_features for layer in net if hasattr(layer, "out_features")]
        for name, net in (
            ("pi", model.policy.mlp_extractor.policy_net),
            ("vf", model.policy.mlp_extractor.value_net),
        )
    }
    assert widths["pi"] == widths["vf"] and len(set(widths["pi"])) <= 1
    normalizer = envs if isinstance(envs, VecNormalize) else None
    # a transformer's counterpart
    if hasattr(model.policy, "lstm_actor") and not hasattr(args, "rnn_hidden_size"):
        assert (
            widths["pi"] == []
            and model.policy.lstm_actor.hidden_size == 128
            and model.policy.lstm_critic
        )
        recurrent = {}
    # RecurrentPPO: linear heads on the LSTM, as the script's
    elif hasattr(model.policy, "lstm_actor"):
        assert widths["pi"] == []
        recurrent = {
            "rnn_hidden_size": model.policy.lstm_actor.hidden_size,
            "rnn_layers": model.policy.lstm_actor.num_layers,
            "shared_core": model.policy.shared_lstm and model.policy.lstm_critic is None,
        }
    else:
        assert len(widths["pi"]) == 2
        recurrent = {"hidden_size": widths["pi"][0]}
    return {
        **recurrent,
        "num_envs": model.n_envs,
        "async_envs": not isinstance(
            model.get_env().unwrapped if normalizer else model.get_env(), DummyVecEnv
        ),
        "num_steps": model.n_steps,
        "num_minibatches": model.n_envs * model.n_steps // model.batch_size,
        "update_epochs": model.n_epochs,
        "learning_rate": model.lr_schedule(1.0),
        "gamma": model.gamma,
        "gae_lambda": model.gae_lambda,
        "clip_coef": model.clip_range(1.0),
        "clip_vloss": model.clip_range_vf is not None,
        "norm_adv": model.normalize_advantage,
        "ent_coef": model.ent_coef,
        "vf_coef": model.vf_coef,
        "max_grad_norm": model.max_grad_norm,
        "target_kl": model.target_kl,
        "norm_obs": bool(normalizer and normalizer.norm_obs),
        "norm_reward": bool(normalizer and normalizer.norm_reward),
        "norm_reward_clip": normalizer.clip_reward
        if normalizer and normalizer.norm_reward
        else None,
        # the baseline process sets it before building the model
        "torch_threads": settings["torch_threads"],
    }


def td3_read_back(model, envs, settings) -> dict:
    """The settings of a built SB3 TD3 model (one critic, no target smoothing: DDPG with a delayed actor), by the name
    of the script's `Args` field they stand for."""
    from stable_baselines3.common.noise import OrnsteinUhlenbeckActionNoise
    from stable_baselines3.common.vec_env import DummyVecEnv

    assert len(model.critic.q_networks) == 1 and model.target_policy_noise == 0
    widths = [layer.out_features for layer in model.actor.mu if hasattr(layer, "out_features")]
    assert len(widths) == 3 and widths[0] == widths[1]
    noise = model.action_noise
    noise = noise.noises[0] if hasattr(noise, "noises") else noise
    return {
        "hidden_size": widths[0],
        "num_envs": model.n_envs,
        "async_envs": not isinstance(model.get_env(), DummyVecEnv),
        "learning_rate": model.lr_schedule(1.0),
        "buffer_size": model.buffer_size,
        "learning_starts": model.learning_starts,
        "batch_size": model.batch_size,
        "tau": model.tau,
        "gamma": model.gamma,
        "updates_per_step": model.gradient_steps // model.n_envs,
        "policy_frequency": model.policy_delay,
        # added to the action scaled to [-1, 1]: in half-ranges
        "exploration_noise": float(np.mean(noise._sigma)),
        "noise": "ou" if isinstance(noise, OrnsteinUhlenbeckActionNoise) else "gaussian",
        # the baseline process sets it before building the model
        "torch_threads": settings["torch_threads"],
    }


@pytest.mark.parametrize("script_name", sorted(SCRIPTS))
def test_every_setting_of_a_script_reaches_its_baseline_or_has_a_stated_reason(script_name):
    import torch

    script = SCRIPTS[script_name]
    flag_sets = [
        (),
        # off, where a script normalises
        *([("--no-norm-obs", "--no-norm-reward")] if script_name != "ddpg" else []),
        EVERY_SETTING_MOVED[script_name],
        *{
            case.flags
            for name in cases.SUITES
            for case in cases.suite_cases(name)
            if case.script == script_name
        },
        *(case.flags for case in cases.CASES if case.script == script_name),
    ]
    for flags in flag_sets:
        args = resolve_args(script_name, flags)
        # as the baseline's process receives them
        settings = json.loads(json.dumps(script.sb3_settings(args)))
        envs = make_sb3_envs(BASELINE_ENV[script_name], settings, seed=1)
        model = build_sb3_model(script.sb3_algo, settings, envs, seed=1)
        read_back = (
            td3_read_back(model, envs, settings)
            if script.sb3_algo == "td3"
            else ppo_read_back(model, envs, settings, args)
        )
        for name, value in read_back.items():
            if value is None and name in INERT_WITHOUT and not getattr(args, INERT_WITHOUT[name]):
                continue  # a setting that does nothing without another one
            assert value == pytest.approx(getattr(args, name)), (flags, name)
        if getattr(args, "clip_vloss", False):
            assert model.clip_range_vf(1.0) == pytest.approx(args.clip_coef)
        end = args.end_learning_rate if args.anneal_lr else args.learning_rate
        # SB3's progress_remaining is 0 at the end
        assert model.lr_schedule(0.0) == pytest.approx(end)
        activation = torch.nn.ReLU if script.sb3_algo == "td3" else torch.nn.Tanh
        assert model.policy.activation_fn is activation
        envs.close()
        unaccounted = {item.name for item in fields(args)} - set(read_back) - set(script.unmatched)
        assert not unaccounted, (
            f"fields of {script_name}.Args neither given to the baseline nor explained"
        )
    assert not set(read_back) & set(script.unmatched)


def test_every_job_has_its_own_id_and_shared_baselines_run_once(tmp_path):
    table = (
        cases.Case("ppo_fc", "CartPole-v1", 1024),
        cases.Case("ppo_fc", "CartPole-v1", 2048),
        cases.Case("ppo_fc", "CartPole-v1", 1024, flags=("--num-envs", "2")),
        # the same baseline settings
        cases.Case("ppo_fc", "CartPole-v1", 1024, flags=("--no-numpy-rollout",)),
    )
    args = Run(baselines=True, seeds=(1, 2))
    jobs, plans = make_jobs(args, list(table), (1, 2), tmp_path)
    ids = [job.id for job in jobs]
    assert len(ids) == len(set(ids))
    assert len({job.run_dir for job in jobs}) == len(jobs)
    script_groups = [plan.case.key for plan in plans]
    assert len(set(script_groups)) == 4  # steps and flags tell cases apart
    baselines = [plan.baseline_group for plan in plans]
    assert baselines[0] != baselines[1] != baselines[2] and baselines[3] == baselines[0]
    assert sum(job.kind == "sb3" for job in jobs) == 3 * 2  # the shared one once per seed
    raw = [plan.raw_env_job for plan in plans]
    # 4 envs and 2 envs are measured apart; steps do not matter
    assert raw[0] == raw[1] and raw[2] != raw[0]
    rows = rows_of(jobs, plans)
    assert len(rows) == 4 + 3 and len({row.key for row in rows}) == len(rows)


def test_a_suite_s_baseline_seeds_are_its_own_unless_seeds_are_given(tmp_path):
    suite = cases.SUITES["ddpg-mujoco"]
    for given, baseline_seeds in ((None, suite.baseline_seeds), ((3,), (3,))):
        args = Run(suite="ddpg-mujoco", baselines=True, seeds=given)
        jobs, _ = make_jobs(args, cases.suite_cases("ddpg-mujoco"), given or suite.seeds, tmp_path)
        for env_id in ("HalfCheetah-v5", "Hopper-v5"):
            assert (
                tuple(job.seed for job in jobs if job.kind == "sb3" and job.env_id == env_id)
                == baseline_seeds
            )
            assert tuple(
                job.seed for job in jobs if job.kind == "script" and job.env_id == env_id
            ) == (given or suite.seeds)


def test_a_case_s_window_reaches_its_jobs_and_is_marked_in_the_table(tmp_path):
    case = cases.Case("ddpg", "Pendulum-v1", 1000, threshold=-200.0, window=10)
    jobs, _ = make_jobs(Run(), [case], (1,), tmp_path)
    assert [job.window for job in jobs] == [10]
    summary = RunSummary("r", "ddpg", "Pendulum-v1", 1, steps=1000, window=10)
    summary.episode_returns, summary.episode_steps = (
        np.array([-300.0] * 5 + [-100.0] * 10),
        np.arange(200, 3200, 200),
    )
    summary.episode_seconds = summary.episode_steps / 100.0
    row = Row("ddpg", "Pendulum-v1", case.key, 1000, threshold=-200.0, judged=True, runs=[summary])
    numbers = row_numbers(row)
    assert numbers.last_return_mean == -100.0 and numbers.verdict == "PASS"
    assert "| -100.0 (last 10) |" in "".join(results_table([numbers]))


def test_a_compared_script_runs_with_the_same_settings_and_its_ratio_is_shown(tmp_path):
    case = cases.Case(
        "ppo_lstm", "CartPole-v1", 1024, flags=("--num-envs", "2"), compare_with="ppo_fc"
    )
    jobs, [plan] = make_jobs(Run(), [case], (1, 2), tmp_path)
    assert [job.label for job in jobs] == ["ppo_lstm"] * 2 + ["ppo_fc"] * 2
    fc_command = jobs[2].command
    assert (
        fc_command[1].endswith("ppo_fc.py")
        and fc_command[fc_command.index("--num-envs") + 1] == "2"
    )
    assert plan.reference.flags == same_settings_flags("ppo_lstm", case.flags, "ppo_fc")
    # before --run-dir
    assert fc_command[-len(plan.reference.flags) - 2 : -2] == list(plan.reference.flags)
    assert plan.reference.key != case.key
    for job, sps in zip(jobs, (600.0, 800.0, 1000.0, 1000.0), strict=True):
        job.summary = summary(job.seed, [1.0], sps)
    rows = rows_of(jobs, plans=[plan])
    assert [(row.label, row.judged) for row in rows] == [("ppo_lstm", True), ("ppo_fc", False)]
    numbers = {row.key: row_numbers(row) for row in rows}
    [speed] = speed_rows(jobs, [plan], numbers)
    assert speed.reference == "ppo_fc" and speed.script_over_reference == pytest.approx(0.7)
    assert speed.baseline is None and speed.script_over_baseline is None
    # Runs taken from a --reuse-runs store ran in another session: no ratio with them on either side.
    for stored_label in ("ppo_fc", "ppo_lstm"):
        for job in jobs:
            job.stored = (
                {"date": "2026-11-26T00:00:00+00:00", "git": "0000000"}
                if job.label == stored_label
                else None
            )
        assert speed_rows(jobs, [plan], numbers) == [], stored_label


def test_a_case_under_torchrun_starts_its_processes_and_has_a_key_of_its_own(tmp_path):
    one = cases.Case("ppo_fc", "CartPole-v1", 1024)
    two = replace(one, nproc=2)
    # as before nproc: stored runs and tables name it
    assert one.key == "ppo_fc__CartPole-v1__1024__4f53cda1"
    assert (
        two.key == one.key + "__np2" and "2 processes" in two.name and "processes" not in one.name
    )
    jobs, plans = make_jobs(Run(baselines=True), [one, two], (1,), tmp_path)
    [plain, torchrun] = [job for job in jobs if job.kind == "script"]
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    assert (
        torchrun.command[: 1 + len(launcher)] == [sys.executable, *launcher] and torchrun.nproc == 2
    )
    assert plain.command[1] == str(REPO / "ppo_fc.py") and plain.nproc == 1
    assert portable(torchrun.command)[len(launcher) :] == portable(plain.command)  # the same flags
    others = [job for job in jobs if job.kind != "script"]
    # shared by both cases
    assert {job.kind for job in others} == {"sb3", "raw-env"} and len(others) == 2
    assert all(
        job.nproc == 1 and job.command[1:3] == ["-m", "benchmark.baselines"] for job in others
    )
    for job in jobs:
        job.summary = summary(job.seed, [1.0], 100.0)
    rows = rows_of(jobs, plans)
    assert [(row.label, row.nproc) for row in rows] == [
        ("ppo_fc", 1),
        ("sb3_ppo", 1),
        ("ppo_fc", 2),
    ]
    assert [case.nproc for case in cases_to_run(Run(nproc=3))[0]] == [3]


def test_the_distributed_suites_run_ppo_fc_in_one_and_two_processes_with_the_same_per_rank_or_global_batch():
    num_envs = resolve_args("ppo_fc", ()).num_envs
    expected = {
        "distributed": [("CartPole-v1", 500_000)],
        "distributed-speed": [("CartPole-v1", 100_000), ("Hopper-v5", 100_000)],
    }
    for name, tasks in expected.items():
        suite_cases = cases.suite_cases(name)
        assert [(case.env_id, case.total_timesteps) for case in suite_cases] == [
            task for task in tasks for _ in "123"
        ]
        assert [case.nproc for case in suite_cases] == [1, 2, 2] * len(tasks)
        assert len({case.key for case in suite_cases}) == len(suite_cases)
        for one, same_per_rank, same_global in zip(*[iter(suite_cases)] * 3, strict=True):
            # the row itself, its key too
            assert one == cases.find_case("ppo_fc", one.env_id, one.total_timesteps)
            assert same_per_rank.flags == one.flags and same_per_rank.threshold == one.threshold
            assert (
                same_global.nproc * resolve_args("ppo_fc", same_global.flags).num_envs == num_envs
            )
    # a verdict for 2 processes too
    assert {case.threshold for case in cases.suite_cases("distributed")} == {490.0}
    assert (
        cases.SUITES["distributed-speed"].seeds == (1,)
        and cases.SUITES["distributed-speed"].eval_episodes == 0
    )


def test_workers_bound_the_processes_at_a_time_a_torchrun_job_counting_as_its_processes(
    tmp_path, monkeypatch
):
    lock, running, started, peaks, shares = threading.Lock(), [], [], [], set()

    def run_job(job, logs, threads, runs=None):  # stands in for the process: who runs beside whom
        with lock:
            shares.add(threads)
            running.append(job)
            started.append(job.id)
            peaks.append((len(running), sum(other.nproc for other in running)))
        time.sleep(0.1)
        with lock:
            running.remove(job)
        job.output = {"sps": 1.0}
        return job

    monkeypatch.setattr("benchmark.jobs.run_job", run_job)
    for workers in (1, 2, 3):
        jobs = []
        for number, nproc in enumerate((1, 2, 1, 1, 2, 1)):
            job = Job("raw-env", f"job{number}", "g", "l", "E", 1, [], tmp_path)
            job.nproc = nproc
            jobs.append(job)
        started.clear()
        peaks.clear()
        shares.clear()
        scheduler = threading.Thread(target=run_jobs, args=(jobs, workers, tmp_path), daemon=True)
        scheduler.start()
        scheduler.join(timeout=10)
        assert not scheduler.is_alive(), (
            f"a job of 2 processes never started with --workers {workers}"
        )
        assert started == [job.id for job in jobs]  # in their order
        # threads: the cores, shared, never more
        assert shares == {max(1, available_cores() // workers)}
        if workers == 1:  # a job of 2 processes runs alone, and so does every other
            assert max(count for count, _ in peaks) == 1
        else:
            # never more, and the workers are used
            assert max(processes for _, processes in peaks) == workers


def summary(seed, last_returns, sps=None, episode_steps=None, rss=None) -> RunSummary:
    returns = np.asarray(last_returns, dtype=float)
    steps = (
        np.arange(1, len(returns) + 1) * 10 if episode_steps is None else np.asarray(episode_steps)
    )
    return RunSummary(
        run_dir=f"run{seed}", script="ppo_fc", env_id="CartPole-v1", seed=seed, steps=int(steps[-1]),
        episode_steps=steps, episode_seconds=steps / 100.0, episode_returns=returns, sps=sps, peak_rss_mb=rss,
    )  # fmt: skip


def test_one_seed_shows_no_spread_and_no_iqm():
    row = Row(
        "ppo_fc",
        "CartPole-v1",
        "key",
        1000,
        threshold=5.0,
        judged=True,
        runs=[summary(1, [7.0] * 120, 900.0)],
    )
    numbers = row_numbers(row)
    assert (
        numbers.last_return_mean == 7.0
        and numbers.last_return_std is None
        and numbers.last_return_iqm is None
    )
    line = results_table([numbers])[-1]
    assert "| 7.0 |" in line and "±" not in line and "| PASS |" in line


def test_spread_iqm_and_median_steps_across_seeds():
    # Seeds reach the threshold 100 at episode 100 (steps 1,000), 150 and never; two more reach it at once.
    runs = [
        summary(1, [100.0] * 200),
        summary(2, [0.0] * 50 + [100.0] * 150),
        summary(3, [50.0] * 200),
        summary(4, [200.0] * 200),
        summary(5, [300.0] * 200),
    ]
    numbers = row_numbers(
        Row("ppo_fc", "CartPole-v1", "key", 2000, threshold=100.0, judged=True, runs=runs)
    )
    finals = [100.0, 100.0, 50.0, 200.0, 300.0]
    assert numbers.last_return_std == pytest.approx(np.std(finals, ddof=1))
    # mean of 100, 100, 200
    assert numbers.last_return_iqm == pytest.approx(stats.trim_mean(finals, 0.25))
    assert numbers.last_return_iqm_low <= numbers.last_return_iqm <= numbers.last_return_iqm_high
    assert numbers.steps_to_threshold == [1000, 1500, None, 1000, 1000]
    # seed 3 ends at 50
    assert numbers.median_steps_to_threshold == 1000 and numbers.verdict == "FAIL"
    # the summaries' 100 steps a second
    assert numbers.seconds_to_threshold == [10.0, 15.0, None, 10.0, 10.0]
    assert "| 1,000 in 10 s (4 of 5 seeds reached ≥ 100) |" in results_table([numbers])[-1]
    # the median seed never reached it
    assert median_steps_to_threshold([1000, None, None]) == float("inf")
    beyond = row_numbers(
        Row("ppo_fc", "CartPole-v1", "key", 2000, threshold=1e9, judged=True, runs=runs)
    )
    assert beyond.median_beyond_budget and beyond.median_steps_to_threshold is None
    assert "> 2,000 (0 of 5 seeds reached" in results_table([beyond])[-1]


def test_an_eval_threshold_judges_the_deterministic_evaluation():
    runs = [summary(1, [10.0] * 120), summary(2, [10.0] * 120)]
    runs[0].eval_returns, runs[1].eval_returns = [500.0, 480.0], [470.0, 470.0]
    row = Row(
        "ppo_lstm", "E", "key", 1200, threshold=475.0, judged=True, judged_on="eval", runs=runs
    )
    numbers = row_numbers(row)
    assert numbers.verdict == "FAIL" and numbers.steps_to_threshold == []  # seed 2 evaluates at 470
    runs[1].eval_returns = [480.0]
    assert row_numbers(row).verdict == "PASS"  # a training return of 10 does not matter
    assert "judged on the eval return ≥ 475" in results_table([row_numbers(row)])[-1]
    assert aggregates([row]) == []  # the aggregate is of training returns against their thresholds


def test_a_published_figure_judges_the_mean_training_return_over_seeds_against_its_mean_less_its_std():
    published = cases.CleanRLPublished("ppo_continuous_action.py", "Hopper-v4", 2000.0, 300.0, 25.0)
    # seeds end at 1,600 and 1,900: mean 1,750, within the std (bound 1,700), though one seed is under it
    runs = [summary(1, [1600.0] * 120), summary(2, [1900.0] * 120)]
    runs[0].wall_seconds, runs[1].wall_seconds = 600.0, 900.0
    row = Row("ppo_fc", "Hopper-v5", "key", 1200, threshold=published.bound, judged=True, judged_on="published",
              runs=runs)  # fmt: skip
    numbers = row_numbers(row)
    assert numbers.verdict == "PASS" and numbers.wall_minutes_mean == pytest.approx(12.5)
    line = report.against_published(numbers, published)
    assert line.standing == "within its std" and line.published_minutes == 25.0
    table = "\n".join(report.against_published_table([line]))
    assert (
        "| 2,000.00 ± 300.00 (CleanRL's ppo_continuous_action.py on Hopper-v4 (pr-424)) |" in table
    )
    assert "| 12.5 / 25.0 |" in table and "| within its std |" in table
    runs[1].episode_returns[:] = 2500.0
    assert report.against_published(row_numbers(row), published).standing == "above its mean"
    runs[1].episode_returns[:] = 1700.0
    numbers = row_numbers(row)
    assert (
        numbers.verdict == "FAIL"
        and report.against_published(numbers, published).standing == "short by 50.0"
    )


def test_the_mujoco_suite_holds_cleanrls_published_table_on_v5_with_the_readmes_continuous_flags():
    suite_cases = cases.suite_cases("mujoco")
    ppo = [case for case in suite_cases if case.script == "ppo_fc"]
    assert [case.reference.env_id for case in ppo] == list(cases.CLEANRL_PPO_CONTINUOUS)
    assert {case.env_id for case in ppo} >= {
        "HalfCheetah-v5",
        "Humanoid-v5",
        "dm_control/ball_in_cup-catch-v0",
    }
    readme = (REPO / "README.md").read_text()
    assert " ".join(cases.PPO_CONTINUOUS_FLAGS) in " ".join(readme.replace("\\\n", " ").split())
    for case in ppo:
        assert (
            case.total_timesteps == 1_000_000
            and case.seeds == (1, 2, 3)
            and case.judged_on == "published"
        )
        mean, std, minutes = cases.CLEANRL_PPO_CONTINUOUS[case.reference.env_id]
        assert (case.reference.mean, case.reference.std, case.reference.minutes) == (
            mean,
            std,
            minutes,
        )
    ddpg = {
        (case.env_id, case.total_timesteps): case.seeds
        for case in suite_cases
        if case.script == "ddpg"
    }
    at_1m = {"HalfCheetah-v5", "Hopper-v5", "Walker2d-v5", "InvertedPendulum-v5"}
    assert ddpg == {**{(env_id, 1_000_000): (1, 2, 3) if env_id == "HalfCheetah-v5" else (1,) for env_id in at_1m},
                    **{(env_id, 300_000): (1, 2, 3) for env_id in ("HalfCheetah-v5", "Hopper-v5")}}  # fmt: skip
    jobs, _ = make_jobs(Run(suite="mujoco"), suite_cases, (1,), Path("out"))
    assert len(jobs) == 9 * 3 + 4 + 2 + 2 * 3
    assert len(make_jobs(Run(suite="mujoco", seeds=(7,)), suite_cases, (7,), Path("out"))[0]) == 15


def test_a_reached_threshold_judges_every_seed_within_the_budget():
    # Seed 1 averages 100 over episodes 100-199, then ends at 50; seed 2 ends at 100.
    runs = [summary(1, [100.0] * 200 + [0.0] * 100), summary(2, [100.0] * 150)]
    row = Row(
        "ppo_lstm", "E", "key", 3000, threshold=100.0, judged=True, judged_on="reached", runs=runs
    )
    numbers = row_numbers(row)
    assert numbers.steps_to_threshold == [1000, 1000] and numbers.verdict == "PASS"
    assert numbers.last_return_mean == pytest.approx(50.0)  # the end is shown as it is
    assert row_numbers(Row(**{**vars(row), "judged_on": "training"})).verdict == "FAIL"
    runs.append(summary(3, [99.0] * 300))
    assert row_numbers(row).verdict == "FAIL"  # seed 3 never reached it


def test_iqm_and_its_interval_follow_the_definitions():
    values = [1.0, 2.0, 3.0, 4.0, 100.0, 5.0, 6.0, 7.0]
    assert iqm(values) == pytest.approx(np.mean(sorted(values)[2:6]))
    low, high = iqm_interval([values])
    assert low < iqm(values) < high and high < 100
    # Stratified: a task whose runs all agree adds no uncertainty; resampling across tasks would.
    tight = iqm_interval([[1.0] * 6, [3.0] * 6])
    assert tight == (2.0, 2.0)
    assert mean_std([]) == (None, None) and mean_std([2.0, 4.0]) == (3.0, pytest.approx(np.sqrt(2)))


def test_speed_ratios_divide_by_the_raw_env_and_the_baseline():
    ours = row_numbers(
        Row("ppo_fc", "E", "a", 100, runs=[summary(1, [1.0], 1000.0), summary(2, [1.0], 3000.0)])
    )
    baseline = row_numbers(Row("sb3_ppo", "E", "b", 100, runs=[summary(1, [1.0], 500.0)]))
    speed = speed_numbers(ours, 8000.0, baseline)
    assert (
        speed.sps == 2000.0
        and speed.script_over_raw_env == 0.25
        and speed.script_over_baseline == 4.0
    )
    unknown = speed_numbers(ours, None, None)
    assert unknown.script_over_raw_env is None and unknown.script_over_baseline is None


def column(table: list[str], name: str) -> list[str]:
    """The cells of a Markdown table's column `name`, row by row."""
    cells = [[cell.strip() for cell in line.split("|")[1:-1]] for line in table]
    at = cells[0].index(name)
    return [row[at] for row in cells[2:]]


def test_the_tables_and_results_json_show_each_row_s_processes():
    ours = row_numbers(Row("ppo_fc", "E", "a", 100, nproc=2, runs=[summary(1, [1.0], 2000.0)]))
    baseline = row_numbers(Row("sb3_ppo", "E", "b", 100, runs=[summary(1, [1.0], 500.0)]))
    assert column(results_table([ours, baseline]), "processes") == ["2", "1"]
    assert column(speed_table([speed_numbers(ours, None, baseline)]), "processes") == ["2"]
    assert asdict(ours)["nproc"] == 2 and asdict(speed_numbers(ours, None, baseline))["nproc"] == 2


def test_a_two_process_case_runs_under_torchrun_end_to_end(tmp_path, monkeypatch):
    # Probe1 pays 1 per episode; 2 processes of 4 envs and 128 steps: 1,024 steps an iteration, 3 iterations.
    case = cases.Case("ppo_fc", "Probe1-v0", 3072, threshold=0.5, nproc=2)
    monkeypatch.setitem(cases.SUITES, "distributed", cases.Suite((case,), (1,), eval_episodes=0))
    # 1 worker: it runs alone
    assert run_report.run(Run(suite="distributed", out=str(tmp_path / "out"))) == 0
    record = json.loads((tmp_path / "out" / "results.json").read_text())
    [row] = record["rows"]
    assert row["nproc"] == 2 and row["key"] == case.key and row["verdict"] == "PASS"
    assert row["steps"] == 3072 and row["sps_mean"] > 0  # the steps of both processes
    [job] = record["jobs"]
    assert job["nproc"] == 2 and "torch.distributed.run" in job["command"]
    table = (tmp_path / "out" / "results.md").read_text().splitlines()
    start = table.index("## Results") + 2
    assert column(table[start : start + 3], "processes") == ["2"]


def test_tiny_suite_results_json_figures_and_failures(tmp_path, monkeypatch, capsys):
    # Probe1 pays 1 per episode: a threshold of 0.5 passes, 2.0 cannot; 7 minibatches do not divide 512: a crash.
    table = (
        cases.Case("ppo_fc", "Probe1-v0", 1024, threshold=0.5),
        cases.Case("ppo_fc", "Probe2-v0", 1024, threshold=2.0),
        cases.Case("ppo_fc", "Probe3-v0", 1024, threshold=0.0, flags=("--num-minibatches", "7")),
    )
    monkeypatch.setattr(cases, "CASES", table)
    args = Run(
        envs=("Probe1-v0", "Probe2-v0", "Probe3-v0"),
        seeds=(1, 2),
        total_timesteps=1024,
        eval_episodes=2,
        baselines=True,
        workers=2,
        out=str(tmp_path / "out"),
    )
    assert run_report.run(args) == 1
    printed = capsys.readouterr().out
    # a line per finished run of the script
    assert printed.count(" (ppo_fc): ") == 6 and "FAILED" in printed
    record = json.loads((tmp_path / "out" / "results.json").read_text())
    rows = {(row["label"], row["env_id"]): row for row in record["rows"]}
    probe1, probe2, probe3 = (rows["ppo_fc", f"Probe{i}-v0"] for i in (1, 2, 3))
    assert (
        probe1["seeds"] == [1, 2]
        and probe1["last_return_mean"] == 1.0
        and probe1["last_return_std"] == 0.0
    )
    assert probe1["verdict"] == "PASS" and probe1["threshold"] == 0.5
    assert (
        probe1["steps_to_threshold"][0] is not None
        and probe1["median_steps_to_threshold"] is not None
    )
    assert (
        probe2["verdict"] == "FAIL"
        and probe2["median_beyond_budget"]
        and probe2["steps_to_threshold"] == [None] * 2
    )
    assert probe3["failed_seeds"] == [1, 2] and probe3["verdict"] == "FAIL"
    baseline = rows["sb3_ppo", "Probe1-v0"]
    assert baseline["seeds"] == [1, 2] and baseline["verdict"] == "-" and baseline["sps_mean"] > 0
    [speed] = [row for row in record["speed"] if row["env_id"] == "Probe1-v0"]
    assert speed["raw_env_sps"] > 0 and speed["script_over_raw_env"] == pytest.approx(
        probe1["sps_mean"] / speed["raw_env_sps"]
    )
    assert speed["script_over_baseline"] == pytest.approx(probe1["sps_mean"] / baseline["sps_mean"])
    assert sum(job["error"] is not None for job in record["jobs"]) == 2
    assert len({job["id"] for job in record["jobs"]}) == len(record["jobs"])
    results = (tmp_path / "out" / "results.md").read_text()
    # the crash's own message, under Failures
    assert "error: --num-minibatches 7 must divide" in results
    # the table shows what results.json holds
    assert f"{speed['script_over_raw_env']:,.2f}" in results
    for name in (
        "sps.png",
        "return_vs_steps_Probe1-v0.png",
        "return_vs_time_Probe2-v0.png",
        "aggregate_iqm.png",
    ):
        figure = tmp_path / "out" / name
        assert figure.read_bytes()[:8] == PNG_MAGIC and f"]({name})" in results

    # The same figures for runs made outside the harness.
    plot = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmark",
            "plot",
            str(tmp_path / "out" / "runs"),
            "--out",
            str(tmp_path / "plots"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert plot.returncode == 0, plot.stderr
    plotted = (tmp_path / "plots" / "results.md").read_text()
    assert "| ppo_fc | Probe1-v0 |" in plotted and "| sb3_ppo | Probe2-v0 |" in plotted
    assert (tmp_path / "plots" / "return_vs_steps_Probe2-v0.png").read_bytes()[:8] == PNG_MAGIC


BAD_INPUT = [
    (["run", "--scripts", "no_such_script"], "no script no_such_script.py"),
    (["run", "--seeds", "1", "1"], "distinct"),
    (
        ["run", "--suite", "quick", "--envs", "Acrobot-v1"],
        "--suite quick sets the scripts, envs, steps and",
    ),
    (["run", "--suite", "full", "--total-timesteps", "1000"], "drop --total-timesteps"),
    (["run", "--suite", "distributed", "--nproc", "2"], "drop --nproc"),
    (["run", "--nproc", "0"], "--nproc must be at least 1"),
    (["run", "--script-flags", "ppo_fc"], "write SCRIPT=FLAGS"),
    (
        ["run", "--script-flags", "ppo_lstm=--no-norm-adv"],
        "no case of this benchmark runs ppo_lstm",
    ),
    (["run", "--script-flags", "ppo_fc=--no-such-flag"], "the flags of case"),
    (["plot", "/nonexistent-folder"], "no TensorBoard event files"),
    (
        ["run", "--scripts", "ppo_fc", "--envs", "CartPole-v1", "--stored-only"],
        "--stored-only: none of the benchmark's runs is stored in",
    ),
]


@pytest.fixture(scope="module")
def refused(tmp_path_factory):
    argvs = [argv for argv, _ in BAD_INPUT]
    return each_in_one_process(["-m", "benchmark"], argvs, tmp_path_factory.mktemp("bad"), "--out")


@pytest.mark.parametrize("argv, message", BAD_INPUT)
def test_bad_input_is_one_error_line(refused, argv, message):
    process, out = refused[tuple(argv)]
    assert_one_error_line(process, message)
    assert not out.exists()


def test_every_suite_can_be_named_on_the_command_line():
    named, _ = typing.get_args(typing.get_type_hints(Run)["suite"])  # Literal[...] | None
    assert set(typing.get_args(named)) == set(cases.SUITES)


def test_script_flags_reach_every_case_of_their_script_and_the_cases_others_are_judged_against():
    suite = cases.suite_cases("popgym-easy")
    added = cases_to_run(Run(suite="popgym-easy", script_flags=("ppo_lstm=--learning-rate 5e-4",)))[
        0
    ]
    assert len(added) == len(suite)
    for before, after in zip(suite, added, strict=True):
        if before.script == "ppo_lstm":
            assert after.flags == (*before.flags, "--learning-rate", "5e-4")
        else:  # the transformer's flags stay; the ppo_lstm case it is judged against, run beside it, has them
            assert after.flags == before.flags and after.reference.case in added
            assert after.reference.case.flags[-2:] == ("--learning-rate", "5e-4")
    both = ("ppo_transformer=--learning-rate 1e-3", "ppo_transformer=--n-layers 3")
    (case,) = cases_to_run(Run(scripts=("ppo_transformer",), script_flags=both))[0]
    assert case.flags == ("--learning-rate", "1e-3", "--n-layers", "3")
    # On the command line, given twice it adds up (a second --script-flags once replaced the first, silently).
    command = ["--scripts", "ppo_transformer", "--script-flags", both[0], "--script-flags", both[1]]
    (case,) = cases_to_run(tyro.cli(Run, args=command))[0]
    assert case.flags == ("--learning-rate", "1e-3", "--n-layers", "3")


def test_a_suite_honours_seeds():
    assert cases_to_run(Run(suite="quick", seeds=(7, 8, 9)))[1] == (7, 8, 9)
    assert cases_to_run(Run(suite="quick"))[1] == cases.SUITES["quick"][1]


def test_the_header_gives_the_seeds_each_case_runs():
    # the mujoco suite's cases set their own seeds: its results once said "seeds 1", the suite's default
    args = Run(suite="mujoco")
    suite_cases, seeds = cases_to_run(args)
    assert (
        seeds_text(args, suite_cases, seeds)
        == "as each case sets them: 1 2 3 for 12 cases; 1 for 3 cases"
    )
    args = Run(suite="mujoco", seeds=(4, 5))
    assert seeds_text(args, *cases_to_run(args)) == "4 5"


@pytest.mark.parametrize(
    "algo, env_id, settings",
    [
        ("recurrent_ppo", "Probe1-v0", SCRIPTS["ppo_fc"].sb3_settings(resolve_args("ppo_fc", ["--num-steps", "64"]))),
        (
            "ddpg",
            "ContinuousProbe1-v0",
            {
                "num_envs": 1, "torch_threads": 1, "learning_rate": 1e-3, "end_learning_rate": 1e-3,
                "hidden_sizes": [32, 32], "activation": "relu", "exploration_noise": 0.1,
                "model": {"learning_starts": 64, "batch_size": 32, "gamma": 0.99, "tau": 0.005},
            },
        ),
    ],
)  # fmt: skip
def test_sb3_baselines_write_runs_the_reader_understands(algo, env_id, settings, tmp_path):
    command = [
        sys.executable,
        "-m",
        "benchmark.baselines",
        "sb3",
        "--algo",
        algo,
        "--env-id",
        env_id,
    ]
    command += ["--total-timesteps", "1024", "--eval-episodes", "3", "--run-dir", str(tmp_path)]
    command += ["--settings", json.dumps(settings)]
    process = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    assert process.returncode == 0, process.stderr
    printed = json.loads(process.stdout.strip().splitlines()[-1])
    [run_dir] = find_run_dirs([tmp_path])
    assert Path(printed["run_dir"]).resolve() == run_dir
    run = summarise_run(run_dir)
    assert (run.script, run.env_id, run.seed) == (f"sb3_{algo}", env_id, 1)
    # one-step episodes paying 1, each logged: about one per env step
    assert len(run.episode_returns) >= 1000 and set(run.episode_returns.tolist()) == {1.0}
    assert (
        run.sps is not None and run.peak_rss_mb is not None and run.eval_returns == [1.0, 1.0, 1.0]
    )


@pytest.mark.parametrize("script_name", ["ppo_fc", "ppo_lstm", "ppo_transformer"])
def test_an_atari_baseline_gets_sb3_s_atari_stack_with_the_script_s_frames_and_its_nature_cnn(
    script_name,
):
    pytest.importorskip("ale_py")
    args = resolve_args(script_name, ["--env-id", "BreakoutNoFrameskip-v4", "--num-envs", "2"])
    settings = json.loads(json.dumps(SCRIPTS[script_name].sb3_settings(args)))
    script_envs = SCRIPTS[script_name].vector_env(load_script(script_name), args)
    space = script_envs.single_observation_space
    script_envs.close()
    # the transformer's: image and vector
    image = space["image"] if isinstance(space, gym.spaces.Dict) else space
    frames = image.shape[0] if len(image.shape) == 3 else 1
    assert settings["atari_frame_stack"] == frames and settings["hidden_sizes"] == []
    envs = make_sb3_envs("BreakoutNoFrameskip-v4", settings, seed=1)
    model = build_sb3_model(SCRIPTS[script_name].sb3_algo, settings, envs, seed=1)
    assert type(model.policy.features_extractor).__name__ == "NatureCNN"
    assert model.observation_space.shape == (frames, 84, 84)  # SB3 puts the channels first
    envs.close()


def test_raw_env_steps_the_scripts_own_env_stack():
    command = [
        sys.executable,
        "-m",
        "benchmark.baselines",
        "raw-env",
        "--script",
        "ppo_fc",
        "--env-id",
        "Probe1-v0",
    ]
    command += [
        "--flags",
        json.dumps(["--num-envs", "3", "--norm-reward"]),
        "--steps",
        "3000",
        "--repeats",
        "1",
    ]
    process = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    assert process.returncode == 0, process.stderr
    printed = json.loads(process.stdout.strip().splitlines()[-1])
    assert printed["num_envs"] == 3 and printed["steps"] == 3000 and printed["sps"] > 0


def test_recurrent_floor_times_the_scripts_own_agent_over_an_iterations_minibatches(monkeypatch):
    calls = []
    script = recurrent_floor.load_script("ppo_lstm")
    forward = script.Core.forward
    monkeypatch.setattr(
        script.Core,
        "forward",
        lambda self, x, *rest: calls.append(tuple(x.shape)) or forward(self, x, *rest),
    )
    seconds, steps = recurrent_floor.cell_floor_seconds(
        ["--num-envs", "4", "--bptt-len", "32", "--num-minibatches", "4", "--no-shared-core"], 1
    )
    assert steps == 4 * 128 and seconds > 0
    # Both cores: chunks of 32 steps, 16 chunks in 4 minibatches, CartPole's 4 observations (the input of the encoders).
    assert calls == [(32, 4, 4)] * 2 * (1 + 5)


def test_transformer_floor_times_the_scripts_own_agent_over_whole_sequences(monkeypatch):
    from benchmark import transformer_floor

    calls = []
    script = load_script("ppo_transformer")
    forward = script.Agent.forward
    monkeypatch.setattr(
        script.Agent,
        "forward",
        lambda self, obs, *rest: calls.append(tuple(obs.shape)) or forward(self, obs, *rest),
    )
    flags = ["--num-envs", "4", "--num-steps", "16", "--context-len", "5", "--n-layers", "2"]
    floor = transformer_floor.update_floor(flags, 1)
    assert floor["steps"] == 4 * 16 and floor["seconds"] > 0 and 0 < floor["attention_share"] < 1
    # 2 envs per minibatch, each its 2 x 4 carried steps and its 16; CartPole's 4 observations, action and reward 3.
    assert calls == [(2, 8 + 16, 4 + 3)] * (1 + 5 + 5)


def test_ddpg_floor_times_the_scripts_own_networks_over_a_critic_and_an_actor_update(monkeypatch):
    calls = []
    script = load_script("ddpg")

    def counted(forward):
        return lambda self, x, *rest: (
            calls.append((type(self).__name__, len(x))) or forward(self, x, *rest)
        )

    for network in (script.QNetwork, script.Actor):
        monkeypatch.setattr(network, "forward", counted(network.forward))
    moved = []
    monkeypatch.setattr(script, "polyak_update", lambda target, online, tau: moved.append(tau))
    critic, actor = ddpg_floor.update_floor_seconds(
        ["--batch-size", "32", "--hidden-size", "16", "--tau", "0.02"], 1
    )
    assert critic > 0 and actor > 0
    # 6 critic updates (the targets' actor and critic, then the critic), then 6 actor updates (actor,
    # critic), on the batch; building the agent probes the actor's output size on one observation.
    assert [call for call in calls if call[1] == 32] == [
        ("Actor", 32),
        ("QNetwork", 32),
        ("QNetwork", 32),
    ] * 6 + [("Actor", 32), ("QNetwork", 32)] * 6
    assert moved == [0.02] * 12  # both targets after each actor update


def test_distributed_floor_times_all_reduces_and_reads_a_two_rank_runs_time_split(tmp_path):
    from benchmark import distributed_floor

    seconds = distributed_floor.all_reduce_seconds(1_000, 20)
    assert len(seconds) == 20 and (seconds > 0).all()
    flags = ["--env-id", "Probe1-v0", "--num-steps", "16"]
    two = distributed_floor.run_script(flags, 2, 8 * 128, tmp_path)
    assert set(two) == {"rollout_seconds", "update_seconds", "collective_seconds", "sps"}
    assert all(value > 0 for value in two.values())
    assert two["collective_seconds"] < two["update_seconds"] + two["rollout_seconds"]


def test_ddpg_speed_counts_from_learning_starts_and_splits_the_loop(tmp_path, monkeypatch, capsys):
    events = [
        ScalarEvent(wall_time=time, step=step, value=0.0)
        for step, time in ((100, 1.0), (500, 2.0), (900, 4.0))
    ]
    sessions = [SimpleNamespace(scalars={"charts/SPS": events})]
    assert ddpg_speed.sps_after(sessions, 500) == 200.0  # the steps after 500 over their seconds
    with pytest.raises(ValueError):
        ddpg_speed.sps_after(sessions, 600)
    monkeypatch.setattr(ddpg_speed, "SETTLE_STEPS", 0)
    monkeypatch.setattr(ddpg_speed, "REPEATS", 3)
    flags = [
        "--total-timesteps",
        "400",
        "--learning-starts",
        "100",
        "--batch-size",
        "16",
        "--hidden-size",
        "16",
    ]
    monkeypatch.setattr(sys, "argv", ["ddpg_speed", *flags])
    assert ddpg_speed.main() == 0
    printed = capsys.readouterr().out
    for part in (
        "env step",
        "action and noise",
        "buffer add",
        "buffer sampling",
        "logging and the rest of the loop",
    ):
        assert f"  {part}: " in printed  # each part of the loop timed
    assert "SPS after --learning-starts" in printed and "of the floor's" in printed


REFERENCE_NAME = "sb3_recurrent_ppo_reference"


def reference_case(env_id="E", steps=1200, seeds=(1, 2), task_max=1.0):
    return cases.memory_case(env_id, steps, task_max, cases.ReferenceRuns(REFERENCE_NAME, seeds))


def test_a_reference_case_passes_on_its_mean_evaluation_within_a_share_of_the_range(tmp_path):
    jobs, [plan] = make_jobs(Run(), [reference_case("Probe1-v0")], (1, 2), tmp_path)
    reference_jobs = [job for job in jobs if job.group == plan.reference_group]
    assert [job.seed for job in reference_jobs] == [1, 2] and all(
        job.kind == "sb3" for job in reference_jobs
    )
    command = reference_jobs[0].command
    settings = json.loads(command[command.index("--settings") + 1])
    assert (
        settings == REFERENCES[REFERENCE_NAME].settings
        and command[command.index("--label") + 1] == REFERENCE_NAME
    )
    [random_job] = [job for job in jobs if job.kind == "random-policy"]
    random_job.output = {"mean": -0.5}  # a range of 1.5: the margin is 0.075
    # The reference evaluates at 0.9 and 1.0 (mean 0.95): the bound is 0.875. Script seeds 0.8 and 1.0: mean 0.9.
    for job in jobs:
        job.summary = summary(
            job.seed, np.linspace(-0.5, 1.0, 300), episode_steps=np.arange(1, 301) * 4
        )
    evals = {
        (REFERENCE_NAME, 1): [0.9],
        (REFERENCE_NAME, 2): [1.0],
        ("ppo_lstm", 1): [0.8],
        ("ppo_lstm", 2): [1.0],
    }
    for job in jobs:
        if job.summary is not None:
            job.summary.eval_returns = evals.get((job.label, job.seed), [])
    rows = rows_of(jobs, [plan])
    script_row = next(row for row in rows if row.label == "ppo_lstm")
    assert script_row.threshold == pytest.approx(0.95 - 0.05 * 1.5)
    numbers = {row.key: row_numbers(row) for row in rows}
    # one seed under the bound: the mean over seeds is judged
    assert numbers[script_row.key].verdict == "PASS"
    line = against_reference(plan, jobs, rows, numbers)
    assert line.reference_eval == pytest.approx(0.95) and line.bound == pytest.approx(0.875)
    assert line.script_score == pytest.approx(1.4 / 1.5) and line.reference_score == pytest.approx(
        1.45 / 1.5
    )
    assert line.speed_threshold == pytest.approx(-0.5 + 0.8 * 1.45)
    # Returns climb linearly: the last-100 mean reaches the threshold at one episode for every run.
    means = np.convolve(np.linspace(-0.5, 1.0, 300), np.ones(100) / 100, "valid")
    episode = 99 + int(np.argmax(means >= line.speed_threshold))
    assert line.script_steps == line.reference_steps == (episode + 1) * 4
    assert line.script_seconds == pytest.approx((episode + 1) * 4 / 100.0)
    for job in jobs:  # the speed table divides the script's SPS by the reference's
        if job.summary is not None:
            job.summary.sps = 250.0 if job.label == REFERENCE_NAME else 1000.0
    [speed] = speed_rows(jobs, [plan], {row.key: row_numbers(row) for row in rows})
    assert speed.baseline == REFERENCE_NAME and speed.script_over_baseline == pytest.approx(4.0)
    # taken from the store: its SPS was measured in another session, not beside these
    for job in reference_jobs:
        job.stored = {"date": "2026-11-24T00:00:00+00:00", "git": "0000000"}
    assert speed_rows(jobs, [plan], {row.key: row_numbers(row) for row in rows}) == []
    evals["ppo_lstm", 1] = [0.7]  # mean 0.85
    for job in jobs:
        if job.summary is not None:
            job.summary.eval_returns = evals.get((job.label, job.seed), [])
    assert row_numbers(rows_of(jobs, [plan])[0]).verdict == "FAIL"
    random_job.output = {}  # not measured: no bound, no verdict
    assert rows_of(jobs, [plan])[0].threshold is None


def test_stored_reference_runs_are_reused_and_marked_with_their_date_and_commit(
    tmp_path, monkeypatch, capsys
):
    case = cases.memory_case("Probe1-v0", 1024, 1.0, cases.ReferenceRuns(REFERENCE_NAME, (1,)))
    monkeypatch.setitem(cases.SUITES, "memory", cases.Suite((case,), (1,), eval_episodes=2))
    store = tmp_path / "store"
    first = Run(
        suite="memory", reuse_baselines=str(store), only_baselines=True, out=str(tmp_path / "first")
    )
    assert run_report.run(first) == 0
    assert not list((tmp_path / "first" / "runs").glob("ppo_lstm*"))  # the references alone
    [stored] = store.glob("*.json")
    assert stored.name.startswith(f"{REFERENCE_NAME}__Probe1-v0__1024__") and stored.name.endswith(
        "__1.json"
    )
    second = Run(suite="memory", reuse_baselines=str(store), out=str(tmp_path / "second"))
    capsys.readouterr()
    assert run_report.run(second) == 0
    printed = capsys.readouterr().out
    assert f"[stored] {stored.stem} ({REFERENCE_NAME})" in printed
    assert not list((tmp_path / "second" / "runs").glob(f"{REFERENCE_NAME}*"))  # not run again
    record = json.loads((tmp_path / "second" / "results.json").read_text())
    [line] = record["against_reference"]
    [reused_job] = [job for job in record["jobs"] if job["id"] == stored.stem]
    assert reused_job["stored"]["date"] == json.loads(stored.read_text())["made"]["date"]
    # Probe1 pays 1 per episode whatever is done: the random policy, the reference and the script all score 1.
    assert (
        line["random_return"] == 1.0
        and line["reference_eval"] == 1.0
        and line["script_eval"] == 1.0
    )
    assert line["verdict"] == "PASS" and line["reference_made"][0].startswith("seed 1 ")
    assert "## Against the reference" in (tmp_path / "second" / "results.md").read_text()
    first_record = json.loads((tmp_path / "first" / "results.json").read_text())
    [first_reference] = [row for row in first_record["rows"] if row["label"] == REFERENCE_NAME]
    [reused] = [row for row in record["rows"] if row["label"] == REFERENCE_NAME]
    assert reused["eval_return_mean"] == first_reference["eval_return_mean"]
    assert (
        reused["steps"] == first_reference["steps"]
        and reused["sps_mean"] == first_reference["sps_mean"]
    )
    # Made with 2 evaluation episodes, which the job id does not name: not reused for a benchmark that asks for 3.
    third = Run(
        suite="memory", reuse_baselines=str(store), eval_episodes=3, out=str(tmp_path / "third")
    )
    assert run_report.run(third) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: ") and stored.name in line and not (tmp_path / "third").exists()


def test_stored_script_runs_are_reused_whichever_checkout_made_them(tmp_path, monkeypatch, capsys):
    case = cases.Case("ppo_fc", "Probe1-v0", 1024, flags=("--num-envs", "1", "--num-steps", "256"))
    monkeypatch.setitem(cases.SUITES, "quick", cases.Suite((case,), (1,), eval_episodes=2))
    store = tmp_path / "store"
    assert (
        run_report.run(Run(suite="quick", reuse_runs=str(store), out=str(tmp_path / "first"))) == 0
    )
    [stored] = store.glob("*.json")
    assert stored.name == f"{case.key}__1.json"
    record = json.loads(stored.read_text())  # as if made in another checkout of the repository
    record["made"]["command"] = record["made"]["command"].replace(
        str(REPO), "/elsewhere/onefile-rl"
    )
    stored.write_text(json.dumps(record))
    capsys.readouterr()
    assert (
        run_report.run(Run(suite="quick", reuse_runs=str(store), out=str(tmp_path / "second"))) == 0
    )
    assert f"[stored] {stored.stem} (ppo_fc)" in capsys.readouterr().out
    assert not (tmp_path / "second" / "runs").exists()  # not run again
    first, second = (
        json.loads((tmp_path / name / "results.json").read_text()) for name in ("first", "second")
    )
    assert second["rows"][0]["eval_return_mean"] == first["rows"][0]["eval_return_mean"] == 1.0
    assert second["rows"][0]["steps"] == first["rows"][0]["steps"] == 1024


def test_stored_baseline_runs_are_reused_with_the_scripts(tmp_path, monkeypatch, capsys):
    # A long suite killed part-way (the Atari one) resumes without running its SB3 baselines again.
    case = cases.Case("ppo_fc", "Probe1-v0", 1024, flags=("--num-envs", "1", "--num-steps", "256"))
    monkeypatch.setitem(cases.SUITES, "quick", cases.Suite((case,), (1,), eval_episodes=2))
    store = tmp_path / "store"
    run = Run(suite="quick", reuse_runs=str(store), baselines=True, out=str(tmp_path / "first"))
    assert run_report.run(run) == 0
    [baseline] = store.glob("sb3_ppo__*.json")
    capsys.readouterr()
    assert run_report.run(replace(run, out=str(tmp_path / "second"))) == 0
    assert f"[stored] {baseline.stem} (sb3_ppo)" in capsys.readouterr().out
    # neither the script nor its baseline ran again
    assert not (tmp_path / "second" / "runs").exists()


def test_the_commit_a_benchmark_names_is_dirty_only_for_code_outside_its_output_docs_and_tests(
    tmp_path, monkeypatch
):
    def git(*args: str) -> None:
        subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True
        )

    output = tmp_path / "docs" / "benchmark"
    output.mkdir(parents=True)
    (output / "results.md").write_text("old\n")
    (tmp_path / "script.py").write_text("x = 1\n")
    git("init", "--quiet")
    git("add", ".")
    git("commit", "--quiet", "-m", "one")
    monkeypatch.setattr("benchmark.report.REPO", tmp_path)
    (output / "results.md").write_text("new\n")  # the benchmark rewriting its own committed output
    (tmp_path / "notes.txt").write_text("untracked\n")
    (tmp_path / "README.md").write_text("a page written while it runs\n")
    (tmp_path / "docs" / "page.md").write_text("a page\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_it.py").write_text("a test\n")
    git("add", "README.md", "docs/page.md", "tests/test_it.py")
    clean = git_revision(output)
    assert clean and "uncommitted" not in clean and clean != "unknown"
    (tmp_path / "script.py").write_text("x = 2\n")
    assert git_revision(output) == clean + " (uncommitted changes)"
    assert git_revision(tmp_path.parent / "elsewhere") == clean + " (uncommitted changes)"


def test_a_stored_file_that_is_not_a_run_is_one_error_line_before_anything_runs(
    tmp_path, monkeypatch, capsys
):
    case = cases.memory_case("Probe1-v0", 1024, 1.0, cases.ReferenceRuns(REFERENCE_NAME, (1,)))
    monkeypatch.setitem(cases.SUITES, "memory", cases.Suite((case,), (1,), eval_episodes=2))
    store = tmp_path / "store"
    jobs, _ = make_jobs(Run(suite="memory"), [case], (1,), tmp_path)
    [reference_job] = [job for job in jobs if job.label == REFERENCE_NAME]
    store.mkdir()
    (store / f"{reference_job.id}.json").write_text('{"format": 1, "job_id": "cut sho')
    out = tmp_path / "out"
    assert run_report.run(Run(suite="memory", reuse_baselines=str(store), out=str(out))) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: ") and reference_job.id in line and not out.exists()


def test_the_speed_table_tells_apart_two_rows_of_one_script_by_their_flags():
    names = []
    for flags in ([], list(cases.DEFAULTS_BEFORE_MEMORY_SUITE)):
        numbers = dict(
            label="ppo_lstm",
            env_id="E",
            key=" ".join(flags),
            flags=flags,
            sps=1.0,
            raw_env_sps=None,
        )
        numbers |= dict(
            script_over_raw_env=None, baseline=None, baseline_sps=None, script_over_baseline=None
        )
        [row] = speed_table([SpeedNumbers(**numbers)])[2:]
        names.append(row.split("|")[1].strip())
    assert (
        names[0] == "ppo_lstm"
        and names[1] == f"ppo_lstm `{' '.join(cases.DEFAULTS_BEFORE_MEMORY_SUITE)}`"
    )


@pytest.mark.parametrize(
    "case",
    [
        case
        for name in ("memory", "memory-transformer", "memory-transformer-no-par")
        for case in cases.SUITES[name].cases
    ],
    ids=lambda case: case.key,
)
def test_every_memory_case_resolves_and_the_reference_builds_its_envs(case):
    script = recurrent_floor.load_script(case.script)
    args = resolve_args(case.script, case.flags)
    make_env = script_make_env(script, args)
    observation_space, action_space, _ = env_spaces(make_env(resolve_env_id(case.env_id)))
    assert (
        case.task_max is not None and case.judged_on == "reference" and case.reference is not None
    )
    if isinstance(case.reference, cases.ReferenceRuns):
        reference = REFERENCES[case.reference.name]
        settings = json.loads(json.dumps(reference.settings))
        envs = make_sb3_envs(case.env_id, settings, seed=1)
        model = build_sb3_model(reference.sb3_algo, settings, envs, seed=1)
        assert model.action_space == action_space
        # ppo_transformer's observations also hold the previous action and reward, unless turned off
        if case.script == "ppo_lstm" or not args.prev_action_reward:
            assert model.observation_space == observation_space
        assert model.policy.lstm_actor.hidden_size == 128 and model.policy.lstm_critic is not None
        assert (model.n_envs, model.n_steps, model.batch_size, model.n_epochs) == (8, 128, 128, 10)
        envs.close()
    continuous = isinstance(action_space, gym.spaces.Box)
    # that suite's one difference
    own_flags = [flag for flag in case.flags if flag != "--no-prev-action-reward"]
    # no flags of a task's own
    assert own_flags == list(cases.CONTINUOUS_FLAGS_OF[case.script] if continuous else ())
    assert args.env_id == "CartPole-v1"  # the harness gives the env id


def test_the_memory_length_study_places_its_cue_beyond_the_default_receptive_field_and_within_the_longer_one():
    env = gym.make(resolve_env_id(cases.MEMORY_LENGTH_ENV))
    env.reset(seed=1)
    steps = 1
    while not any(env.step(0)[2:4]):
        steps += 1
    env.close()
    receptive_fields = {}
    for case in cases.SUITES["memory-length"].cases:
        args = resolve_args(case.script, case.flags)
        assert (
            case.env_id == cases.MEMORY_LENGTH_ENV
            and case.threshold == 0.9
            and case.judged_on == "eval"
        )
        if case.script == "ppo_transformer":
            receptive_fields[case.flags] = (
                args.n_layers * (args.context_len - 1),
                args.prev_action_reward,
            )
    # the cue is shown at step 0 and needed at every step up to the last, steps - 1 later
    assert (
        receptive_fields[()] == (receptive_fields[("--no-prev-action-reward",)][0], True)
        and receptive_fields[()][0] < steps - 1
    )
    longer = receptive_fields[("--no-prev-action-reward", "--context-len", "128")]
    assert longer[0] >= steps - 1 and not longer[1]


def test_random_policy_return_is_measured_on_the_scripts_env():
    command = [
        sys.executable,
        "-m",
        "benchmark.baselines",
        "random-policy",
        "--env-id",
        "Probe2-v0",
    ]
    process = subprocess.run(
        [*command, "--episodes", "40"], cwd=REPO, capture_output=True, text=True
    )
    assert process.returncode == 0, process.stderr
    printed = json.loads(process.stdout.strip().splitlines()[-1])
    # Probe2 pays +1 or -1 by its observation, whatever the action: a random policy's mean is near 0, never ±1.
    assert (
        printed["episodes"] == 40
        and len(printed["returns"]) == 40
        and set(printed["returns"]) == {-1.0, 1.0}
    )
    assert printed["mean"] == pytest.approx(np.mean(printed["returns"]))


def test_the_memory_speed_suite_runs_the_old_defaults_beside_the_new_against_one_reference_run(
    tmp_path,
):
    suite = cases.SUITES["memory-speed"]
    jobs, _ = make_jobs(Run(suite="memory-speed"), list(suite.cases), suite.seeds, tmp_path)
    by_kind = {kind: [job for job in jobs if job.kind == kind] for kind in ("script", "sb3")}
    # two popgym tasks, one reference run each
    assert len(by_kind["script"]) == 2 * len(by_kind["sb3"]) == 4
    old, new = (
        resolve_args("ppo_lstm", cases.DEFAULTS_BEFORE_MEMORY_SUITE),
        resolve_args("ppo_lstm", ()),
    )
    moved = {name for name in vars(new) if vars(old)[name] != vars(new)[name]}
    assert moved == {"update_epochs", "num_minibatches", "learning_rate"}


def count_recall_episode(
    dealt: list[int], queried: list[int], answers: list[int], rewards: list[float]
) -> dict:
    one_hot = np.eye(2, dtype=np.float32)
    observations = np.concatenate([one_hot[dealt], one_hot[queried]], axis=1)[None]
    ends = np.zeros((1, len(dealt)), dtype=bool)
    ends[0, -1] = True
    return {
        "/observations": observations,
        "/actions": np.array([answers]),
        "/rewards": np.array([rewards], dtype=np.float32),
        "/terminations": ends,
        "/truncations": np.zeros_like(ends),
    }


def test_count_recall_errors_count_the_queried_colour_among_the_cards_dealt_so_far_this_one_included():
    # dealt 0 1 0 0, asked 0 0 1 0: the right answers are 1 1 1 3
    data = count_recall_episode([0, 1, 0, 0], [0, 0, 1, 0], [1, 2, 1, 0], [1, -1, 1, -1])
    right, error = answers_by_step.answers_by_step(data, count_recall=True)
    assert right.tolist() == [1, 0, 1, 0] and error.tolist() == [0, 1, 0, 3]
    assert answers_by_step.answers_by_step(data)[1] is None
    with pytest.raises(TrajectoryFileError, match="do not match"):  # another env's rewards
        answers_by_step.answers_by_step(
            count_recall_episode([0, 1, 0, 0], [0, 0, 1, 0], [1, 2, 1, 0], [1, 1, 1, 1]),
            count_recall=True,
        )


def test_answers_by_step_prints_the_share_of_right_answers_in_each_range_of_steps(tmp_path, capsys):
    data = count_recall_episode([0, 1, 0, 0], [0, 0, 1, 0], [1, 2, 1, 0], [1, -1, 1, 1])
    data |= {"/masks": np.ones_like(data["/rewards"])}
    np.savez(tmp_path / "a.npz", **data)
    assert answers_by_step.main([str(tmp_path / "a.npz"), "--steps", "0", "2"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"| {tmp_path / 'a.npz'} | 0.50 | 1.00 |"
    assert answers_by_step.main([str(tmp_path / "a.npz"), "--steps", "9"]) == 2
    assert answers_by_step.main([str(tmp_path / "none.npz")]) == 2
    assert capsys.readouterr().err.startswith("error: ")


def test_answers_by_action_finds_an_answer_never_given(tmp_path, capsys):
    # Answers 1 1 2 3 3 on scored steps (a reward), the first step unscored: action 0 is never given.
    data = count_recall_episode(
        [0, 1, 0, 0, 1, 0], [0, 0, 1, 0, 0, 1], [0, 1, 1, 2, 3, 3], [0, 1, -1, 1, 1, -1]
    )
    shares = answers_by_step.answers_by_action(data)
    assert shares == {0: (0.0, None), 1: (0.4, 0.5), 2: (0.2, 1.0), 3: (0.4, 0.5)}
    named = data | {"/meta/args": np.array(json.dumps({"env_id": "popgym-CountRecallEasy-v0"}))}
    # the env's 27 answers, 4 to 26 never given
    assert len(answers_by_step.answers_by_action(named)) == 27
    np.savez(tmp_path / "a.npz", **data, **{"/masks": np.ones_like(data["/rewards"])})
    assert answers_by_step.main([str(tmp_path / "a.npz"), "--steps", "0", "--by-answer"]) == 0
    assert capsys.readouterr().out.splitlines()[-4:] == ["| 0 | 0.000 | - |", "| 1 | 0.400 | 0.500 |",
                                                         "| 2 | 0.200 | 1.000 |", "| 3 | 0.400 | 0.500 |"]  # fmt: skip


def test_tracking_cost_runs_each_arm_and_reads_its_sps(capsys):
    assert tracking_cost.main(["--rounds", "1", "--steps", "512", "--env-id", "Probe1-v0"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [line for line in lines if line.startswith("| with") or line.startswith("| without")]
    assert len(rows) == 2 and all(float(row.split("|")[-2]) > 0 for row in rows), lines


def test_the_breadth_suite_holds_every_popgym_easy_task_for_both_memory_scripts():
    # Through resolve_env_id, which records popgym as the ids' module: a bare import here would leave them
    # registered with no module in this worker, and test_envs would then see them resolve unchanged.
    resolve_env_id("popgym-RepeatPreviousEasy-v0")

    registered = sorted(
        env_id for env_id in gym.registry if env_id.startswith("popgym-") and "Easy" in env_id
    )
    assert sorted(cases.POPGYM_EASY_IDS) == registered and len(registered) == 14
    suite = cases.SUITES["popgym-easy"]
    assert suite.seeds == (1, 2)
    listed = cases.suite_cases("popgym-easy")
    expected = [
        (script, env_id) for env_id in registered for script in ("ppo_lstm", "ppo_transformer")
    ]
    assert [(case.script, case.env_id) for case in listed] == expected
    for case in listed:
        assert (
            case.total_timesteps == 300_000
            and case.task_max == 1.0
            and case.judged_on == "reference"
        )
        continuous = gym.make(case.env_id).action_space.__class__.__name__ == "Box"
        assert case.flags == (cases.CONTINUOUS_FLAGS_OF[case.script] if continuous else ())
        # judged against ppo_lstm's case on the same task, run beside it
        if case.script == "ppo_transformer":
            assert case.reference.case in listed and case.reference.case.env_id == case.env_id
        else:
            assert case.reference == cases.LSTM_LEARNED


@pytest.mark.parametrize(
    ("suite", "of_suite"),
    [("memory-lstm-no-norm-adv", "memory"), ("popgym-easy-lstm-no-norm-adv", "popgym-easy")],
)
def test_the_lstm_suites_without_norm_adv_are_ppo_lstms_cases_with_only_that_flag_added(
    suite, of_suite
):
    defaults = [case for case in cases.suite_cases(of_suite) if case.script == "ppo_lstm"]
    without = cases.suite_cases(suite)
    assert [replace(case, flags=(*case.flags, "--no-norm-adv")) for case in defaults] == list(
        without
    )
    assert cases.SUITES[suite].seeds == cases.SUITES[of_suite].seeds


def test_the_transformer_is_judged_against_the_lstm_where_the_lstm_learnt_the_task(tmp_path):
    lstm_case, transformer_case = cases.breadth_cases("Probe1-v0", 1200)
    jobs, plans = make_jobs(Run(), [lstm_case, transformer_case], (1, 2), tmp_path)
    # one measurement for the two cases
    assert len([job for job in jobs if job.kind == "random-policy"]) == 1
    [random_job] = [job for job in jobs if job.kind == "random-policy"]
    # a range of 1.5: learnt above -0.2, the transformer's margin 0.075
    random_job.output = {"mean": -0.5}

    def judged(lstm_evals, transformer_evals):
        evals = {"ppo_lstm": lstm_evals, "ppo_transformer": transformer_evals}
        for job in jobs:
            if job.kind == "script":
                job.summary = summary(job.seed, [0.0] * 120)
                job.summary.eval_returns = [evals[job.label][job.seed - 1]]
        rows = rows_of(jobs, plans)
        assert [row.label for row in rows] == ["ppo_lstm", "ppo_transformer"] and all(
            row.judged for row in rows
        )
        return [(row.threshold, row_numbers(row).verdict) for row in rows]

    # ppo_lstm learnt it (mean 0.5 >= -0.2): the transformer must reach 0.5 - 0.075 on its mean.
    (lstm_bound, lstm_verdict), (bound, verdict) = judged([0.4, 0.6], [0.3, 0.6])
    assert lstm_bound == pytest.approx(-0.2) and lstm_verdict == "PASS"
    assert bound == pytest.approx(0.425) and verdict == "PASS"
    assert judged([0.4, 0.6], [0.3, 0.5])[1] == (pytest.approx(0.425), "FAIL")
    # ppo_lstm did not learn it (mean -0.3): no verdict for the transformer, a FAIL for ppo_lstm.
    assert judged([-0.3, -0.3], [0.9, 0.9]) == [(pytest.approx(-0.2), "FAIL"), (None, "-")]
    rows = rows_of(jobs, plans)
    numbers = {row.key: row_numbers(row) for row in rows}
    line = against_reference(plans[1], jobs, rows, numbers)
    assert line.reference.startswith(
        "ppo_lstm in this run"
    ) and line.reference_eval == pytest.approx(-0.3)


def test_rss_growth_reads_the_peak_at_100k_and_at_the_end_beside_ddpgs_buffer_rows(
    tmp_path, capsys
):
    from torch.utils.tensorboard import SummaryWriter

    from benchmark import rss_growth

    for name, values in (
        ("Pendulum-v1__ddpg__1", (300, 310, 340)),
        ("Pendulum-v1__ppo_fc__1", (300, 300, 300)),
    ):
        writer = SummaryWriter(tmp_path / name)
        for step, value in zip((50_000, 100_000, 300_000), values, strict=True):
            writer.add_scalar("system/rss_mb", value, step)
        writer.close()
    ddpg, ppo = (
        rss_growth.growth(tmp_path / name)
        for name in ("Pendulum-v1__ddpg__1", "Pendulum-v1__ppo_fc__1")
    )
    assert (ddpg["early_mb"], ddpg["end_mb"], ddpg["growth_mb"]) == (310, 340, 30)
    # Pendulum: 3 + 3 + 1 + 2 float32 values a row, 200k rows written after step 100k
    assert ddpg["buffer_growth_mb"] == pytest.approx(200_000 * 36 / 2**20)
    assert ppo["growth_mb"] == 0 and ppo["buffer_growth_mb"] is None


def test_a_cases_long_flags_stay_inside_its_figures(tmp_path, monkeypatch):
    # The MuJoCo suite's ppo_fc case names 13 flags: on one line its name ran off the legend and the SPS figure.
    runs = [
        RunSummary(
            "run", "ppo_fc", "Hopper-v5", seed, 2048, np.arange(1, 101) * 20.0, np.arange(1, 101) * 1.0,
            np.linspace(0, 1000, 100), sps=900.0 + seed,
        )
        for seed in (1, 2)
    ]  # fmt: skip
    rows = [
        Row("ppo_fc", env_id, env_id, 2048, cases.PPO_CONTINUOUS_FLAGS, runs=runs)
        for env_id in ("Hopper-v5", "Walker2d-v5")
    ]
    plt = report._pyplot()
    drawn = []
    monkeypatch.setattr(plt, "close", drawn.append)  # kept open, to be measured
    report.draw(rows, [], tmp_path)
    monkeypatch.undo()
    assert len(drawn) == 5  # a return against steps and time per env, and the SPS
    for figure in drawn:
        drawn_on = figure.get_tightbbox(figure.canvas.get_renderer())  # what is drawn, in inches
        width, height = figure.get_size_inches()
        title = figure.axes[0].get_title()
        assert drawn_on.x0 >= -0.01 and drawn_on.y0 >= -0.01, title
        assert drawn_on.x1 <= width + 0.01 and drawn_on.y1 <= height + 0.01, title
        plt.close(figure)


def test_a_benchmark_stopped_before_any_run_finished_draws_no_empty_figure(tmp_path):
    # a suite stopped by SIGTERM with only cut runs once drew an empty SPS chart, with matplotlib's warning on stderr
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert report.draw([], [], tmp_path) == []
    assert list(tmp_path.iterdir()) == []

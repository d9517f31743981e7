"""The scripts the harness runs: each one's Stable-Baselines3 counterpart, how the script's settings
become that counterpart's, and the script's own env stack for the raw-env measurement.

A case's settings are never typed twice: `resolve_args` parses the case's flags with the script's
own `Args` (its defaults included), and the baseline's settings, the number of envs and the raw env
stack all come from the result. A new script adds one `Script` to `SCRIPTS`;
`tests/test_benchmark.py` then checks that every field of its `Args` is either given to the baseline
(and read back from the built SB3 model) or listed in `unmatched` with the reason."""

from __future__ import annotations

import dataclasses
import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import torch

from common import checkpoints
from common.atari import is_atari_id
from common.cli import parse_args
from common.envs import checked_spaces, resolve_env_id, training_envs
from common.seeding import threads_for

REPO = Path(__file__).resolve().parent.parent

RUN_PLUMBING = (
    "run plumbing: it changes where and how a run is logged, saved or evaluated, not how it trains"
)


@dataclass(frozen=True)
class Script:
    """A script of the repository root, as the harness needs it."""

    name: str
    """the file stem, e.g. ppo_fc"""
    sb3_algo: str
    """its Stable-Baselines3 counterpart (`benchmark.baselines sb3 --algo`)"""
    sb3_settings: Callable[[Any], dict[str, Any]]
    """the script's parsed `Args` -> the counterpart's settings (`benchmark.baselines sb3
    --settings`, JSON)"""
    vector_env: Callable[[ModuleType, Any], Any]
    """(the script's module, its parsed `Args`) -> the vector env stack it trains on"""
    unmatched: dict[str, str]
    """fields of `Args` the counterpart is not given, each with the reason"""


def shared_sb3_settings(args: Any) -> dict[str, Any]:
    """The settings every script gives its counterpart: envs, threads, two hidden layers, the
    learning-rate decay."""
    return {
        "num_envs": args.num_envs,
        "async_envs": args.async_envs,
        "torch_threads": args.torch_threads,
        "learning_rate": args.learning_rate,
        "end_learning_rate": args.end_learning_rate if args.anneal_lr else args.learning_rate,
        "hidden_sizes": [args.hidden_size, args.hidden_size]
        if hasattr(args, "hidden_size")
        else [],
    }


SHARED_UNMATCHED = {
    **dict.fromkeys(
        (
            "exp_name", "track", "wandb_project_name", "wandb_entity", "capture_video", "video_every", "run_dir",
            "progress", "save_model", "checkpoint_every", "checkpoint_minutes", "run_name", "resume", "check_resume",
            "eval_checkpoint", "eval_episodes", "save_trajectories", "env_id", "total_timesteps", "seed",
        ),
        RUN_PLUMBING + " (env id, steps, seed and evaluation episodes are given to both as they are)",
    ),
    "torch_deterministic": "SB3 leaves torch's deterministic algorithms as they are; on a CPU it makes no difference",
    "cuda": "the harness runs both on the CPU",
    "anneal_lr": "given as end_learning_rate (equal to learning_rate when off)",
    "end_learning_rate": "given as SB3's learning-rate schedule, linear from learning_rate to it",
}  # fmt: skip
"""the fields of every script that its counterpart is not given, with the reasons"""


def ppo_sb3_settings(args: Any) -> dict[str, Any]:
    """An MLP PPO script's settings as SB3 PPO's: the same envs, rollout, losses, network and
    learning-rate decay."""
    return {
        **shared_sb3_settings(args),
        "norm_obs": args.norm_obs,
        "norm_reward": args.norm_reward,
        "clip_reward": args.norm_reward_clip,
        "activation": "tanh",
        "model": {
            "n_steps": args.num_steps,
            "batch_size": args.num_envs * args.num_steps // args.num_minibatches,
            "n_epochs": args.update_epochs,
            "gamma": args.gamma,
            "gae_lambda": args.gae_lambda,
            "clip_range": args.clip_coef,
            "clip_range_vf": args.clip_coef if args.clip_vloss else None,
            "normalize_advantage": args.norm_adv,
            "ent_coef": args.ent_coef,
            "vf_coef": args.vf_coef,
            "max_grad_norm": args.max_grad_norm,
            "target_kl": args.target_kl,
        },
        **atari_sb3_settings(args, frame_stack=4),
    }


def atari_sb3_settings(args: Any, frame_stack: int) -> dict[str, Any]:
    """For an Atari game: SB3's AtariWrapper with the script's `frame_stack` (its make_env's), and
    SB3's Nature CNN with linear heads, as the script's CNN has (no hidden layers, no normalised
    pixels). Nothing for other envs."""
    if not is_atari_id(resolve_env_id(args.env_id)):
        return {}
    return {"atari_frame_stack": frame_stack, "hidden_sizes": [], "norm_obs": False}


PPO_UNMATCHED = {
    **SHARED_UNMATCHED,
    **dict.fromkeys(("sampling_method", "temperature", "sampling_k"), RUN_PLUMBING),
    "numpy_rollout": "how the rollout computes the same policy (checked against torch every iteration), not what",
    **dict.fromkeys(
        ("compile", "cuda_graphs"),
        "how the script runs its action and minibatch steps (compiled, or replayed as CUDA graphs), not what they are",
    ),
    "dist_backend": "the process group's backend under torchrun: how ranks exchange values, not what is computed",
    "env_backend": "how the script steps Atari games (gymnasium's wrappers or EnvPool); SB3 steps its own AtariWrapper",
    "bootstrap_truncation": "SB3's PPO always bootstraps truncated episodes from their last observation's value, as "
    "the script's default does (a case with --no-bootstrap-truncation has no SB3 equivalent)",
    "encoder": "the default's: SB3's CnnPolicy for an Atari game (its Nature CNN), its MlpPolicy for vectors (a case "
    "with another --encoder has no counterpart)",
}  # fmt: skip


def recurrent_ppo_sb3_settings(args: Any) -> dict[str, Any]:
    """A recurrent PPO script's settings as sb3-contrib RecurrentPPO's: PPO's, with the recurrent
    cell's size, its layers and whether the critic has its own, and linear heads on the cell's
    output as the script has. (With a shared LSTM, RecurrentPPO stops the value loss's gradient at
    the LSTM; the script's shared core lets it through.)"""
    settings = {**ppo_sb3_settings(args), **atari_sb3_settings(args, frame_stack=1)}
    settings["hidden_sizes"] = []  # no MLP between the cell and the heads
    settings["policy_kwargs"] = {
        "lstm_hidden_size": args.rnn_hidden_size,
        "n_lstm_layers": args.rnn_layers,
        "shared_lstm": args.shared_core,
        "enable_critic_lstm": not args.shared_core,
    }
    return settings


RECURRENT_PPO_UNMATCHED = {
    **PPO_UNMATCHED,
    "hidden_size": "RecurrentPPO's LSTM reads the observation itself; the script's encoder layer before the cell has "
    "no counterpart",
    "rnn_type": "RecurrentPPO has only an LSTM (a case with --rnn-type gru has no counterpart)",
    "bptt_len": "RecurrentPPO cuts its minibatches of batch_size steps from the env sequences itself; the script's "
    "default (whole env rollouts) and its chunks have no exact counterpart",
}


def transformer_ppo_sb3_settings(args: Any) -> dict[str, Any]:
    """A transformer PPO script's settings as sb3-contrib RecurrentPPO's (SB3 has no transformer
    policy): PPO's, with the memory suite reference's memory in place of the transformer (an LSTM of
    128 units for the actor and one for the critic, linear heads on them)."""
    settings = {**ppo_sb3_settings(args), **atari_sb3_settings(args, frame_stack=1)}
    settings["policy_kwargs"] = {
        "lstm_hidden_size": 128,
        "n_lstm_layers": 1,
        "shared_lstm": False,
        "enable_critic_lstm": True,
    }
    return settings


TRANSFORMER_PPO_UNMATCHED = {
    **{
        name: reason
        for name, reason in PPO_UNMATCHED.items()
        if name not in ("numpy_rollout", "compile", "cuda_graphs")
    },
    **dict.fromkeys(
        ("d_model", "n_heads", "n_layers", "context_len"),
        "RecurrentPPO has an LSTM, not a transformer: the counterpart's memory is the memory suite reference's LSTM",
    ),
    "prev_action_reward": "RecurrentPPO's policy sees the observation only (a case with --no-prev-action-reward is its "
    "exact counterpart in that respect)",
}


def ddpg_sb3_settings(args: Any) -> dict[str, Any]:
    """A DDPG script's settings as SB3 TD3's with one critic, no target policy smoothing and the
    script's policy delay: that is DDPG with a delayed actor, as CleanRL's and ddpg.py's (SB3's own
    DDPG updates the actor every step)."""
    return {
        **shared_sb3_settings(args),
        "activation": "relu",
        "exploration_noise": args.exploration_noise,
        "noise": args.noise,
        "policy_kwargs": {"n_critics": 1},
        "model": {
            "buffer_size": args.buffer_size,
            "learning_starts": args.learning_starts,
            "batch_size": args.batch_size,
            "tau": args.tau,
            "gamma": args.gamma,
            "train_freq": 1,
            "gradient_steps": args.num_envs
            * args.updates_per_step,  # per vector step: num_envs transitions
            "policy_delay": args.policy_frequency,
            "target_policy_noise": 0.0,
            "target_noise_clip": 0.0,
        },
    }


DDPG_UNMATCHED = {**SHARED_UNMATCHED, **dict.fromkeys(("save_buffer", "eval_every"), RUN_PLUMBING)}


SCRIPTS: dict[str, Script] = {
    "ppo_fc": Script(
        name="ppo_fc",
        sb3_algo="ppo",
        sb3_settings=ppo_sb3_settings,
        vector_env=lambda module, args: training_envs(module.make_env, args, "", None)[0],
        unmatched=PPO_UNMATCHED,
    ),
    "ppo_lstm": Script(
        name="ppo_lstm",
        sb3_algo="recurrent_ppo",
        sb3_settings=recurrent_ppo_sb3_settings,
        vector_env=lambda module, args: training_envs(module.make_env, args, "", None)[0],
        unmatched=RECURRENT_PPO_UNMATCHED,
    ),
    "ppo_transformer": Script(
        name="ppo_transformer",
        sb3_algo="recurrent_ppo",
        sb3_settings=transformer_ppo_sb3_settings,
        vector_env=lambda module, args: training_envs(
            script_make_env(module, args), args, "", None
        )[0],
        unmatched=TRANSFORMER_PPO_UNMATCHED,
    ),
    "ddpg": Script(
        name="ddpg",
        sb3_algo="td3",
        sb3_settings=ddpg_sb3_settings,
        vector_env=lambda module, args: training_envs(module.make_env, args, "", None)[0],
        unmatched=DDPG_UNMATCHED,
    ),
}


@dataclass(frozen=True)
class Reference:
    """A baseline with settings of its own, fixed, not derived from a script's: the same
    configuration on every task it is run on, so that a script's defaults are measured against
    something they cannot move."""

    name: str
    """its label in the tables and its runs' exp name"""
    sb3_algo: str
    """the Stable-Baselines3 algorithm (`benchmark.baselines sb3 --algo`)"""
    settings: dict[str, Any]
    """its settings (`benchmark.baselines sb3 --settings`, JSON)"""


# sb3-contrib's RecurrentPPO with its own defaults (n_steps 128, batch 128, 10 epochs, lr 3e-4 held
# constant, clip 0.2, GAE 0.95, gamma 0.99, no entropy bonus, an LSTM for the actor and one for the
# critic, each followed by its 64-64 tanh MLP, no normalisation), written out so that a change of
# sb3-contrib's defaults does not move it; two departures: 8 envs (its default is 1) and 128-unit
# LSTMs (its default of 256 ran at 145 SPS on this machine's CPU, too slow for the memory suite's
# budget).
RECURRENT_PPO_REFERENCE = Reference(
    name="sb3_recurrent_ppo_reference",
    sb3_algo="recurrent_ppo",
    settings={
        "num_envs": 8,
        "async_envs": False,
        "norm_obs": False,
        "norm_reward": False,
        "torch_threads": 1,
        "learning_rate": 3e-4,
        "end_learning_rate": 3e-4,
        "hidden_sizes": [64, 64],
        "activation": "tanh",
        "policy_kwargs": {
            "lstm_hidden_size": 128,
            "n_lstm_layers": 1,
            "shared_lstm": False,
            "enable_critic_lstm": True,
        },
        "model": {
            "n_steps": 128,
            "batch_size": 128,
            "n_epochs": 10,
            "gamma": 0.99,
            "gae_lambda": 0.95,
            "clip_range": 0.2,
            "clip_range_vf": None,
            "normalize_advantage": True,
            "ent_coef": 0.0,
            "vf_coef": 0.5,
            "max_grad_norm": 0.5,
            "target_kl": None,
        },
    },
)

REFERENCES: dict[str, Reference] = {RECURRENT_PPO_REFERENCE.name: RECURRENT_PPO_REFERENCE}


def launcher(nproc: int) -> list[str]:
    """How a script is started with `nproc` processes: plain python, or torchrun on this machine
    alone (as docs/distributed.md starts the scripts)."""
    torchrun = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    return [sys.executable, *(torchrun if nproc > 1 else [])]


def load_script(name: str) -> ModuleType:
    """The script `name`.py of the repository root, imported as a module (its `main()` is not run)."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    return importlib.import_module(name)


def script_make_env(script: ModuleType, args: Any) -> Callable[..., Callable]:
    """The script's `make_env` with what it takes from the run's settings (`env_kwargs`, where the
    script has it), as its `Run` makes its envs."""
    if hasattr(script, "env_kwargs"):
        return partial(script.make_env, **script.env_kwargs(args))
    return script.make_env


def script_agent(script: ModuleType, args: Any, checkpoint: dict | None = None) -> torch.nn.Module:
    """The script's agent for `args` on the CPU, as its `Run` has it built (the env's spaces
    checked) and started (the checkpoint's weights, if given; the torch threads for the network)."""
    actions = getattr(script, "RUN_OPTIONS", {}).get("actions")
    spaces = checked_spaces(script_make_env(script, args), args, *([actions] if actions else []))
    cpu = torch.device("cpu")
    run = SimpleNamespace(
        args=args, observation_space=spaces[0], action_space=spaces[1], device=cpu
    )
    agent = script.build_agent(run)
    checkpoints.restore(checkpoint, {"model": agent})
    threads_for(args.torch_threads, agent)
    return agent


def resolve_args(name: str, flags: tuple[str, ...] | list[str]) -> Any:
    """The script's complete `Args` for a command line of `flags`, parsed by the script's own `Args`
    with tyro; a bad flag is a `UsageError` with tyro's message."""
    return parse_args(load_script(name).Args, list(flags))


HARNESS_SET = ("env_id", "total_timesteps", "seed", "eval_episodes", "run_dir", "exp_name")
"""fields the harness gives every run itself (exp_name names the run after its script)"""


def same_settings_flags(
    name: str, flags: tuple[str, ...] | list[str], other: str
) -> tuple[str, ...]:
    """Flags for script `other` that give it every setting it shares with script `name` run with
    `flags` (the fields of both `Args` with the same name), so that the two can be timed on equal
    terms; the result is parsed back and checked, a mismatch being a `ValueError`."""
    args, defaults = resolve_args(name, flags), resolve_args(other, [])
    shared = [field.name for field in dataclasses.fields(defaults) if hasattr(args, field.name)]
    derived: list[str] = []
    for field_name in shared:
        value, option = getattr(args, field_name), "--" + field_name.replace("_", "-")
        if field_name in HARNESS_SET or value == getattr(defaults, field_name):
            continue
        if isinstance(value, bool):
            derived.append(option if value else "--no-" + option[2:])
        else:
            derived += [option, str(value)]
    parsed = resolve_args(other, derived)
    differing = [
        field_name
        for field_name in shared
        if field_name not in HARNESS_SET
        and getattr(parsed, field_name) != getattr(args, field_name)
    ]
    if differing:
        raise ValueError(
            f"{other} could not be given the settings {', '.join(differing)} of {name} {' '.join(flags)}"
        )
    return tuple(derived)


# python -m benchmark.registry SCRIPT [FLAGS...]: the baseline's settings, as JSON
if __name__ == "__main__":
    import json

    name, *script_flags = sys.argv[1:]
    print(json.dumps(SCRIPTS[name].sb3_settings(resolve_args(name, script_flags))))

"""The standard benchmark cases of every script, and the named suites built from them.

A later script adds its rows to `CASES` and its entry to `benchmark.registry.SCRIPTS`; the harness,
the tables and the plots need nothing else."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace
from typing import Literal, NamedTuple

from benchmark.events import LAST_EPISODES, safe_name


def settings_hash(settings: object) -> str:
    """A short hash of JSON-able settings (flags, or a baseline's settings), for job ids."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:8]


@dataclass(frozen=True)
class Published:
    """A reference result published elsewhere: a deterministic evaluation return."""

    eval_return: float
    source: str


@dataclass(frozen=True)
class CleanRLPublished:
    """CleanRL's published result for its own script on a task (its Open RL Benchmark tables,
    docs/benchmark/*.md of CleanRL's repository): the mean ± std over seeds of its training episodic
    return at the end of `steps`, and the minutes a run took. A case judged against it ("published")
    passes where its mean last-100 training return over seeds reaches `mean - std`."""

    script: str
    """CleanRL's script, e.g. ppo_continuous_action.py"""
    env_id: str
    """the id CleanRL ran (MuJoCo v4 where the case runs v5)"""
    mean: float
    std: float
    minutes: float | None = None
    """its published run time per run (None: not published)"""
    tag: str = "pr-424"
    """the Open RL Benchmark tag of the runs"""

    @property
    def bound(self) -> float:
        return self.mean - self.std

    @property
    def source(self) -> str:
        return f"CleanRL's {self.script} on {self.env_id} ({self.tag})"


@dataclass(frozen=True)
class ReferenceRuns:
    """Runs of a fixed-settings baseline (`benchmark.registry.REFERENCES`) on the case's env and
    steps."""

    name: str
    seeds: tuple[int, ...]


@dataclass(frozen=True)
class Learned:
    """What counts as having learnt a task: a mean evaluation that reaches the random policy's
    return plus this share of the task's range. A case judged against it passes there, with no
    margin."""

    share: float

    @property
    def source(self) -> str:
        return f"learnt: random + {self.share:.0%} of the range"


@dataclass(frozen=True)
class SameRun:
    """Another case of the same benchmark, one of this project's scripts, run beside the case (a
    suite lists both): the case is judged against its mean evaluation, with `REFERENCE_MARGIN`,
    where that case learnt the task (`learned`); where it did not, the case gets no verdict."""

    case: Case
    learned: Learned

    @property
    def source(self) -> str:
        return f"{self.case.script} in this run, where it learnt the task ({self.learned.source})"


@dataclass(frozen=True)
class Case:
    """One (script, env, steps, flags): how long to train, which flags differ from the script's
    defaults, and when it passes. Everything else (the number of envs, the baseline's settings) is
    derived from the script's `Args`."""

    script: str
    """the script's file stem, e.g. ppo_fc"""
    env_id: str
    """the gymnasium env id"""
    total_timesteps: int
    """env steps of each run"""
    threshold: float | None = None
    """PASS when every seed's return (see `judged_on`) reaches this (None: no verdict)"""
    flags: tuple[str, ...] = ()
    """command-line flags that differ from the script's defaults"""
    judged_on: Literal["training", "reached", "eval", "reference", "published"] = "training"
    """what the threshold applies to: the mean of the last 100 training episodes at the end ("training"), that mean
    at any point within the budget ("reached": the steps-to-threshold column), or the mean of the deterministic
    evaluation after training ("eval"); "reference": the mean over seeds of that evaluation, against a threshold the
    harness derives from `reference` (`REFERENCE_MARGIN`); "published": the mean over seeds of the training return,
    against a `CleanRLPublished` reference's mean less its std"""
    compare_with: str | None = None
    """another script, run in the same benchmark on the same env and steps with every setting the two share (see
    `benchmark.registry.same_settings_flags`), whose SPS this case's is divided by"""

    reference: Published | ReferenceRuns | Learned | SameRun | CleanRLPublished | None = None
    """with judged_on "reference" or "published": what the case is judged against; runs of a reference are also
    timed against the case in the speed table"""
    task_max: float | None = None
    """the highest return the task can give: with the random policy's return (measured by the harness), its range"""
    window: int = LAST_EPISODES
    """the training return is the mean of the last this many episodes (fewer where a run holds few episodes)"""
    nproc: int = 1
    """processes under torchrun for the script's runs (1: plain python)"""
    seeds: tuple[int, ...] | None = None
    """the case's own seeds, in place of its suite's (--seeds replaces both)"""

    @property
    def key(self) -> str:
        """The case's identity in folders, logs and tables: script, env, steps, a hash of the flags,
        and the number of processes when more than one (one process adds nothing: stored runs and
        tables name the older keys)."""
        key = f"{self.script}__{safe_name(self.env_id)}__{self.total_timesteps}__{settings_hash(self.flags)}"
        return key + (f"__np{self.nproc}" if self.nproc > 1 else "")

    @property
    def name(self) -> str:
        return (
            f"{self.script} {self.env_id} {self.total_timesteps:,} steps"
            + (f" {' '.join(self.flags)}" if self.flags else "")
            + (f", {self.nproc} processes" if self.nproc > 1 else "")
        )


# The issue asks for 475 "within 500k steps": reached by then, the end's last-100 return shown
# beside it.
CARTPOLE_NOVEL_500K = Case(
    "ppo_lstm",
    "CartPoleNoVel-v1",
    500_000,
    threshold=475.0,
    judged_on="reached",
    compare_with="ppo_fc",
)

# Continuous actions: the one set of flags for every continuous task (docs/ppo_lstm.md), as CleanRL
# keeps ppo_continuous_action's settings apart from ppo's. Long rollouts of few envs cut into
# 32-step chunks, a short horizon and a critic with its own LSTM.
CONTINUOUS_FLAGS: tuple[str, ...] = (
    "--num-envs", "4", "--num-steps", "1024", "--bptt-len", "32", "--num-minibatches", "32", "--gamma", "0.9",
    "--learning-rate", "1e-3", "--no-shared-core",
)  # fmt: skip

# The RL Zoo's tuned DDPG evaluates at -152 ± 94 after 20k steps; the issue asks for -200 with the
# defaults. 20k steps hold 100 Pendulum episodes of 200 steps, the random ones included: the
# training return is the last 10's.
DDPG_PENDULUM = Case("ddpg", "Pendulum-v1", 20_000, threshold=-200.0, window=10)
# Wall-clock to solve: steps and seconds until the last-10 mean first reaches -200, beside the SB3
# baseline.
DDPG_PENDULUM_TO_SOLVE = Case(
    "ddpg", "Pendulum-v1", 50_000, threshold=-200.0, judged_on="reached", window=10
)
# MuJoCo: the issue asks for 3,000 at 100k on HalfCheetah-v5 (CleanRL's DDPG: 10,374 ± 157 on
# HalfCheetah-v4 and 1,576 ± 819 on Hopper-v4, at 1M); Hopper-v5 has no threshold, its returns are
# reported beside the baseline's.
DDPG_MUJOCO: tuple[Case, ...] = (
    Case("ddpg", "HalfCheetah-v5", 100_000, threshold=3000.0, judged_on="eval"),
    Case("ddpg", "Hopper-v5", 100_000),
)

# Thresholds sit under what the reference implementations reach (CleanRL publishes 490.04 ± 6.12 for
# ppo.py on CartPole-v1 at 500k steps), so that a PASS means the algorithm works, not that a seed
# was lucky. The 100k-step row is the quick suite's check that learning happens at all.
PPO_FC_CARTPOLE_500K = Case("ppo_fc", "CartPole-v1", 500_000, threshold=490.0)
PPO_FC_CARTPOLE_100K = Case("ppo_fc", "CartPole-v1", 100_000, threshold=150.0)
LSTM_CARTPOLE_500K = Case(
    "ppo_lstm", "CartPole-v1", 500_000, threshold=490.0, compare_with="ppo_fc"
)
CASES: tuple[Case, ...] = (
    PPO_FC_CARTPOLE_500K,
    PPO_FC_CARTPOLE_100K,
    LSTM_CARTPOLE_500K,
    CARTPOLE_NOVEL_500K,
    # Sample efficiency: RecurrentPPO with the RL Zoo's settings evaluates at 498 ± 7 after 100k
    # steps. These are the Zoo's (8 envs of 32 steps, one minibatch, 20 epochs, GAE 0.98, gamma
    # 0.999, no entropy bonus, lr 1e-3, a 64-unit LSTM and one of its own for the critic,
    # normalisation), its clip range falling linearly from 0.2 taken as 0.1.
    Case(
        "ppo_lstm", "CartPoleNoVel-v1", 100_000, threshold=475.0, judged_on="eval",
        flags=(
            "--num-steps", "32", "--num-minibatches", "1", "--update-epochs", "20", "--gae-lambda", "0.98",
            "--gamma", "0.999", "--learning-rate", "1e-3", "--rnn-hidden-size", "64", "--no-shared-core",
        ),
    ),
    # RecurrentPPO's published figure, as issue 11 quotes it, is -218 ± 140: a PASS beats it on
    # every seed.
    Case("ppo_lstm", "PendulumNoVel-v1", 500_000, threshold=-218.0, flags=CONTINUOUS_FLAGS),
    DDPG_PENDULUM,
    DDPG_PENDULUM_TO_SOLVE,
    *DDPG_MUJOCO,
    # ppo_transformer.py: the bars with the defaults, its SPS against ppo_fc.py's with the
    # same rollout.
    Case("ppo_transformer", "CartPole-v1", 500_000, threshold=490.0, compare_with="ppo_fc"),
    Case("ppo_transformer", "CartPoleNoVel-v1", 500_000, threshold=475.0, judged_on="reached"),
)  # fmt: skip


# Variants of a row that only a suite runs: a lookup by script, env and steps gives the row itself.
BPTT_VARIANTS: tuple[Case, ...] = tuple(
    replace(CARTPOLE_NOVEL_500K, flags=("--bptt-len", str(length)), compare_with=None)
    for length in (32, 8)
)

# ddpg.py's --num-envs: each vector step brings num_envs transitions and as many updates
# (docs/ddpg.md).
DDPG_NUM_ENVS_VARIANTS: tuple[Case, ...] = tuple(
    replace(DDPG_PENDULUM, flags=("--num-envs", str(num_envs))) for num_envs in (4, 8)
)

# The memory suite: tasks no default was tuned on, each judged on its deterministic evaluation
# against a reference (`REFERENCE_MARGIN`). No case has flags of its own: discrete actions run with
# the script's defaults, continuous actions with CONTINUOUS_FLAGS, the same for both continuous
# tasks.
RECURRENT_PPO_RUNS = ReferenceRuns("sb3_recurrent_ppo_reference", seeds=(1, 2))


def memory_case(env_id: str, total_timesteps: int, task_max: float, reference: Published | ReferenceRuns,
                flags: tuple[str, ...] = ()) -> Case:  # fmt: skip
    return Case(
        "ppo_lstm", env_id, total_timesteps, flags=flags, judged_on="reference", reference=reference, task_max=task_max,
    )  # fmt: skip


# Maxima: CartPole pays 1 a step for at most 500 steps; Pendulum's reward is at most 0; popgym
# scales every task's episode return into [-1, 1] (its pendulum's into [0, 1]); MiniGrid pays at
# most 1, at the goal.
MEMORY_CASES: tuple[Case, ...] = (
    memory_case(
        "CartPoleNoVel-v1",
        500_000,
        500.0,
        Published(498.0, "the RL Zoo's RecurrentPPO, 498 ± 7 at 100k"),
    ),
    memory_case("popgym-RepeatFirstEasy-v0", 300_000, 1.0, RECURRENT_PPO_RUNS),
    memory_case("popgym-CountRecallEasy-v0", 300_000, 1.0, RECURRENT_PPO_RUNS),
    memory_case("popgym-PositionOnlyCartPoleEasy-v0", 300_000, 1.0, RECURRENT_PPO_RUNS),
    memory_case("MiniGrid-MemoryS7-v0", 500_000, 1.0, replace(RECURRENT_PPO_RUNS, seeds=(1,))),
    memory_case(
        "PendulumNoVel-v1",
        500_000,
        0.0,
        Published(-218.0, "RecurrentPPO, -218 ± 140 (issue 11)"),
        CONTINUOUS_FLAGS,
    ),
    memory_case(
        "popgym-PositionOnlyPendulumEasy-v0", 300_000, 1.0, RECURRENT_PPO_RUNS, CONTINUOUS_FLAGS
    ),
)

# ppo_transformer.py's continuous set (docs/ppo_transformer.md): ppo_lstm's rollout shape and
# horizon; its minibatches are whole env rollouts, one env each.
TRANSFORMER_CONTINUOUS_FLAGS: tuple[str, ...] = (
    "--num-envs", "4", "--num-steps", "1024", "--num-minibatches", "4", "--gamma", "0.9",
)  # fmt: skip
CONTINUOUS_FLAGS_OF = {
    "ppo_lstm": CONTINUOUS_FLAGS,
    "ppo_transformer": TRANSFORMER_CONTINUOUS_FLAGS,
}
"""each memory script's one set of flags for continuous actions"""
# The memory suite's tasks for ppo_transformer.py, judged against the same references.
TRANSFORMER_MEMORY_CASES: tuple[Case, ...] = tuple(
    replace(
        case,
        script="ppo_transformer",
        flags=TRANSFORMER_CONTINUOUS_FLAGS if case.flags == CONTINUOUS_FLAGS else case.flags,
    )
    for case in MEMORY_CASES
)

# The same without --prev-action-reward: ppo_lstm has no such input (docs/ppo_transformer.md).
TRANSFORMER_MEMORY_CASES_WITHOUT_PREVIOUS: tuple[Case, ...] = tuple(
    replace(case, flags=(*case.flags, "--no-prev-action-reward"))
    for case in TRANSFORMER_MEMORY_CASES
)

# The memory-length study (docs/ppo_transformer.md): RepeatCue-v0 (probe_envs) shows a cue at its
# first step and pays for repeating it at each of 128 steps, so its last steps need the cue 127
# steps back, beyond ppo_transformer's default receptive field L(K-1) = 62. Without
# --prev-action-reward the transformer can only see the cue within that field; with it, repeating
# the last rewarded action carries the cue along; a window of 128 (field 254) reaches the whole
# episode. ppo_lstm has no such input. A run passes when its evaluation shows the cue remembered to
# the end (0.9 or more; a memory that stops at step m scores about (m + 1) / 128).
MEMORY_LENGTH_ENV = "RepeatCue-v0"
MEMORY_LENGTH_CASES: tuple[Case, ...] = tuple(
    Case(script, MEMORY_LENGTH_ENV, 300_000, threshold=0.9, flags=flags, judged_on="eval")
    for script, flags in (
        ("ppo_lstm", ()),
        ("ppo_transformer", ("--no-prev-action-reward",)),
        ("ppo_transformer", ("--no-prev-action-reward", "--context-len", "128")),
        ("ppo_transformer", ()),
    )
)

# The SPS ratio of ppo_lstm's defaults to the reference, from one short run of both on two popgym
# tasks: the memory suite's seconds of stored reference runs come from another session. The defaults
# before the memory suite run beside them, for the new defaults' cost in SPS. Run with --workers 1.
DEFAULTS_BEFORE_MEMORY_SUITE: tuple[str, ...] = (
    "--update-epochs", "4", "--num-minibatches", "4", "--learning-rate", "2.5e-4",
)  # fmt: skip
MEMORY_SPEED_CASES: tuple[Case, ...] = tuple(
    Case("ppo_lstm", env_id, 50_000, flags=flags, reference=replace(RECURRENT_PPO_RUNS, seeds=(1,)))
    for env_id in ("popgym-RepeatFirstEasy-v0", "popgym-CountRecallEasy-v0")
    for flags in ((), DEFAULTS_BEFORE_MEMORY_SUITE)
)


# The breadth suite (docs/ppo_lstm.md, docs/ppo_transformer.md): every popgym Easy task, ppo_lstm
# and ppo_transformer side by side with their defaults (continuous tasks: each script's continuous
# set). ppo_lstm learns a task when it evaluates above random play plus 20% of the range; wherever
# it does, the transformer must come within REFERENCE_MARGIN of the range of it. popgym scales every
# return into [-1, 1] (its pendulums' into [0, 1]).
POPGYM_EASY_TASKS: tuple[str, ...] = (
    "Autoencode", "Battleship", "Concentration", "CountRecall", "HigherLower", "MineSweeper", "MultiarmedBandit",
    "NoisyPositionOnlyCartPole", "NoisyPositionOnlyPendulum", "PositionOnlyCartPole", "PositionOnlyPendulum",
    "RepeatFirst", "RepeatPrevious", "VelocityOnlyCartpole",
)  # fmt: skip
POPGYM_EASY_IDS: tuple[str, ...] = tuple(f"popgym-{task}Easy-v0" for task in POPGYM_EASY_TASKS)
POPGYM_CONTINUOUS = frozenset(
    {"popgym-PositionOnlyPendulumEasy-v0", "popgym-NoisyPositionOnlyPendulumEasy-v0"}
)
LSTM_LEARNED = Learned(0.2)


def breadth_cases(env_id: str, total_timesteps: int = 300_000) -> tuple[Case, Case]:
    """ppo_lstm's case on `env_id` (judged on having learnt it) and ppo_transformer's, judged
    against it."""

    def case(script: str, reference: Learned | SameRun) -> Case:
        flags = CONTINUOUS_FLAGS_OF[script] if env_id in POPGYM_CONTINUOUS else ()
        return Case(
            script,
            env_id,
            total_timesteps,
            flags=flags,
            judged_on="reference",
            reference=reference,
            task_max=1.0,
        )

    lstm = case("ppo_lstm", LSTM_LEARNED)
    return lstm, case("ppo_transformer", SameRun(lstm, LSTM_LEARNED))


BREADTH_CASES: tuple[Case, ...] = tuple(
    case for env_id in POPGYM_EASY_IDS for case in breadth_cases(env_id)
)


# ppo_lstm's advantage normalisation on the mission's own command (CartPole-v1, 500k): 490 or more
# on 8 of 8 seeds with the defaults, and without --norm-adv (the transformer's default), alone:
# ppo_fc's SPS is not asked for.
LSTM_CARTPOLE_NORM_ADV: tuple[Case, ...] = tuple(
    replace(LSTM_CARTPOLE_500K, flags=flags, compare_with=None)
    for flags in ((), ("--no-norm-adv",))
)


# ppo_lstm without --norm-adv on the two suites (the defaults' verdicts are their own suites'): the
# memory suite against its references, and the breadth suite's ppo_lstm cases, each judged on having
# learnt its task.
LSTM_MEMORY_WITHOUT_NORM_ADV: tuple[Case, ...] = tuple(
    replace(case, flags=(*case.flags, "--no-norm-adv")) for case in MEMORY_CASES
)
LSTM_BREADTH_WITHOUT_NORM_ADV: tuple[Case, ...] = tuple(
    replace(case, flags=(*case.flags, "--no-norm-adv"))
    for case in BREADTH_CASES
    if case.script == "ppo_lstm"
)


# Data parallelism under torchrun (docs/distributed.md): a case in one process, in two with the same
# settings per rank (twice the envs, so twice the global batch), and in two with the same global
# batch (half the envs each: ppo_fc's default is 4). The one-process variant is the case itself, its
# key that of its row.
def distributed_variants(case: Case) -> tuple[Case, ...]:
    return (
        case,
        replace(case, nproc=2),
        replace(case, nproc=2, flags=(*case.flags, "--num-envs", "2")),
    )


# The comparison of learning, every variant judged on the 500k row's threshold (490 on
# training).
DISTRIBUTED_CASES: tuple[Case, ...] = distributed_variants(PPO_FC_CARTPOLE_500K)
# SPS only, in shorter runs: a discrete task with a cheap env, and a continuous one with a costlier
# (MuJoCo) env.
DISTRIBUTED_SPEED_CASES: tuple[Case, ...] = (
    *distributed_variants(PPO_FC_CARTPOLE_100K),
    *distributed_variants(Case("ppo_fc", "Hopper-v5", 100_000)),
)

# Atari: CleanRL's Atari settings (ppo_atari.py's and ppo_atari_lstm.py's; 8 envs of 128 steps,
# learning rate 2.5e-4, clip 0.1), each beside its SB3 counterpart on SB3's AtariWrapper. 100k agent
# steps (400k frames) is the Atari 100k budget; at CleanRL's 10M a run takes about 9 hours on this
# 2-core machine (docs/ppo_fc.md "Images and Atari").
ATARI_GAMES = ("BreakoutNoFrameskip-v4", "SpaceInvadersNoFrameskip-v4")
ATARI_FLAGS = {
    "ppo_fc": ("--num-envs", "8", "--clip-coef", "0.1"),
    "ppo_lstm": (
        "--num-envs", "8", "--learning-rate", "2.5e-4", "--clip-coef", "0.1", "--num-minibatches", "4",
        "--update-epochs", "4", "--ent-coef", "0.01", "--clip-vloss", "--no-norm-reward",
    ),
}  # fmt: skip
ATARI_CASES: tuple[Case, ...] = tuple(
    Case(script, game, 100_000, flags=flags)
    for game in ATARI_GAMES
    for script, flags in ATARI_FLAGS.items()
)
# ppo_transformer.py with ppo_atari_lstm.py's settings (its own --no-norm-adv and --target-kl 0.02
# set back to CleanRL's), beside ppo_lstm.py with the same, on Breakout.
TRANSFORMER_ATARI = Case(
    "ppo_transformer", ATARI_GAMES[0], 100_000, flags=(*ATARI_FLAGS["ppo_lstm"], "--norm-adv", "--target-kl", "None"),
    compare_with="ppo_lstm",
)  # fmt: skip

# The published suites (docs/benchmark.md, "The MuJoCo and dm_control suite"): CleanRL's Open RL
# Benchmark at 1M steps, tag pr-424, on MuJoCo v4 (CleanRL's docs/benchmark/ppo_continuous_action.md,
# ppo_continuous_action_runtimes.md and ddpg.md); the cases run v5, the MuJoCo version gymnasium 1.x
# ships. ppo_fc runs with the README's continuous line, CleanRL's ppo_continuous_action.py settings.
PPO_CONTINUOUS_FLAGS: tuple[str, ...] = (
    "--num-envs", "1", "--num-steps", "2048", "--num-minibatches", "32", "--update-epochs", "10",
    "--learning-rate", "3e-4", "--ent-coef", "0", "--norm-obs", "--norm-reward",
)  # fmt: skip
CLEANRL_PPO_CONTINUOUS: dict[str, tuple[float, float, float]] = {
    "HalfCheetah-v4": (1442.64, 46.03, 25.3589),
    "Walker2d-v4": (2287.95, 571.78, 24.3157),
    "Hopper-v4": (2382.86, 271.74, 25.7066),
    "InvertedPendulum-v4": (963.09, 22.20, 23.7672),
    "Humanoid-v4": (716.11, 49.08, 49.5592),
    "Pusher-v4": (-40.38, 7.15, 28.8162),
    "dm_control/acrobot-swingup-v0": (25.60, 6.30, 26.5793),
    "dm_control/acrobot-swingup_sparse-v0": (1.35, 0.27, 25.1265),
    "dm_control/ball_in_cup-catch-v0": (619.26, 278.67, 26.1947),
}
"""CleanRL's ppo_continuous_action.py at 1M steps: mean, std, minutes per run"""
CLEANRL_DDPG: dict[str, tuple[float, float]] = {
    "HalfCheetah-v4": (10374.07, 157.37),
    "Walker2d-v4": (1240.16, 390.10),
    "Hopper-v4": (1576.78, 818.98),
    "InvertedPendulum-v4": (642.68, 69.56),
    "Humanoid-v4": (1699.56, 694.22),
    "Pusher-v4": (-77.30, 38.78),
}
"""CleanRL's ddpg_continuous_action.py at 1M steps: mean, std (no run times published)"""


def v5(env_id: str) -> str:
    """The id a case runs for CleanRL's: MuJoCo's v5 in place of v4; dm_control ids as they are."""
    return env_id.removesuffix("-v4") + "-v5" if env_id.endswith("-v4") else env_id


def published_case(script: str, env_id: str, published: CleanRLPublished, **kwargs) -> Case:
    return Case(script, v5(env_id), 1_000_000, judged_on="published", reference=published, **kwargs)


MUJOCO_PPO_CASES: tuple[Case, ...] = tuple(
    published_case(
        "ppo_fc",
        env_id,
        CleanRLPublished("ppo_continuous_action.py", env_id, mean, std, minutes),
        flags=PPO_CONTINUOUS_FLAGS,
        seeds=(1, 2, 3),
    )
    for env_id, (mean, std, minutes) in CLEANRL_PPO_CONTINUOUS.items()
)
DDPG_TASKS_AT_1M = ("HalfCheetah-v4", "Hopper-v4", "Walker2d-v4", "InvertedPendulum-v4")
# Hours a run here: its checkpoints by wall-clock keep the buffer too, so that even a killed
# machine's run goes on exactly (a stop signal's checkpoint keeps it anyway).
DDPG_SUITE_FLAGS = ("--save-buffer",)
MUJOCO_DDPG_CASES: tuple[Case, ...] = (
    *(
        published_case(
            "ddpg",
            env_id,
            CleanRLPublished("ddpg_continuous_action.py", env_id, *CLEANRL_DDPG[env_id]),
            flags=DDPG_SUITE_FLAGS,
            # three seeds where seed 1 fell short of the table; the machine's time did not allow more
            # than one on the others (docs/benchmark.md)
            seeds=(1, 2, 3) if env_id == "HalfCheetah-v4" else (1,),
        )
        for env_id in DDPG_TASKS_AT_1M
    ),
    # the spread of seeds, in a third of the budget: no published figure to judge against
    *(
        Case("ddpg", v5(env_id), 300_000, flags=DDPG_SUITE_FLAGS, seeds=(1, 2, 3))
        for env_id in DDPG_TASKS_AT_1M[:2]
    ),
)

REFERENCE_MARGIN = 0.05
"""a "reference" case passes when its mean evaluation reaches the reference's less this share of the
task's range (maximum less the random policy's return)"""
SPEED_THRESHOLD = 0.8
"""the speed comparison's threshold: the random return plus this share of the way to the reference's
evaluation, on the last-100 training mean"""


class Suite(NamedTuple):
    """A named set of cases (script, env id, steps: a row of CASES; or a Case itself) and the seeds
    to run each with. Five seeds or more give the IQM and its confidence interval."""

    cases: tuple[tuple[str, str, int] | Case, ...]
    seeds: tuple[int, ...]
    eval_episodes: int = 10
    """deterministic evaluation episodes after each run, unless the command line sets them"""
    baseline_seeds: tuple[int, ...] | None = None
    """the seeds of the Stable-Baselines3 baselines with --baselines, unless --seeds is given (default: `seeds`)"""


SUITES: dict[str, Suite] = {
    "quick": Suite((("ppo_fc", "CartPole-v1", 100_000),), (1, 2)),  # a few minutes on 2 cores
    # the numbers in the README
    "full": Suite((("ppo_fc", "CartPole-v1", 500_000),), (1, 2, 3, 4, 5)),
    "recurrent": Suite(  # ppo_lstm's numbers in the README
        (
            ("ppo_lstm", "CartPole-v1", 500_000),
            ("ppo_lstm", "CartPoleNoVel-v1", 500_000),
            ("ppo_lstm", "CartPoleNoVel-v1", 100_000),
            ("ppo_lstm", "PendulumNoVel-v1", 500_000),
        ),
        (1, 2, 3),
    ),
    # ppo_lstm's --bptt-len lengths (whole rollouts, 32, 8) in the README; run with --workers 1 for
    # their SPS.
    "bptt": Suite((("ppo_lstm", "CartPoleNoVel-v1", 500_000), *BPTT_VARIANTS), (1, 2, 3)),
    # ppo_fc.py and ppo_lstm.py on two Atari games, beside SB3 with --baselines (docs/ppo_fc.md,
    # docs/ppo_lstm.md); whole games are too long to evaluate deterministically (a policy that never
    # fires plays on): training returns
    "atari": Suite(ATARI_CASES, (1, 2, 3), eval_episodes=0),
    "atari-transformer": Suite((TRANSFORMER_ATARI,), (1, 2, 3), eval_episodes=0),
    "ddpg": Suite((DDPG_PENDULUM,), (1, 2, 3)),  # ddpg.py on Pendulum-v1 (docs/ddpg.md)
    # with --baselines: ddpg.py's wall-clock to solve Pendulum-v1 against SB3's TD3 as DDPG, in the
    # same run ddpg.py with 1, 4 and 8 envs on Pendulum-v1; run with --workers 1 for their SPS.
    "ddpg-envs": Suite((DDPG_PENDULUM, *DDPG_NUM_ENVS_VARIANTS), (1, 2, 3)),
    "ddpg-time": Suite((DDPG_PENDULUM_TO_SOLVE,), (1, 2, 3)),
    # with --baselines: 2 seeds of ddpg.py and 1 of the baseline on each MuJoCo task (the [mujoco]
    # extra)
    "ddpg-mujoco": Suite(DDPG_MUJOCO, (1, 2), baseline_seeds=(1,)),
    # ppo_lstm's defaults on memory tasks, against sb3-contrib's RecurrentPPO (docs/ppo_lstm.md).
    "memory": Suite(MEMORY_CASES, (1, 2, 3), eval_episodes=20),
    "memory-speed": Suite(MEMORY_SPEED_CASES, (1,), eval_episodes=0),
    # ppo_transformer.py's defaults on the memory suite's tasks, against the same references
    # (docs/ppo_transformer.md)
    "memory-transformer": Suite(TRANSFORMER_MEMORY_CASES, (1, 2, 3), eval_episodes=20),
    "memory-transformer-no-par": Suite(
        TRANSFORMER_MEMORY_CASES_WITHOUT_PREVIOUS, (1, 2, 3), eval_episodes=20
    ),
    # ppo_transformer.py on CartPole-v1 (beside ppo_fc.py, for SPS) and CartPoleNoVel-v1
    "transformer": Suite(
        (
            ("ppo_transformer", "CartPole-v1", 500_000),
            ("ppo_transformer", "CartPoleNoVel-v1", 500_000),
        ),
        (1, 2, 3),
    ),
    # a cue beyond ppo_transformer.py's receptive field, with and without --prev-action-reward,
    # beside ppo_lstm.py
    "memory-length": Suite(MEMORY_LENGTH_CASES, (1, 2), eval_episodes=20),
    # ppo_lstm.py on CartPole-v1 at 500k with and without --norm-adv, 10 seeds (docs/ppo_lstm.md)
    "lstm-norm-adv": Suite(LSTM_CARTPOLE_NORM_ADV, tuple(range(1, 11)), eval_episodes=10),
    # ppo_lstm.py without --norm-adv on the memory suite and on the breadth suite's ppo_lstm cases
    "memory-lstm-no-norm-adv": Suite(LSTM_MEMORY_WITHOUT_NORM_ADV, (1, 2, 3), eval_episodes=20),
    "popgym-easy-lstm-no-norm-adv": Suite(LSTM_BREADTH_WITHOUT_NORM_ADV, (1, 2), eval_episodes=20),
    # every popgym Easy task, ppo_lstm.py and ppo_transformer.py side by side (the breadth suite)
    "popgym-easy": Suite(BREADTH_CASES, (1, 2), eval_episodes=20),
    # ppo_fc.py in one and two processes under torchrun (docs/distributed.md); run with --workers 1
    # for their SPS.
    "distributed": Suite(DISTRIBUTED_CASES, (1, 2, 3)),
    "distributed-speed": Suite(DISTRIBUTED_SPEED_CASES, (1,), eval_episodes=0),
    # ppo_fc.py and ddpg.py against CleanRL's published MuJoCo and dm_control table at 1M steps (the
    # [mujoco] and [dmc] extras); each case has its seeds. Days on a CPU: give it --out and run the
    # same command again after a stop (docs/benchmark.md).
    "mujoco": Suite((*MUJOCO_PPO_CASES, *MUJOCO_DDPG_CASES), (1,)),
    # resident memory at 100k and 1M steps of the two scripts the mujoco suite does not run, with
    # their defaults (`python -m benchmark.rss_growth`, docs/benchmark.md)
    "rss-growth": Suite(
        tuple(Case(script, "CartPole-v1", 1_000_000) for script in ("ppo_lstm", "ppo_transformer")),
        (1,),
        eval_episodes=0,
    ),
}

# Steps of a (script, env) pair that has no row in CASES.
DEFAULT_TIMESTEPS = 100_000


def find_case(script: str, env_id: str, total_timesteps: int | None = None) -> Case:
    """The row of CASES for `script` on `env_id` with `total_timesteps` steps (the longest row when
    not given).

    Another length keeps the row's flags and comparison but has no threshold (one set for 500k steps
    means nothing at 50k); a pair with no row runs with the script's defaults and no threshold."""
    rows = sorted(
        (case for case in CASES if case.script == script and case.env_id == env_id),
        key=lambda case: case.total_timesteps,
    )
    for case in rows:
        if case.total_timesteps == total_timesteps:
            return case
    if not rows:
        return Case(script, env_id, total_timesteps or DEFAULT_TIMESTEPS)
    longest = rows[-1]
    if total_timesteps is None:
        return longest
    return replace(longest, total_timesteps=total_timesteps, threshold=None)


def suite_cases(name: str) -> list[Case]:
    """The cases of the suite `name`, in its order."""
    return [entry if isinstance(entry, Case) else find_case(*entry) for entry in SUITES[name][0]]

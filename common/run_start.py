"""What every script's `train()` sets up around its algorithm: a `Run`, made first (checks,
torchrun, the checkpoint --resume continues or --eval-checkpoint evaluates, seeds, device, the env's
spaces), then started once the agent and optimizer are built (`Run.start`: run folder, writer, envs
and their first observations, trajectory recorder, log, stop signals). It also writes checkpoints, averages
over torchrun's processes, evaluates and ends the run."""

from __future__ import annotations

import dataclasses
import shutil
import signal
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import gymnasium as gym
import numpy as np
import torch
from torch.distributions import Distribution
from torch.utils.tensorboard import SummaryWriter

from common import checkpoints, distributed, env_state, evaluation, resume_check
from common.checkpoints import resume_folder
from common.cli import notice
from common.envs import checked_spaces, training_envs
from common.errors import UsageError, check_finite
from common.interrupt import GracefulInterrupt
from common.run_folder import create_run_folder, run_name
from common.seeding import seed_and_pick_device, threads_for
from common.tracking import TrainingLog, start_tracking, wandb_history
from common.train_result import TrainResult
from common.trajectories import RolloutRecorder, check_destination

__all__ = ["Run", "TrainResult"]

Config = TypeVar("Config")

RUN_KEYS = ("iteration", "reward_rms", "episodes", "trajectories", "wandb", "evaluation")
RUN_KEYS += ("finished",)  # the run's episodes over its sessions, for its summary line
"""What `Run.save` adds to a checkpoint beside the script's `saved`: keys `saved` may not use"""


def usage_errors(check_args: Callable[[Config], None]) -> Callable[[Config], None]:
    """`check_args`, whose ValueError raised in its own body (a script's own checks) is a UsageError:
    bad input. One from deeper down is a bug, and keeps its traceback."""

    def checked(args: Config) -> None:
        try:
            check_args(args)
        except ValueError as exc:
            frame = exc.__traceback__
            while frame.tb_next is not None:
                frame = frame.tb_next
            if frame.tb_frame.f_code is not check_args.__code__:
                raise
            raise UsageError(str(exc)) from None

    return checked


def _setup(
    args: Config, check_args: Callable[[Config], None], kept: tuple[str, ...]
) -> tuple[Config, dict | None, torch.device]:
    """Before the network is built: `check_args(args)`, joining torchrun's processes
    (docs/distributed.md), the checkpoint --resume continues, whose settings replace `args` but for
    the run-time flags and `kept`, then the seeds (each rank its own: rank 0's parameters are
    broadcast, its sampling noise and minibatches are its own) and the device. Returns the run's
    settings, the checkpoint (None for a new run) and the device."""
    distributed.launched_size()  # a WORLD_SIZE that is not a number, before check_args reads it
    # a resumed run's budget is checked with its checkpoint's settings (its batch size, say)
    default_budget = {checkpoints.BUDGET: getattr(type(args)(), checkpoints.BUDGET)}
    check_args(dataclasses.replace(args, **default_budget) if args.resume else args)
    distributed.setup(getattr(args, "dist_backend", None), args.cuda)
    args = checkpoints.auto_resume(args)
    kept = (*checkpoints.RUN_TIME_FLAGS, *kept)
    args, checkpoint = checkpoints.load_with_settings(
        args.resume, args, check_args, kept, strict=True, required=("episodes",)
    )
    if checkpoint is None:  # --resume auto's new run
        check_args(args)
    seed = distributed.rank_seed(args.seed)
    device = seed_and_pick_device(seed, args.torch_deterministic, args.torch_threads, args.cuda)
    return args, checkpoint, device


def _setup_evaluation(
    args: Config, check_args: Callable[[Config], None], kept: tuple[str, ...]
) -> tuple[Config, dict, torch.device]:
    """For --eval-checkpoint: the checkpoint, its run's settings with the evaluation flags of `args`
    on top (both checked by `check_args`), and the device, after seeding with --seed."""
    check_args(args)
    path, kept = args.eval_checkpoint, (*checkpoints.EVALUATION_FLAGS, *kept)
    trained, checkpoint = checkpoints.load_with_settings(path, args, check_args, kept, strict=False)
    device = seed_and_pick_device(
        trained.seed, trained.torch_deterministic, trained.torch_threads, trained.cuda
    )
    return trained, checkpoint, device


class Run:
    """A training run (or, with --eval-checkpoint, the evaluation of a checkpoint), made before the
    network: `args` checked by the script's `check_args` (whose ValueError is bad input), torchrun's
    processes joined, the checkpoint read (--resume: its settings replace `args` but for the run-time
    flags and `kept`; --eval-checkpoint: its run's settings with the evaluation flags on top), the
    seeds set, the `device` picked, and the env's `observation_space` and `action_space` checked
    (an action space of the `actions` types). `args` is then the run's settings; `env_kwargs(args)`,
    where given, are keyword arguments of `make_env` that come from them.

    `start` goes on once the agent and optimizer are built: their state from the checkpoint, rank
    0's parameters on every rank, the torch threads for the network, the run's folder and
    TensorBoard writer, the training envs (`common.envs.training_envs`) and their observation
    (`next_obs`: the one they start from, `common.env_state.start`, built last since a resumed run's
    generators are restored there; then the last `step`'s), the trajectory recorder, and the log with
    its progress bar. What a resumed run's loop carried from step to step is in `carried`.

    A context manager for the training loop: Ctrl-C or a scheduler's stop signal inside it asks the
    loop to stop after its iteration (see `iteration_done`) with a checkpoint, and leaving it closes
    the envs and the progress bar; after a signal, leaving it raises `common.interrupt.Interrupted`
    (exit status 128 + the signal's number: 130 for Ctrl-C, 143 for SIGTERM), so that nothing after
    the block runs: no evaluation of a half-trained agent."""

    path: Path
    writer: SummaryWriter | None
    global_step: int
    iterations_done: int
    training_ended: bool = False
    """--resume auto found the run's training ended (its loop runs no iteration)"""
    evaluation: list[float] | None = None
    """and the run evaluated: the returns of that evaluation (its last checkpoint holds them),
    played no more"""

    def __init__(
        self,
        args: Any,
        script: str,
        make_env: Callable[..., Callable],
        check_args: Callable[[Any], None],
        kept: tuple[str, ...] = (),
        actions: tuple[type[gym.Space], ...] = (gym.spaces.Discrete, gym.spaces.Box),
        env_kwargs: Callable[[Any], dict[str, Any]] | None = None,
    ):
        self.script = script
        check_args = usage_errors(check_args)
        self.flags = args  # the command line's
        setup = _setup_evaluation if getattr(args, "eval_checkpoint", None) else _setup
        self.args, self.checkpoint, self.device = setup(args, check_args, kept)
        # what make_env takes from the run's settings (ppo_transformer's --prev-action-reward)
        self.make_env = partial(make_env, **env_kwargs(self.args)) if env_kwargs else make_env
        self.observation_space, self.action_space = checked_spaces(
            self.make_env, self.args, actions
        )
        self.world_size = distributed.world_size()
        self.start_step = self.global_step = (
            int(self.checkpoint["global_step"]) if self.checkpoint else 0
        )
        self.writer = None

    def start(
        self, saved: dict[str, Any], batch_size: int, write: Callable[[int], Path] | None = None
    ) -> Any:
        """Start training; returns the envs' first observation. `saved` maps checkpoint keys to
        what the script's checkpoints carry (modules, optimizers, arrays; see `save`), restored
        from the checkpoint --resume continues; `batch_size` counts every rank's steps of an
        iteration. `write`, when given, writes a checkpoint in place of `save` (ddpg's, with its
        replay buffer's file)."""
        reserved = set(saved) & {
            *RUN_KEYS,
            "script",
            "format",
            "args",
            "global_step",
            "rng",
            "ranks",
        }
        if reserved:
            raise ValueError(
                f"checkpoint keys of the run itself cannot be saved: {sorted(reserved)}"
            )
        checkpoints.restore(self.checkpoint, saved)
        networks = [value for value in saved.values() if isinstance(value, torch.nn.Module)]
        for network in networks:
            distributed.broadcast_module(network)  # every rank starts from rank 0's parameters
        threads_for(self.args.torch_threads, *networks)  # no --torch-threads: by the network
        args, checkpoint = self.args, self.checkpoint
        self.saved = saved
        video_folder = self._open_folder(args, checkpoint, batch_size)
        self.envs, self.reward_normalizer = training_envs(
            self.make_env, args, str(video_folder), checkpoint
        )
        self.combine_return_stats = distributed.CombinedReturnStats(self.reward_normalizer)
        first_seed = args.seed + self.global_step
        self.next_obs, self.carried = env_state.start(self.envs, checkpoint, first_seed)
        self.recorder = RolloutRecorder(
            args, args.num_envs, checkpoint, self.carried, self.reward_normalizer
        )
        total_steps = args.total_timesteps // batch_size * batch_size
        self.log = TrainingLog(self.writer, args, video_folder, total_steps, self.global_step)
        self.interrupt = GracefulInterrupt()
        self.saving = checkpoints.CheckpointSchedule(
            write or self._write, args, self.iterations_done
        )
        if self.training_ended:
            self.saving.path = Path(args.resume)  # its last checkpoint
        self.stopped = False
        self._loop_state: tuple[int, int, dict[str, Any]] = (
            self.iterations_done,
            self.global_step,
            {},
        )
        return self.next_obs

    def carry(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """`arrays`, what the loop carries from step to step (updated in place), filled with what a
        resumed run's loop carried where its envs go on with their episodes; returned, to pass to
        `iteration_done` and `save`."""
        for key, array in arrays.items():
            if key in self.carried:
                array[...] = self.carried[key]
        return arrays

    def _open_folder(self, args: Any, checkpoint: dict | None, batch_size: int) -> Path:
        """The run's folder and writer (`path`, `writer`: None on every rank but 0 under torchrun)
        and its `iterations_done` at `global_step` (`__init__`'s: 0, or the checkpoint's, whose
        TensorBoard curves go on from the step after it). Returns the video
        folder: a resumed run's is a folder of its own, so that file names never clash.
        `batch_size` counts every rank's steps."""
        # before the run folder: bad input leaves nothing written
        check_destination(args.save_trajectories)
        num_iterations = args.total_timesteps // batch_size
        if args.total_timesteps % batch_size:
            rounded = num_iterations * batch_size
            notice(f"--total-timesteps is rounded down to whole batches of {batch_size}: {rounded}")
        main = distributed.is_main()
        if checkpoint is None:
            self.iterations_done = 0
            name = args.run_name or run_name(args.env_id, args.exp_name, args.seed)
            if (
                self.flags.resume == "auto"
            ):  # its folder, made by an attempt killed before a checkpoint
                self.path = Path(args.run_dir) / name
                again = distributed.broadcast_object(self.path.is_dir() if main else None)
                if main:
                    self.path.mkdir(parents=True, exist_ok=True)
                    # an earlier attempt's curves are dropped, its wandb run goes on (see WandbHistory)
                    self.writer = start_tracking(self.path, args, purge_step=1 if again else None)
                return self.path / "videos" / "from_step_0" if again else self.path / "videos"
            self.path = distributed.broadcast_object(
                create_run_folder(args.run_dir, name) if main else None
            )
            try:
                self.writer = start_tracking(self.path, args) if main else None
            except UsageError:  # --track could not start: the new folder holds nothing else yet
                shutil.rmtree(self.path)
                raise
            return self.path / "videos"
        self.path = resume_folder(args.resume)
        # In this run's batches: a checkpoint of another number of processes made iterations of
        # another size.
        self.iterations_done = self.global_step // batch_size
        if self.global_step % batch_size:
            notice(
                f"the checkpoint's step {self.global_step} is not a whole number of this run's "
                f"batches of {batch_size}"
            )
        if self.iterations_done >= num_iterations:
            if self.flags.resume != "auto":
                raise UsageError(
                    f"{args.resume!r} is the end of its run, at step {self.global_step}: to train it on, "
                    "give a larger --total-timesteps; to evaluate it, see --eval-checkpoint"
                )
            # The same command again (a requeued job, a restart, a benchmark killed before it
            # stored the run): no step is trained, and the run is evaluated once.
            self.training_ended, self.evaluation = True, checkpoint.get("evaluation")
            if self.evaluation is not None:
                notice(f"the run {self.path} has ended: nothing is left to do")
                self.writer = None  # nothing to log
                return self.path / "videos" / f"from_step_{self.global_step}"
            notice(
                f"the run {self.path} ended its training, not its evaluation: it is evaluated now"
            )
        purge_step, tail = self.global_step + 1, checkpoint.get("wandb")
        self.writer = start_tracking(self.path, args, purge_step, tail) if main else None
        return self.path / "videos" / f"from_step_{self.global_step}"

    def step(self, action, next_obs, reward, terminated, truncated, infos, global_step) -> None:
        """After each `envs.step`, with its `action` and what it returned: the transition (from the
        env's observation before it, kept in `next_obs`) to the recorder, finished episodes to the
        log."""
        self.recorder.step(self.next_obs, action, reward, terminated, truncated, infos)
        self.log.episodes.record(infos, global_step)
        self.next_obs = next_obs

    def end_rollout(self, **fields: Any) -> None:
        """After each rollout: the policy's `fields` of its steps to the recorder (see
        `RolloutRecorder.end_rollout`); the update starts (`perf/update_seconds` counts from here)."""
        self.recorder.end_rollout(**fields)
        self.log.rollout_done()

    def save(
        self, iteration: int, global_step: int, saved: dict[str, Any], **carried: np.ndarray
    ) -> Path:
        """Write a checkpoint: the state of each of `saved` (key -> module or optimizer, as
        `checkpoints.restore` reads them back), the reward statistics, the envs' places in their
        episodes with `next_obs` and what else the loop `carried` (back in `carried` on resume), the
        trajectory recording so far, and the logs up to it."""
        state = checkpoints.saved_state(saved)
        state["iteration"] = iteration
        state["reward_rms"] = checkpoints.reward_normalizer_state(self.reward_normalizer)
        state["episodes"] = env_state.capture(self.envs, self.next_obs, **carried)
        state["trajectories"] = self.recorder.checkpoint_state()
        count, last_returns = self._run_episodes()
        state["finished"] = {"count": count, "last_returns": list(last_returns)}
        self.log.flush(global_step)
        history = wandb_history(self.writer)  # the rows its transaction log may lack (after flush)
        state["wandb"] = history.checkpoint_state() if history is not None else None
        folder = self.path / "checkpoints"
        return checkpoints.save(
            folder, self.script, self.args, global_step, self.saving.step_file, **state
        )

    def iteration_done(self, iteration: int, global_step: int, **carried: np.ndarray) -> bool:
        """After each iteration, with where the loop stands (and the envs' `next_obs`): whether to
        stop (`stopped`): Ctrl-C or a stop signal (`common.interrupt`) on any rank stops every rank
        after the same iteration, and `end` writes its checkpoint; else a checkpoint of `saved` if
        one is due (--checkpoint-every, --checkpoint-minutes; see `save`). The next iteration's
        timing starts."""
        self._loop_state = (iteration, global_step, carried)
        self.global_step = global_step
        if iteration == resume_check.stop_after():  # as a SIGTERM: --check-resume's stop
            self.interrupt.signum = signal.SIGTERM
        # one decision for every rank, whether a signal reached one or all of them
        signum, time_due = distributed.max_over_ranks(self.interrupt.signum, self.saving.time_due())
        # only ever set here: a signal handled as the all-reduce returns (most land while a rank
        # waits in it) is not in this decision, and stays asked for the next one
        if signum:
            self.interrupt.requested, self.interrupt.signum = True, int(signum)
        self.stopped = bool(signum)
        # A stopped run's checkpoint is the stop's, written by `end`, in place of one due now: it
        # is the one resumed from, so it keeps what only a stop's holds (ddpg's replay buffer)
        # and its step_N.pt, which a checkpoint due by time alone would not write.
        if not self.stopped:
            self.saving.iteration_done(iteration, bool(time_due))
        self.log.iteration_started()  # the next one's
        return self.stopped

    def end(self) -> None:
        """After the loop: the last checkpoint (--save-model, or a stop signal: `stopped` is then
        True as it is written), and the trajectory recording's last steps. `global_step` is then
        the loop's last."""
        iteration, self.global_step, _ = self._loop_state
        self.saving.run_ended(iteration, self.stopped)
        self.recorder.save()

    def average_gradients(self, parameters: Iterable[torch.Tensor]) -> None:
        """Under torchrun, each gradient becomes its mean over the ranks: the global minibatch's."""
        distributed.average_gradients(parameters)

    def mean_over_ranks(self, values: torch.Tensor) -> torch.Tensor:
        """`values` averaged over torchrun's ranks, elementwise (each rank's are means over equal
        shares); `values` themselves in one process."""
        return distributed.mean(values)

    def mean_std_over_ranks(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """For each `x[i]`, the mean and std of its elements over every rank's `x[i]`: one
        all-reduce for many minibatches (`x[i].mean()` and `x[i].std()` in one process)."""
        return distributed.mean_std(x)

    def check_finite(
        self,
        parameters: torch.nn.Module | Iterable[torch.Tensor],
        global_step: int,
        page: str | None = None,
        **losses: torch.Tensor,
    ) -> None:
        """Stop the run (`error:`, exit status 1) if a parameter is NaN or inf, naming the update's
        step, the parameter and its last minibatch's `losses` (`common.errors.check_finite`)."""
        check_finite(parameters, global_step, page, **losses)

    def select_action(self, policy: Distribution) -> torch.Tensor:
        """The action evaluation takes from `policy` (--sampling-method, --temperature,
        --sampling-k; see `common.evaluation.select_action`)."""
        args = self.args
        return evaluation.select_action(
            policy, args.sampling_method, args.temperature, args.sampling_k
        )

    def evaluate(
        self, agent: torch.nn.Module, act: evaluation.Act, step: int | None = None,
        record_to: Path | None = None,
    ) -> list[float]:  # fmt: skip
        """Play --eval-episodes episodes with `act(obs, episode_starts)` (see
        `common.evaluation.play_episodes`) in eval mode, log them at `step` (default: the run's
        `global_step`), and return their returns: rank 0 alone under torchrun. A run that had
        ended (`evaluation`) is not evaluated again: its returns are those of its evaluation."""
        if step is None and self.evaluation is not None:
            return list(self.evaluation) if distributed.is_main() else []
        step = self.global_step if step is None else step
        return evaluation.evaluate(
            agent, act, self.make_env, self.args, self.writer, step, record_to
        )

    def evaluate_checkpoint(
        self, agent: torch.nn.Module, play: Callable[[Path | None], list[float]]
    ) -> list[float]:
        """--eval-checkpoint: `agent` (built for the checkpoint's run) takes its weights;
        `play(record_to)`, which calls `evaluate`, runs in a run folder of its own; the mean and
        std of the return are printed."""
        checkpoints.restore(self.checkpoint, {"model": agent})
        threads_for(self.args.torch_threads, agent)

        def in_folder(writer: SummaryWriter, record_to: Path | None) -> list[float]:
            self.writer = writer
            return play(record_to)

        return evaluation.evaluate_checkpoint(self.flags, self.args, in_folder)

    def _write(self, iteration: int) -> Path:
        _, global_step, carried = self._loop_state
        return self.save(iteration, global_step, self.saved, **carried)

    def __enter__(self) -> Run:
        self.interrupt.__enter__()
        self.log.iteration_started()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        try:
            self.log.__exit__(*exc_info)
            self.envs.close()
        finally:
            self.interrupt.__exit__(*exc_info)

    def finish(self, agent: torch.nn.Module, eval_returns: list[float]) -> TrainResult:
        """Close the log (and the wandb run) and return what `train()` returns, with the last
        checkpoint `end` or `iteration_done` wrote. A checkpoint of the run's last step keeps
        `eval_returns`: the same command with --resume auto then finds the run ended."""
        iteration, ended_with = self._loop_state[0], self.saving.saved_iteration
        if self.saving.path is not None and ended_with == iteration and self.evaluation is None:
            if distributed.is_main():
                checkpoints.record_evaluation(self.saving.path, eval_returns)
        self.log.finish()
        episodes = self.log.episodes
        return TrainResult(
            agent,
            self.global_step,
            self.path,
            episodes.returns,
            episodes.lengths,
            eval_returns,
            self.saving.path,
            self.start_step,
            self._run_episodes(),
        )

    def _run_episodes(self) -> tuple[int, tuple[float, ...]]:
        """The episodes the run has finished over all its sessions, and the returns of the last 100."""
        earlier = self.checkpoint.get("finished", {}) if self.checkpoint else {}
        returns = self.log.episodes.returns
        last_returns = (*earlier.get("last_returns", ()), *returns[-100:])[-100:]
        return earlier.get("count", 0) + len(returns), last_returns

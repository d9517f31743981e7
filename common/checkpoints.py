"""Checkpoint files: written atomically, read without unpickling, and turned back into a run's
settings.

A checkpoint is a dict of tensors and plain Python values saved with ``torch.save``. It names the
script that wrote it and its format, so a script refuses another script's checkpoint, or an older
format of its own, with one clear line instead of a traceback."""

from __future__ import annotations

import dataclasses
import io
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

from common import distributed
from common.errors import UsageError
from common.run_folder import write_atomically
from common.seeding import rng_state

Config = TypeVar("Config")

# The settings the command line decides with --resume and with --eval-checkpoint; the rest come from
# the checkpoint.
RUN_TIME_FLAGS = (
    "resume",
    "cuda",
    "torch_threads",
    "progress",
    "track",
    "wandb_project_name",
    "wandb_entity",
)
RUN_TIME_FLAGS += ("numpy_rollout", "dist_backend", "checkpoint_minutes", "run_name")
RUN_TIME_FLAGS += ("compile", "cuda_graphs")  # how the same steps run: --cuda-graphs needs a GPU
EVALUATION_FLAGS = (
    "eval_checkpoint",
    "seed",
    "eval_episodes",
    "sampling_method",
    "temperature",
    "sampling_k",
)
EVALUATION_FLAGS += (
    "run_dir",
    "cuda",
    "torch_threads",
    "save_trajectories",
    "capture_video",
    "video_every",
)
EVALUATION_FLAGS += ("track", "wandb_project_name", "wandb_entity", "compile", "cuda_graphs")


def save(
    folder: Path, script: str, checkpoint_format: int, args: Any, global_step: int,
    step_file: bool = True, **state,
) -> Path:  # fmt: skip
    """Write `state` with the script's name, the format, `args` (a dataclass), `global_step` and the
    generators' states to `step_{global_step}.pt` (with `step_file`) and `latest.pt` in `folder`,
    each atomically (a temporary file in the same folder, then a rename). Returns the path of
    `latest.pt`.

    Under torchrun every rank calls this: rank 0 writes, with every rank's generators,
    `state["episodes"]` (the envs' places) and `state["trajectories"]` (its recording) under
    `ranks`, in rank order (see `common.env_state.start`)."""
    own = {
        "rng": rng_state(),
        "episodes": state.get("episodes"),
        "trajectories": state.get("trajectories"),
    }
    ranks = distributed.gather_to_main(own)
    if ranks is None:
        return folder / "latest.pt"
    state = {
        "script": script,
        "format": checkpoint_format,
        "args": dataclasses.asdict(args),
        "global_step": global_step,
        "rng": rng_state(),
        **state,
        **({"ranks": ranks} if len(ranks) > 1 else {}),
    }
    folder.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    torch.save(state, buffer)  # once, for both files
    for name in (f"step_{global_step}.pt",) * step_file + ("latest.pt",):
        write_atomically(folder / name, buffer.getbuffer())
    return folder / "latest.pt"


def load(
    path: str | Path, script: str, checkpoint_format: int, required: Iterable[str] = ()
) -> dict:
    """Read a checkpoint of `script` in `checkpoint_format` with `weights_only=True` (nothing is
    unpickled); a missing, corrupt or foreign file, another format, or a missing key is a
    UsageError."""
    if not Path(path).is_file():
        raise UsageError(f"checkpoint {str(path)!r} does not exist")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    # torch raises many types for a corrupt file; all mean "cannot read it"
    except Exception as exc:
        raise UsageError(
            f"cannot read checkpoint {str(path)!r}: corrupt, or holds pickled objects ({type(exc).__name__})"
        ) from None
    if not isinstance(checkpoint, dict) or checkpoint.get("script") != script:
        found = (
            checkpoint.get("script") if isinstance(checkpoint, dict) else type(checkpoint).__name__
        )
        raise UsageError(f"{str(path)!r} is not a {script} checkpoint (it is from {found!r})")
    missing = [key for key in ("args", "global_step", "rng", *required) if key not in checkpoint]
    if checkpoint.get("format") != checkpoint_format or missing:
        raise UsageError(
            f"{str(path)!r} is a {script} checkpoint of another format (format {checkpoint.get('format')!r}, this "
            f"version reads {checkpoint_format}; missing {missing or 'nothing'})"
        )
    return checkpoint


def settings(checkpoint: dict, args: Config, kept: Iterable[str], strict: bool) -> Config:
    """The run settings a checkpoint holds, in the dataclass of `args`, with the `kept` fields of
    `args` on top.

    With `strict` (a resumed run), any other field of `args` that differs both from its default and
    from the checkpoint is a UsageError: the checkpoint decides it, and the flag would otherwise be
    ignored without a word."""
    kept = set(kept)
    defaults = type(args)()
    for field in dataclasses.fields(args) if strict else ():
        given, saved = getattr(args, field.name), checkpoint["args"].get(field.name)
        if field.name not in kept and given != getattr(defaults, field.name) and given != saved:
            flag = "--" + field.name.replace("_", "-")
            raise UsageError(
                f"{flag} {given} differs from the checkpoint's {saved}, which decides it; leave it out"
            )
    try:
        return type(args)(
            **{
                **checkpoint["args"],
                **{name: getattr(args, name) for name in kept if hasattr(args, name)},
            }
        )
    except (KeyError, TypeError) as exc:
        raise UsageError(
            f"the checkpoint's settings do not match this version of the script: {exc}"
        ) from None


def load_with_settings(
    path: str | None,
    script: str,
    checkpoint_format: int,
    args: Config,
    check_args: Callable[[Config], None],
    kept: Iterable[str],
    strict: bool,
    required: Iterable[str] = (),
) -> tuple[Config, dict | None]:
    """The checkpoint of `script` at `path` and its run's settings (see `settings`), checked by
    `check_args`; no path: `args` and no checkpoint."""
    if path is None:
        return args, None
    checkpoint = load(path, script, checkpoint_format, required)
    run_settings = settings(checkpoint, args, kept, strict)
    check_args(run_settings)
    return run_settings, checkpoint


def restore(checkpoint: dict | None, saved: dict[str, Any]) -> None:
    """Load each of `saved` (its key in the checkpoint -> a module or an optimizer, or a NumPy array
    the loop updates in place) from `checkpoint`; nothing for a new run (None). A missing key or a
    state that does not fit is a UsageError."""
    for key, thing in saved.items() if checkpoint is not None else ():
        if key not in checkpoint:
            raise UsageError(
                f"the checkpoint has no {key!r}: it is of another version of the script"
            )
        try:
            if isinstance(thing, np.ndarray):
                thing[...] = np.asarray(checkpoint[key])
            else:
                thing.load_state_dict(checkpoint[key])
        except (RuntimeError, KeyError, ValueError) as exc:
            message = f"the checkpoint's {key!r} does not fit this run's: {str(exc)[:200]}"
            raise UsageError(message) from None


def saved_state(saved: dict[str, Any]) -> dict[str, Any]:
    """What a checkpoint holds of each of `saved` (see `restore`): a module's or an optimizer's
    state dict, an array as a tensor (a copy), any other value as it is."""
    state = {}
    for key, thing in saved.items():
        if isinstance(thing, np.ndarray):
            state[key] = torch.as_tensor(thing.copy())
        elif hasattr(thing, "state_dict"):
            state[key] = thing.state_dict()
        else:
            state[key] = thing
    return state


def auto_resume(args: Config) -> Config:
    """`args` with `--resume auto` made a path: the `latest.pt` of the run named `--run-name` in
    `--run-dir`, if it has one (the same command goes on after a requeue or a restart), else None
    (it starts that run). Rank 0 looks, under torchrun."""
    if args.resume != "auto":
        return args
    name = args.run_name
    if not name or Path(name).name != name or name in (".", ".."):
        raise UsageError(
            f"--resume auto needs --run-name, a folder name in --run-dir (got {name!r}): the run it continues or starts"
        )
    latest = Path(args.run_dir) / name / "checkpoints" / "latest.pt"
    found = distributed.broadcast_object(latest.is_file() if distributed.is_main() else None)
    return dataclasses.replace(args, resume=str(latest) if found else None)


def resume_folder(path: str | Path) -> Path:
    """The run folder of a checkpoint that `--resume` continues; it must lie in that folder's
    `checkpoints/`."""
    path = Path(path).resolve()
    if path.parent.name != "checkpoints":
        raise UsageError(
            f"--resume takes a checkpoint inside a run's checkpoints/ folder, got {str(path)!r}"
        )
    return path.parent.parent


def reward_normalizer_state(normalizer: Any) -> dict | None:
    """The running statistics of gymnasium's NormalizeReward (None for no normalizer), as checkpoint
    values."""
    if normalizer is None:
        return None
    rms = normalizer.return_rms
    return {
        "mean": torch.as_tensor(rms.mean),
        "var": torch.as_tensor(rms.var),
        "count": float(rms.count),
    }


def restore_reward_normalizer(normalizer: Any, state: dict) -> None:
    """Put the statistics of `reward_normalizer_state` back into a NormalizeReward wrapper."""
    rms = normalizer.return_rms
    rms.mean, rms.var, rms.count = (
        state["mean"].numpy(),
        state["var"].numpy(),
        float(state["count"]),
    )


class CheckpointSchedule:
    """When a run writes checkpoints: every `args.checkpoint_every` iterations (0: never on the
    way); `latest.pt` alone once `args.checkpoint_minutes` of wall-clock time have passed since the
    last one (0: never), so that a kill loses at most that much; and once more when the run ends,
    with `args.save_model` or when it was stopped by a signal, unless that iteration is saved
    already. `write(iteration)` writes one and returns its path; `step_file` says whether it keeps
    a `step_{global_step}.pt` beside `latest.pt`."""

    def __init__(self, write: Callable[[int], Path], args: Any, iterations_done: int):
        self.write, self.every, self.at_end = write, args.checkpoint_every, args.save_model
        self.seconds = 60.0 * args.checkpoint_minutes
        self.saved_iteration, self.path = iterations_done, None
        self.step_file = True
        self.last_time = time.monotonic()

    def time_due(self) -> bool:
        """Whether `checkpoint_minutes` have passed since the last checkpoint (or the start)."""
        return bool(self.seconds) and time.monotonic() - self.last_time >= self.seconds

    def iteration_done(self, iteration: int, time_due: bool) -> None:
        """After `iteration`: its checkpoint if one is due by iterations, else by `time_due` (every
        rank's decision under torchrun)."""
        if self.every and iteration % self.every == 0:
            self._write(iteration, step_file=True)
        elif time_due:
            self._write(iteration, step_file=False)

    def run_ended(self, iteration: int, interrupted: bool) -> Path | None:
        """The last checkpoint's path (None if none was written)."""
        if (self.at_end or interrupted) and self.saved_iteration < iteration:
            self._write(iteration, step_file=True)
        return self.path

    def _write(self, iteration: int, step_file: bool) -> None:
        self.step_file = step_file
        self.path, self.saved_iteration = self.write(iteration), iteration
        self.last_time = time.monotonic()

"""Checkpoint files: written atomically, read without unpickling, and turned back into a run's
settings.

A checkpoint is a dict of tensors and plain Python values saved with ``torch.save``. Whether it fits a
script is read from what it holds, with no format number to bump after an edit: its settings must be
fields of the script's `Args`, and each module's, optimizer's and array's state must have the keys and
shapes of the run built from those settings. So an edited copy loads the original's checkpoints
wherever they fit, and a checkpoint that does not fit (another algorithm's, an edit's new parameter)
is one `error:` line naming the keys or shapes that differ. The script that wrote it is named there.
Checkpoints written with a format number (before 2026-11-28) load as any other."""

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
# The setting --resume takes from the command line where given, that the checkpoint otherwise decides: a new budget
# trains the run on (or ends it sooner) from the checkpoint's step (docs/outputs.md, "Training a run on").
BUDGET = "total_timesteps"


def save(
    folder: Path, script: str, args: Any, global_step: int, step_file: bool = True, **state
) -> Path:
    """Write `state` with the script's name, `args` (a dataclass), `global_step` and the
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


def record_evaluation(path: Path, returns: list[float]) -> None:
    """Add the returns of a run's evaluation to its checkpoint `path` of the run's last step, as
    `evaluation`, atomically (`latest.pt`: what --resume auto reads; the step file stays as the
    training left it)."""
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    checkpoint["evaluation"] = [float(value) for value in returns]
    buffer = io.BytesIO()
    torch.save(checkpoint, buffer)
    write_atomically(path, buffer.getbuffer())


def load(path: str | Path, required: Iterable[str] = ()) -> dict:
    """Read a checkpoint with `weights_only=True` (nothing is unpickled); a missing or corrupt file,
    or one without the run's keys (its settings, step and generators) and `required`, is a
    UsageError. Whether it fits the script is `settings`' and `restore`'s to say."""
    if not Path(path).is_file():
        raise UsageError(f"checkpoint {str(path)!r} does not exist")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    # torch raises many types for a corrupt file; all mean "cannot read it"
    except Exception as exc:
        raise UsageError(
            f"cannot read checkpoint {str(path)!r}: corrupt, or holds pickled objects ({type(exc).__name__})"
        ) from None
    if not isinstance(checkpoint, dict):
        raise UsageError(
            f"{str(path)!r} is not a checkpoint (it holds a {type(checkpoint).__name__})"
        )
    missing = [key for key in ("args", "global_step", "rng", *required) if key not in checkpoint]
    if missing:
        raise UsageError(
            f"{str(path)!r}{written_by(checkpoint)} is not a run's checkpoint: it has no {missing}"
        )
    return checkpoint


def written_by(checkpoint: dict) -> str:
    """' (written by SCRIPT.py)', for the errors about a checkpoint."""
    return f" (written by {checkpoint.get('script')}.py)" if checkpoint.get("script") else ""


def settings(checkpoint: dict, args: Config, kept: Iterable[str], strict: bool) -> Config:
    """The run settings a checkpoint holds, in the dataclass of `args`, with the `kept` fields of
    `args` on top; a field the checkpoint lacks (a flag an edit added) takes its default.

    A setting that is no field of `args` (another algorithm's) is a UsageError. With `strict` (a
    resumed run), so is any other field of `args` that differs both from its default and from the
    checkpoint: the checkpoint decides it, and the flag would otherwise be ignored without a word;
    but BUDGET given so is taken from `args` (a flag equal to its default reads as not given)."""
    defaults = type(args)()
    kept = set(kept)
    if strict and getattr(args, BUDGET) != getattr(defaults, BUDGET):
        kept.add(BUDGET)
    fields = {field.name for field in dataclasses.fields(args)}
    unknown = sorted(set(checkpoint["args"]) - fields)
    if unknown:
        raise UsageError(
            f"the checkpoint{written_by(checkpoint)} does not fit this script: its settings {unknown} are no "
            f"fields of this script's Args"
        )
    for field in dataclasses.fields(args) if strict else ():
        given, saved = getattr(args, field.name), checkpoint["args"].get(field.name)
        if field.name not in kept and given != getattr(defaults, field.name) and given != saved:
            flag = "--" + field.name.replace("_", "-")
            raise UsageError(
                f"{flag} {given} differs from the checkpoint's {saved}, which decides it; leave it out"
            )
    return type(args)(
        **{**checkpoint["args"], **{name: getattr(args, name) for name in kept if name in fields}}
    )


def load_with_settings(
    path: str | None,
    args: Config,
    check_args: Callable[[Config], None],
    kept: Iterable[str],
    strict: bool,
    required: Iterable[str] = (),
) -> tuple[Config, dict | None]:
    """The checkpoint at `path` and its run's settings (see `settings`), checked by `check_args`; no
    path: `args` and no checkpoint."""
    if path is None:
        return args, None
    checkpoint = load(path, required)
    run_settings = settings(checkpoint, args, kept, strict)
    check_args(run_settings)
    return run_settings, checkpoint


def restore(checkpoint: dict | None, saved: dict[str, Any]) -> None:
    """Load each of `saved` (its key in the checkpoint -> a module or an optimizer, or a NumPy array
    the loop updates in place) from `checkpoint`; nothing for a new run (None). A missing key, or a
    state whose keys or shapes differ from this run's, is a UsageError that names them."""
    for key, thing in saved.items() if checkpoint is not None else ():
        if key not in checkpoint:
            raise UsageError(
                f"the checkpoint{written_by(checkpoint)} has no {key!r}, which this script saves and restores"
            )
        difference = state_difference(checkpoint[key], thing)
        if difference:
            raise UsageError(
                f"the checkpoint's {key!r}{written_by(checkpoint)} does not fit this run's: {difference}"
            )
        try:
            if isinstance(thing, np.ndarray):
                thing[...] = np.asarray(checkpoint[key])
            else:
                thing.load_state_dict(checkpoint[key])
        except (RuntimeError, KeyError, ValueError) as exc:
            message = f"the checkpoint's {key!r}{written_by(checkpoint)} does not fit this run's: {str(exc)[:200]}"
            raise UsageError(message) from None


def tensor_shapes(state: dict) -> dict[str, tuple[int, ...] | None]:
    """Each tensor's shape in a module's state dict, by its key."""
    return {str(key): tuple(value.shape) for key, value in state.items() if torch.is_tensor(value)}


def optimizer_shapes(
    param_groups: list[dict], shape: Callable[[Any], tuple[int, ...] | None]
) -> dict:
    """`shape` of each parameter an optimizer steps, by group and place (`param_groups` its own,
    or a state dict's, whose parameters are indices into its moments)."""
    return {
        f"param_groups[{g}][{i}]": shape(parameter)
        for g, group in enumerate(param_groups)
        for i, parameter in enumerate(group["params"])
    }


def state_difference(saved: Any, thing: Any) -> str:
    """What differs between a checkpoint's state of `thing` (a module, an optimizer or an array) and
    `thing`'s own, in words: keys on one side only, and shapes; empty where they agree. A saved
    optimizer's parameter shows its shape through its moments; one not stepped yet has none."""
    if isinstance(thing, np.ndarray):
        there, here = {"its shape": tuple(np.shape(saved))}, {"its shape": thing.shape}
    elif isinstance(thing, torch.optim.Optimizer):
        here = optimizer_shapes(thing.param_groups, lambda parameter: tuple(parameter.shape))
        moments = saved["state"]

        def moment_shape(index: int) -> tuple[int, ...] | None:
            tensors = [x for x in moments.get(index, {}).values() if torch.is_tensor(x) and x.dim()]
            return tuple(tensors[0].shape) if tensors else None

        there = optimizer_shapes(saved["param_groups"], moment_shape)
    elif hasattr(thing, "state_dict"):
        there, here = tensor_shapes(saved), tensor_shapes(thing.state_dict())
    else:
        return ""
    parts = []
    if missing := [key for key in here if key not in there]:
        parts.append(f"the checkpoint lacks {listed(missing)}")
    if extra := [key for key in there if key not in here]:
        parts.append(f"this run has no {listed(extra)}")
    differ = [
        f"{key} {there[key]} there, {here[key]} here"
        for key in here
        if there.get(key) is not None and there[key] != here[key]
    ]
    if differ:
        parts.append("shapes differ: " + listed(differ))
    return "; ".join(parts)


def listed(items: list[str], most: int = 4) -> str:
    """Up to `most` of `items`, then how many more."""
    more = f" and {len(items) - most} more" if len(items) > most else ""
    return ", ".join(items[:most]) + more


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

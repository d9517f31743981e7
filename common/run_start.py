"""Where a run starts: a new run's folder at step 0, or the folder, step and iteration of the checkpoint that
`--resume` continues; with its TensorBoard writer and its video folder."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch.utils.tensorboard import SummaryWriter

from common.checkpoints import resume_folder
from common.cli import notice
from common.errors import UsageError
from common.run_folder import create_run_folder, run_name
from common.tracking import start_tracking


@dataclass
class RunStart:
    path: Path
    writer: SummaryWriter
    video_folder: Path
    """a resumed run's videos go to a folder of their own: file names never clash with the first part's"""
    global_step: int
    iterations_done: int


def start_run(args: Any, checkpoint: dict | None, num_iterations: int, batch_size: int) -> RunStart:
    """A new run (`checkpoint` None), or the continuation of the checkpoint's run, whose TensorBoard curves go on
    from the step after the checkpoint's. `args` is the script's dataclass."""
    if args.total_timesteps % batch_size:
        notice(f"--total-timesteps is rounded down to whole batches of {batch_size}: {num_iterations * batch_size}")
    if checkpoint is None:
        path = create_run_folder(args.run_dir, run_name(args.env_id, args.exp_name, args.seed))
        return RunStart(path, start_tracking(path, args), path / "videos", 0, 0)
    path, global_step, iterations_done = resume_folder(args.resume), checkpoint["global_step"], checkpoint["iteration"]
    if iterations_done >= num_iterations:
        raise UsageError(f"{args.resume!r} is the end of its run: nothing to resume (see --eval-checkpoint)")
    writer = start_tracking(path, args, purge_step=global_step + 1)
    return RunStart(path, writer, path / "videos" / f"from_step_{global_step}", int(global_step), int(iterations_done))

"""Where a run starts: a new run's folder at step 0, or the folder, step and iteration of the checkpoint that
`--resume` continues; with its TensorBoard writer and its video folder."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch.utils.tensorboard import SummaryWriter

from common import distributed
from common.checkpoints import resume_folder
from common.cli import notice
from common.errors import UsageError
from common.run_folder import create_run_folder, run_name
from common.tracking import start_tracking
from common.trajectories import check_destination


@dataclass
class RunStart:
    path: Path
    writer: SummaryWriter | None
    """None on every rank but 0 under torchrun: rank 0 alone writes the run's files"""
    video_folder: Path
    """a resumed run's videos go to a folder of their own: file names never clash with the first part's"""
    global_step: int
    iterations_done: int


def start_run(args: Any, checkpoint: dict | None, num_iterations: int, batch_size: int) -> RunStart:
    """A new run (`checkpoint` None), or the continuation of the checkpoint's run, whose TensorBoard curves go on
    from the step after the checkpoint's. `args` is the script's dataclass; `batch_size` counts every rank's steps."""
    check_destination(
        args.save_trajectories
    )  # before the run folder: bad input leaves nothing written
    if args.total_timesteps % batch_size:
        notice(
            f"--total-timesteps is rounded down to whole batches of {batch_size}: {num_iterations * batch_size}"
        )
    main = distributed.is_main()
    if checkpoint is None:
        path = (
            create_run_folder(args.run_dir, run_name(args.env_id, args.exp_name, args.seed))
            if main
            else None
        )
        path = distributed.broadcast_object(path)
        return RunStart(path, start_tracking(path, args) if main else None, path / "videos", 0, 0)
    path, global_step = resume_folder(args.resume), int(checkpoint["global_step"])
    # In this run's batches: a checkpoint of another number of processes made iterations of another size.
    iterations_done = global_step // batch_size
    if global_step % batch_size:
        notice(
            f"the checkpoint's step {global_step} is not a whole number of this run's batches of {batch_size}"
        )
    if iterations_done >= num_iterations:
        raise UsageError(
            f"{args.resume!r} is the end of its run: nothing to resume (see --eval-checkpoint)"
        )
    writer = start_tracking(path, args, purge_step=global_step + 1) if main else None
    return RunStart(
        path, writer, path / "videos" / f"from_step_{global_step}", global_step, iterations_done
    )

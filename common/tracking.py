"""Where a run's numbers go: the TensorBoard writer (synced to wandb with --track), the hyperparameters table,
episode returns, and videos."""

from __future__ import annotations

import atexit
import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tensorboard.compat.proto.summary_pb2 import Summary
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

from common import distributed
from common.resident_memory import rss_mb


def start_tracking(run_path: Path, args: Any, purge_step: int | None = None) -> SummaryWriter:
    """The run's SummaryWriter, with the `hyperparameters` table CleanRL writes; `args` is the script's dataclass.

    With `args.track`, wandb starts first, so that it can patch the writer (sync_tensorboard). A resumed run passes
    `purge_step`, the first step it logs: TensorBoard's readers then drop what the interrupted run logged from that
    step on, so no step shows twice. The writer is also closed at exit, so a crash keeps the last records."""
    config = dataclasses.asdict(args)
    if args.track:
        import wandb

        wandb.init(
            project=args.wandb_project_name,
            entity=args.wandb_entity,
            sync_tensorboard=True,
            config=config,
            name=run_path.name,
            dir=str(run_path),
            save_code=True,
        )
    writer = SummaryWriter(str(run_path), purge_step=purge_step)
    atexit.register(writer.close)  # a second close does nothing
    if purge_step is None:
        writer.add_text(
            "hyperparameters",
            "|param|value|\n|-|-|\n" + "\n".join(f"|{key}|{value}|" for key, value in config.items()),
        )
    return writer


def log_episodes(
    writer: SummaryWriter | None, returns: Sequence[float], lengths: Sequence[int], step: int, prefix: str = "charts"
) -> None:
    """Log every episode that ended at `step` (`{prefix}/episodic_return` and `{prefix}/episodic_length`) in one
    event: each event costs the writer thread about 0.1 ms, which dominates runs where many short episodes end."""
    if writer is None:  # a rank other than 0 under torchrun
        return
    values = [Summary.Value(tag=f"{prefix}/episodic_return", simple_value=value) for value in returns]
    values += [Summary.Value(tag=f"{prefix}/episodic_length", simple_value=value) for value in lengths]
    writer.file_writer.add_summary(Summary(value=values), step)


def upload_videos(video_folder: str | Path, uploaded: set[str]) -> None:
    """Send the videos of `video_folder` that are not in `uploaded` to wandb, and remember them there."""
    import wandb

    for path in sorted(Path(video_folder).glob("*.mp4")):
        if str(path) not in uploaded:
            wandb.log({"videos": wandb.Video(str(path), format="mp4")})
            uploaded.add(str(path))


def finish_tracking(
    writer: SummaryWriter | None, track: bool, video_folder: str | Path | None, uploaded: set[str]
) -> None:
    """Close the writer; with `track`, upload the last videos and finish the wandb run (None: nothing to close)."""
    if writer is None:
        return
    writer.close()
    atexit.unregister(writer.close)
    if track:
        import wandb

        if video_folder is not None:
            upload_videos(video_folder, uploaded)
        wandb.finish()


class EpisodeLog:
    """The finished episodes of a vector env with gymnasium's RecordEpisodeStatistics: kept in order, and logged at
    the step they end (`{prefix}/episodic_return`, `{prefix}/episodic_length`). Under torchrun every rank's episodes
    are gathered at `gather_ranks` (once per iteration), kept by every rank, and logged by rank 0."""

    def __init__(self, writer: SummaryWriter | None, prefix: str = "charts"):
        self.writer, self.prefix = writer, prefix
        self.returns: list[float] = []
        self.lengths: list[int] = []
        self.pending: list[tuple[int, list[float], list[int]]] = []  # this rank's, until `gather_ranks`

    def record(self, infos: dict, step: int) -> None:
        """Keep and log the episodes that `infos` (of one vector step) reports as finished."""
        if "_episode" not in infos:
            return
        finished = infos["_episode"]
        returns, lengths = infos["episode"]["r"][finished].tolist(), infos["episode"]["l"][finished].tolist()
        if distributed.world_size() > 1:
            self.pending.append((step, returns, lengths))
        else:
            self._add(step, returns, lengths)

    def _add(self, step: int, returns: list[float], lengths: list[int]) -> None:
        log_episodes(self.writer, returns, lengths, step, self.prefix)
        self.returns += returns
        self.lengths += lengths

    def gather_ranks(self) -> None:
        """Every rank's episodes since the last call, in the order of their steps (then ranks): a collective."""
        if distributed.world_size() == 1:
            return
        ranks, self.pending = distributed.gather(self.pending), []
        for step, returns, lengths in sorted((episodes for rank in ranks for episodes in rank), key=lambda e: e[0]):
            self._add(step, returns, lengths)

    def recent_mean(self, episodes: int = 20) -> float | None:
        """The mean return of the last `episodes` episodes to 2 decimals (for a progress bar), None before the first."""
        return round(float(np.mean(self.returns[-episodes:])), 2) if self.returns else None


class TrainingLog:
    """A training run's logging: every finished episode (`episodes`), one block of scalars per iteration with
    `charts/SPS` and `system/rss_mb` added, the progress bar, and (with --track) the videos uploaded as they appear.
    A context manager: the progress bar closes on leaving it."""

    def __init__(self, writer: SummaryWriter | None, args: Any, video_folder: Path, total_steps: int, global_step: int):
        self.writer, self.track = writer, args.track and writer is not None
        self.video_folder = video_folder if args.capture_video else None
        self.episodes = EpisodeLog(writer)
        progress = args.progress and distributed.is_main()
        self.progress = tqdm(total=total_steps, initial=global_step, disable=not progress, unit="step")
        self.start_time, self.start_step = time.time(), global_step
        self.uploaded_videos: set[str] = set()

    def iteration(self, global_step: int, scalars: dict[str, float]) -> None:
        """Log an iteration's `scalars` at `global_step`, with the SPS since this process started training (and under
        torchrun the seconds in collectives, `perf/collective_seconds`, after gathering every rank's episodes)."""
        self.episodes.gather_ranks()
        sps = int((global_step - self.start_step) / (time.time() - self.start_time))
        scalars = {**scalars, "charts/SPS": sps, "system/rss_mb": rss_mb()}
        if distributed.world_size() > 1:
            scalars["perf/collective_seconds"] = distributed.take_collective_seconds()
        for key, value in scalars.items() if self.writer is not None else ():
            self.writer.add_scalar(key, value, global_step)
        self.progress.update(global_step - self.progress.n)
        self.progress.set_postfix(SPS=sps, ret=self.episodes.recent_mean(), refresh=False)
        if self.track and self.video_folder is not None:
            upload_videos(self.video_folder, self.uploaded_videos)

    def __enter__(self) -> TrainingLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.progress.close()

    def finish(self) -> None:
        """After training and its evaluation: close the writer and, with --track, the wandb run."""
        finish_tracking(self.writer, self.track, self.video_folder, self.uploaded_videos)

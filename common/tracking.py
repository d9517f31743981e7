"""Where a run's numbers go: the TensorBoard writer and, with --track, the same values as wandb
rows; the hyperparameters table, episode returns, and videos."""

from __future__ import annotations

import atexit
import dataclasses
import json
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
from common.run_folder import write_atomically

WANDB_RUN_FILE = "wandb_run.json"
"""In a tracked run's folder: its wandb id and the last global step sent to wandb (`WandbHistory`).
"""


class RunWriter(SummaryWriter):
    """The run's TensorBoard writer; with --track (`wandb_history`), the rows that go to wandb are
    kept beside it."""

    def __init__(self, log_dir: Path, purge_step: int | None, wandb_history: WandbHistory | None):
        super().__init__(str(log_dir), purge_step=purge_step)
        self.wandb_history = wandb_history


class WandbHistory:
    """A tracked run's wandb history, logged directly (TensorBoard's sync would copy the event
    files, nested, and keep one value per tag of each event): one row per episode, per iteration,
    per evaluation episode and per video, each with its `global_step`, the x-axis of every key. Rows
    wait for `send`, once per iteration, which first writes the last step it sends to
    `wandb_run.json` in the run folder, with the run's wandb id. A resumed run continues that wandb
    run and sends no row up to that step: what a killed run sent after its last checkpoint is not
    sent twice."""

    def __init__(self, run_path: Path, args: Any, resumed: bool):
        import wandb

        self.state_file = run_path / WANDB_RUN_FILE
        state = (
            json.loads(self.state_file.read_text()) if resumed and self.state_file.is_file() else {}
        )
        self.sent_before: int = state.get("last_step", -1)  # by the run this one resumes
        self.rows: list[dict[str, Any]] = []
        self.last_step = 0  # of the last row added
        run = wandb.init(
            project=args.wandb_project_name,
            entity=args.wandb_entity,
            name=run_path.name,
            id=state.get("id"),  # None: a new run, whose id wandb draws
            resume="allow",
            dir=str(run_path),
            save_code=True,
        )
        self.run_id: str = run.id
        # A resumed run's flags that the command line decides (--resume, --track) differ from the
        # first part's.
        run.config.update(dataclasses.asdict(args), allow_val_change=True)
        wandb.define_metric("global_step")
        wandb.define_metric("*", step_metric="global_step")
        self._write_state(self.sent_before)
        # an error that ends the run sends what waits (before wandb's own exit handler)
        atexit.register(self.send)

    def add(self, step: int, values: dict[str, Any]) -> None:
        """One row at `step` (a global step), unless the run this one resumes sent that step
        already."""
        self.last_step = step
        if step > self.sent_before:
            self.rows.append({**values, "global_step": step})

    def send(self) -> None:
        """Log the waiting rows to wandb, in the order they came (never with wandb's `step=`: rows
        of one step would merge into one)."""
        import wandb

        if not self.rows or wandb.run is None:
            return
        # first: a kill between never sends twice
        self._write_state(max(row["global_step"] for row in self.rows))
        for row in self.rows:
            wandb.log(row)
        self.rows = []

    def _write_state(self, last_step: int) -> None:
        write_atomically(
            self.state_file, json.dumps({"id": self.run_id, "last_step": last_step}).encode()
        )


def wandb_history(writer: SummaryWriter | None) -> WandbHistory | None:
    """The wandb rows of a tracked run's writer; None without --track (or without a writer)."""
    return getattr(writer, "wandb_history", None)


def start_tracking(run_path: Path, args: Any, purge_step: int | None = None) -> RunWriter:
    """The run's writer, with the `hyperparameters` table CleanRL writes; `args` is the script's
    dataclass, and with `args.track` the run's wandb history (its args are the wandb config; wandb
    does not take TensorBoard's text).

    A resumed run passes `purge_step`, the first step it logs: TensorBoard's readers then drop what
    the interrupted run logged from that step on, and wandb's run goes on (see `WandbHistory`). The
    writer is also closed at exit, so a crash keeps the last records."""
    config = dataclasses.asdict(args)
    history = WandbHistory(run_path, args, resumed=purge_step is not None) if args.track else None
    writer = RunWriter(run_path, purge_step, history)
    atexit.register(writer.close)  # a second close does nothing
    if purge_step is None:
        writer.add_text(
            "hyperparameters",
            "|param|value|\n|-|-|\n"
            + "\n".join(f"|{key}|{value}|" for key, value in config.items()),
        )
    return writer


def log_scalars(writer: SummaryWriter | None, scalars: dict[str, float], step: int) -> None:
    """`scalars` at `step`: each to TensorBoard, and together as one wandb row when tracking."""
    if writer is None:  # a rank other than 0 under torchrun
        return
    for key, value in scalars.items():
        writer.add_scalar(key, value, step)
    history = wandb_history(writer)
    if history is not None:
        history.add(step, scalars)


def log_episodes(
    writer: SummaryWriter | None,
    returns: Sequence[float],
    lengths: Sequence[int],
    step: int,
    prefix: str = "charts",
) -> None:
    """Log every episode that ended at `step` (`{prefix}/episodic_return` and
    `{prefix}/episodic_length`): in one TensorBoard event, since each event costs the writer thread
    about 0.1 ms, which dominates runs where many short episodes end; and one wandb row per episode
    when tracking."""
    if writer is None:  # a rank other than 0 under torchrun
        return
    return_tag, length_tag = f"{prefix}/episodic_return", f"{prefix}/episodic_length"
    values = [Summary.Value(tag=return_tag, simple_value=value) for value in returns]
    values += [Summary.Value(tag=length_tag, simple_value=value) for value in lengths]
    writer.file_writer.add_summary(Summary(value=values), step)
    history = wandb_history(writer)
    for episode_return, length in zip(returns, lengths, strict=True) if history is not None else ():
        history.add(step, {return_tag: episode_return, length_tag: length})


def upload_videos(
    history: WandbHistory, video_folder: str | Path, uploaded: set[str], step: int
) -> None:
    """Queue the videos of `video_folder` that are not in `uploaded` for wandb, at `step`, and
    remember them there."""
    import wandb

    for path in sorted(Path(video_folder).glob("*.mp4")):
        if str(path) not in uploaded:
            history.add(step, {"videos": wandb.Video(str(path), format="mp4")})
            uploaded.add(str(path))


def finish_tracking(
    writer: SummaryWriter | None,
    video_folder: str | Path | None,
    uploaded: set[str],
    step: int | None = None,
) -> None:
    """Close the writer; when tracking, send the last videos (at `step`, by default the last row's)
    and rows, and finish the wandb run (None: nothing to close)."""
    if writer is None:
        return
    writer.close()
    atexit.unregister(writer.close)
    history = wandb_history(writer)
    if history is not None:
        import wandb

        if video_folder is not None:
            upload_videos(
                history, video_folder, uploaded, history.last_step if step is None else step
            )
        history.send()
        atexit.unregister(history.send)
        wandb.finish()


class EpisodeLog:
    """The finished episodes of a vector env with gymnasium's RecordEpisodeStatistics: kept in
    order, and logged at the step they end (`{prefix}/episodic_return`, `{prefix}/episodic_length`).
    Under torchrun every rank's episodes are gathered at `gather_ranks` (once per iteration), kept
    by every rank, and logged by rank 0."""

    def __init__(self, writer: SummaryWriter | None, prefix: str = "charts"):
        self.writer, self.prefix = writer, prefix
        self.returns: list[float] = []
        self.lengths: list[int] = []
        # this rank's, until `gather_ranks`
        self.pending: list[tuple[int, list[float], list[int]]] = []

    def record(self, infos: dict, step: int) -> None:
        """Keep and log the episodes that `infos` (of one vector step) reports as finished."""
        if "_episode" not in infos:
            return
        finished = infos["_episode"]
        returns, lengths = (
            infos["episode"]["r"][finished].tolist(),
            infos["episode"]["l"][finished].tolist(),
        )
        if distributed.world_size() > 1:
            self.pending.append((step, returns, lengths))
        else:
            self._add(step, returns, lengths)

    def _add(self, step: int, returns: list[float], lengths: list[int]) -> None:
        log_episodes(self.writer, returns, lengths, step, self.prefix)
        self.returns += returns
        self.lengths += lengths

    def gather_ranks(self) -> None:
        """Every rank's episodes since the last call, in the order of their steps (then ranks): a
        collective."""
        if distributed.world_size() == 1:
            return
        ranks, self.pending = distributed.gather(self.pending), []
        for step, returns, lengths in sorted(
            (episodes for rank in ranks for episodes in rank), key=lambda e: e[0]
        ):
            self._add(step, returns, lengths)

    def recent_mean(self, episodes: int = 20) -> float | None:
        """The mean return of the last `episodes` episodes to 2 decimals (for a progress bar), None
        before the first."""
        return round(float(np.mean(self.returns[-episodes:])), 2) if self.returns else None


class TrainingLog:
    """A training run's logging: every finished episode (`episodes`), one block of scalars per
    iteration with `perf/rollout_seconds`, `perf/update_seconds`, `charts/SPS` and `system/rss_mb`
    added, the progress bar, and (with --track) the
    videos uploaded as they appear. A context manager: the progress bar closes on leaving it."""

    def __init__(
        self,
        writer: SummaryWriter | None,
        args: Any,
        video_folder: Path,
        total_steps: int,
        global_step: int,
    ):
        self.writer = writer
        self.video_folder = video_folder if args.capture_video else None
        self.episodes = EpisodeLog(writer)
        progress = args.progress and distributed.is_main()
        self.progress = tqdm(
            total=total_steps, initial=global_step, disable=not progress, unit="step"
        )
        self.start_time, self.start_step = time.time(), global_step
        self.uploaded_videos: set[str] = set()
        self.last_step = global_step
        self.iteration_start = self.rollout_end = self.start_time

    def iteration_started(self) -> None:
        """An iteration's rollout starts: `perf/rollout_seconds` counts from here."""
        self.iteration_start = time.time()

    def rollout_done(self) -> None:
        """The rollout ends and the update starts: `perf/update_seconds` counts from here."""
        self.rollout_end = time.time()

    def iteration(self, global_step: int, scalars: dict[str, float]) -> None:
        """Log an iteration's `scalars` at `global_step`, with the seconds of its rollout and of its
        update (`iteration_started`, `rollout_done`, now), the SPS since this process started
        training (and under torchrun the seconds in collectives, `perf/collective_seconds`, after
        gathering every rank's episodes)."""
        now = time.time()
        self.episodes.gather_ranks()
        sps = int((global_step - self.start_step) / (now - self.start_time))
        scalars = {
            **scalars,
            "perf/rollout_seconds": self.rollout_end - self.iteration_start,
            "perf/update_seconds": now - self.rollout_end,
            "charts/SPS": sps,
            "system/rss_mb": rss_mb(),
        }
        if distributed.world_size() > 1:
            scalars["perf/collective_seconds"] = distributed.take_collective_seconds()
        log_scalars(self.writer, scalars, global_step)
        self.progress.update(global_step - self.progress.n)
        self.progress.set_postfix(SPS=sps, ret=self.episodes.recent_mean(), refresh=False)
        self.last_step = global_step
        self.send(global_step)

    def send(self, global_step: int) -> None:
        """With --track, send what waits for wandb, with the videos that appeared (at
        `global_step`)."""
        history = wandb_history(self.writer)
        if history is not None:
            if self.video_folder is not None:
                upload_videos(history, self.video_folder, self.uploaded_videos, global_step)
            history.send()

    def flush(self, global_step: int) -> None:
        """When a checkpoint is written: TensorBoard's buffered events to their file, and what waits
        for wandb, so that a run killed after the checkpoint has logged everything up to it."""
        if self.writer is not None:
            self.writer.flush()
            self.send(global_step)

    def __enter__(self) -> TrainingLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.progress.close()

    def finish(self) -> None:
        """After training and its evaluation: close the writer and, with --track, the wandb run."""
        finish_tracking(self.writer, self.video_folder, self.uploaded_videos, self.last_step)

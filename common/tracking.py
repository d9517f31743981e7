"""Where a run's numbers go: the TensorBoard writer and, with --track, the same values as wandb
rows; the hyperparameters table, episode returns, and videos."""

from __future__ import annotations

import atexit
import dataclasses
import json
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tensorboard.compat.proto.summary_pb2 import Summary
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

from common import distributed
from common.cli import notice, one_line
from common.errors import UsageError
from common.resident_memory import rss_mb
from common.run_folder import write_atomically
from common.wandb_file import TransactionLog

WANDB_RUN_FILE = "wandb_run.json"
"""In a tracked run's folder: its wandb id, which a resumed run continues (`WandbHistory`)."""

WANDB_PLAIN = (int, float, str, bool)
"""The values of a row a checkpoint can hold (not a video's)"""


class RunWriter(SummaryWriter):
    """The run's TensorBoard writer; with --track (`wandb_history`), the rows that go to wandb are
    kept beside it."""

    def __init__(self, log_dir: Path, purge_step: int | None, wandb_history: WandbHistory | None):
        super().__init__(str(log_dir), purge_step=purge_step)
        self.wandb_history = wandb_history


def _row_kind(step: int, values: dict[str, Any]) -> tuple[int, tuple[str, ...]]:
    return step, tuple(sorted(values))


class WandbHistory:
    """A tracked run's wandb history, logged directly (TensorBoard's sync would copy the event
    files, nested, and keep one value per tag of each event): one row per episode, per iteration,
    per evaluation episode and per video, each with its `global_step`, the x-axis of every key, in
    the order of their steps. Rows wait for `send`, once per iteration and at each checkpoint.

    After a kill, nothing is lost and nothing is sent twice. wandb-core writes what it was sent to
    the run's transaction log (`common.wandb_file`) some time later, so what a killed run sent last
    may never have reached it. A checkpoint therefore holds the rows not yet seen in the file (with
    the other rows of their steps), from `checkpoint_state`. A resumed run (`resumed_from`: its
    first step, `tail`: the checkpoint's rows) continues the wandb run of `wandb_run.json`, counts
    the rows of each step and keys that the earlier parts' files hold from its first step on, and
    sends the checkpoint's rows and then its own, but for as many of each step and keys as those
    files hold already (the killed run may have written rows past its checkpoint)."""

    def __init__(
        self, run_path: Path, args: Any, resumed_from: int | None = None, tail: str | None = None
    ):
        import wandb

        self.state_file = run_path / WANDB_RUN_FILE
        resumed = resumed_from is not None and self.state_file.is_file()
        run_id = json.loads(self.state_file.read_text()).get("id") if resumed else None
        self.rows: list[dict[str, Any]] = []  # waiting for `send`
        self.last_step = 0  # of the last row added
        # the earlier parts' rows, by step and keys, from this part's first step on
        self.written: Counter = Counter()
        from_step = min([resumed_from or 0, *self._steps(tail)])
        for path in self._parts(run_path, run_id):
            for row in self._readable_rows(path):
                if row.get("global_step", -1) >= from_step:
                    self.written[_row_kind(row["global_step"], self._values(row))] += 1
        self.added: Counter = Counter()  # of those kinds, rows this part added
        # Rows added (sent or found written) from the first step whose rows the file may lack, and
        # how many of the rows sent are not yet in it.
        self.unconfirmed: list[dict[str, Any]] = []
        self.sent_unconfirmed: list[int] = []  # their steps, in order
        try:
            run = wandb.init(
                project=args.wandb_project_name,
                entity=args.wandb_entity,
                name=run_path.name,
                id=run_id,  # None: a new run, whose id wandb draws
                resume="allow",
                dir=str(run_path),
                save_code=True,
            )
        except wandb.errors.UsageError as error:  # no API key, with no terminal to ask for one
            raise UsageError(
                f"--track: wandb: {one_line(str(error)).rstrip('.')}; or log offline: WANDB_MODE=offline"
            ) from None
        self.run_id: str = run.id
        self.log = TransactionLog(Path(run.settings.sync_file))
        # A resumed run's flags that the command line decides (--resume, --track) differ from the
        # first part's.
        run.config.update(dataclasses.asdict(args), allow_val_change=True)
        wandb.define_metric("global_step")
        wandb.define_metric("*", step_metric="global_step")
        write_atomically(self.state_file, json.dumps({"id": self.run_id}).encode())
        for row in json.loads(tail) if tail else ():
            self.add(row["global_step"], self._values(row))
        # an error that ends the run sends what waits (before wandb's own exit handler)
        atexit.register(self.send)

    @staticmethod
    def _parts(run_path: Path, run_id: str | None) -> list[Path]:
        """The transaction logs of the earlier parts of the wandb run `run_id` (in `wandb/`, whose
        `latest-run` links to one of them)."""
        if run_id is None:
            return []
        paths = run_path.glob(f"wandb/*/run-{run_id}.wandb")
        return [path for path in paths if not path.parent.is_symlink()]

    @staticmethod
    def _steps(tail: str | None) -> list[int]:
        return [row["global_step"] for row in json.loads(tail)] if tail else []

    @staticmethod
    def _values(row: dict[str, Any]) -> dict[str, Any]:
        """A row's own values: without its step, and without wandb's `_step`, `_runtime`..."""
        return {key: value for key, value in row.items() if key != "global_step" and key[0] != "_"}

    @staticmethod
    def _readable_rows(path: Path) -> list[dict[str, Any]]:
        try:
            return TransactionLog(path).new_rows()
        except ValueError as exc:
            notice(f"{path} cannot be read ({exc}): its rows may be sent again")
            return []

    def add(self, step: int, values: dict[str, Any]) -> None:
        """One row at `step` (a global step), unless an earlier part of the run wrote it already."""
        self.last_step = step
        row = {**values, "global_step": step}
        kind = _row_kind(step, values)
        on_file = self.written[kind] > self.added[kind] if kind in self.written else False
        self.added[kind] += kind in self.written
        if all(isinstance(value, WANDB_PLAIN) for value in values.values()):
            self.unconfirmed.append(row)
        if not on_file:
            self.rows.append(row)

    def send(self) -> None:
        """Log the waiting rows to wandb, in the order they came (never with wandb's `step=`: rows
        of one step would merge into one)."""
        import wandb

        if not self.rows or wandb.run is None:
            return
        for row in self.rows:
            wandb.log(row)
            self.sent_unconfirmed.append(row["global_step"])
        self.rows = []
        self._confirm()

    def _confirm(self) -> None:
        """Forget the rows the transaction log holds now, but for the rows of the steps of those it
        does not hold yet."""
        written = len(self.log.new_rows())
        del self.sent_unconfirmed[:written]
        first = self.sent_unconfirmed[0] if self.sent_unconfirmed else self.last_step + 1
        self.unconfirmed = [row for row in self.unconfirmed if row["global_step"] >= first]

    def checkpoint_state(self) -> str:
        """After `send`: the rows a checkpoint holds, as JSON text: those sent but not yet in the
        transaction log, with every row of their steps (the file holds the rows before them)."""
        self._confirm()
        return json.dumps(self.unconfirmed)


def wandb_history(writer: SummaryWriter | None) -> WandbHistory | None:
    """The wandb rows of a tracked run's writer; None without --track (or without a writer)."""
    return getattr(writer, "wandb_history", None)


def start_tracking(
    run_path: Path, args: Any, purge_step: int | None = None, wandb_tail: str | None = None
) -> RunWriter:
    """The run's writer, with the `hyperparameters` table CleanRL writes; `args` is the script's
    dataclass, and with `args.track` the run's wandb history (its args are the wandb config; wandb
    does not take TensorBoard's text).

    A resumed run passes `purge_step`, the first step it logs: TensorBoard's readers then drop what
    the interrupted run logged from that step on, and wandb's run goes on, sending the checkpoint's
    `wandb_tail` first (see `WandbHistory`). The
    writer is also closed at exit, so a crash keeps the last records."""
    config = dataclasses.asdict(args)
    history = WandbHistory(run_path, args, purge_step, wandb_tail) if args.track else None
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

"""What `train(args)` of every script returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch.nn as nn

from common import distributed


@dataclass
class TrainResult:
    agent: nn.Module
    """the trained agent (on the training device)"""
    global_step: int
    """environment steps taken, over all envs"""
    run_dir: Path
    """the run's folder: TensorBoard events, checkpoints, videos"""
    episode_returns: list[float] = field(default_factory=list)
    """the return of every finished training episode, in order"""
    episode_lengths: list[int] = field(default_factory=list)
    """the length of every finished training episode, in order"""
    eval_returns: list[float] = field(default_factory=list)
    """returns of the evaluation episodes after training"""
    checkpoint: Path | None = None
    """the last checkpoint written, if any"""
    start_step: int = 0
    """the step this session started from (a resumed run's checkpoint's)"""
    run_episodes: tuple[int, tuple[float, ...]] = (0, ())
    """the episodes the run finished over all its sessions, and the returns of the last 100"""

    def summary(self) -> str:
        """One line for the end of a command-line run: the run's, over all its sessions."""
        episodes, last_returns = self.run_episodes
        line = f"{self.run_dir}: {self.global_step} steps, {episodes} episodes"
        if self.start_step:
            this_session = (
                f"{len(self.episode_returns)} in this session, from step {self.start_step}"
            )
            ended = self.start_step == self.global_step
            line += f" ({'it had ended: this session trained nothing' if ended else this_session})"
        if last_returns:
            line += f", last-100 return {np.mean(last_returns):.2f}"
        if self.eval_returns:
            line += (
                f", eval return {np.mean(self.eval_returns):.2f} +- {np.std(self.eval_returns):.2f}"
            )
        return line

    def print_summary(self) -> None:
        """Print `summary()`: under torchrun on rank 0 alone."""
        if distributed.is_main():
            print(self.summary())

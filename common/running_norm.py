"""Observation normalisation kept inside the agent, where it is saved with the weights and frozen in
evaluation.

Gymnasium's NormalizeObservation cannot serve here: as a vector wrapper it refuses SAME_STEP
autoreset, and per env it keeps one set of statistics for each env."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.nn as nn

from common import distributed


class RunningNorm(nn.Module):
    """Normalises inputs by a running mean and variance, then clips them. The statistics are
    buffers, so they live in the state dict (and checkpoints); they change only when `update` is
    called, which only training does."""

    def __init__(
        self,
        size: int,
        clip: float = 10.0,
        epsilon: float = 1e-8,
        as_is: slice | None = None,
        scaled_only: slice | None = None,
    ):
        """`as_is`: features passed unchanged (then clipped); `scaled_only`: features divided by
        their running root mean square, not shifted. Both are for inputs whose statistics follow the
        policy, such as its previous action."""
        super().__init__()
        self.register_buffer("mean", torch.zeros(size, dtype=torch.float64))
        self.register_buffer("var", torch.ones(size, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(1e-4, dtype=torch.float64))
        self.clip, self.epsilon = clip, epsilon
        self.every_feature = as_is is None and scaled_only is None
        kept, root_mean_square = (
            torch.zeros(size, dtype=torch.bool),
            torch.zeros(size, dtype=torch.float64),
        )
        kept[as_is or slice(0)], root_mean_square[scaled_only or slice(0)] = True, 1.0
        # derivable, but kept: one operation fewer in every call
        centred = (1.0 - root_mean_square) * ~kept
        for name, value in (
            ("kept", kept),
            ("root_mean_square", root_mean_square),
            ("centred", centred),
        ):
            # not state: they come from the arguments
            self.register_buffer(name, value, persistent=False)

    def update(self, batch: torch.Tensor) -> None:
        """Merge the statistics of `batch` (rows are samples), of every rank's under torchrun, into
        the running ones: an all-reduce there, so every rank calls it, with its own batch."""
        self.merge(*distributed.moments(batch))

    def merge(self, batch_mean: torch.Tensor, batch_var: torch.Tensor, batch_count: int) -> None:
        """Merge a batch's mean, (biased) variance and count into the running statistics (Chan et
        al.'s parallel update), as `update` gives them.
        """
        delta, total = batch_mean - self.mean, self.count + batch_count
        self.mean += delta * batch_count / total
        self.var.copy_(
            (
                self.var * self.count
                + batch_var * batch_count
                + delta**2 * self.count * batch_count / total
            )
            / total
        )
        self.count.copy_(total)

    def shift_and_scale(self) -> tuple[torch.Tensor, torch.Tensor]:
        """What `forward` subtracts from each feature, and what it multiplies the difference by
        (float64)."""
        if self.every_feature:
            return self.mean, torch.rsqrt(self.var + self.epsilon)
        shift = self.mean * self.centred
        # the mean square, where not shifted
        spread = self.var + self.mean**2 * self.root_mean_square
        return shift, torch.rsqrt(spread + self.epsilon).masked_fill(self.kept, 1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shift, scale = self.shift_and_scale()
        return ((x - shift.to(x.dtype)) * scale.to(x.dtype)).clamp(-self.clip, self.clip)

    def numpy_snapshot(self) -> Callable[[np.ndarray], np.ndarray]:
        """`forward` at the current statistics, in NumPy (see common.numpy_snapshot)."""
        shift, scale = (
            value.to("cpu", torch.float32).numpy().copy() for value in self.shift_and_scale()
        )
        clip = np.float32(self.clip)
        return lambda x: np.clip((x - shift) * scale, -clip, clip)

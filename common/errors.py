"""The errors a script reports as one `error:` line: bad input (exit status 2) and a run stopped by
a check (1)."""

from __future__ import annotations

from collections.abc import Iterable

import torch


class UsageError(Exception):
    """Bad input: one `error:` line on stderr and exit status 2, before anything is built or
    written."""


class RunStopped(Exception):
    """Training stopped on a check that failed during the run (exit status 1); the last good
    checkpoint is kept."""


class TrainingDiverged(RunStopped):
    """A loss or parameter became NaN or inf."""


class PolicyMismatch(RunStopped):
    """The rollout acted with another policy than the one whose log-probabilities the update uses."""


def check_finite(
    parameters: Iterable[torch.Tensor], global_step: int, **losses: torch.Tensor
) -> None:
    """Raise TrainingDiverged if a parameter is NaN or inf (where a NaN or inf loss ends up), naming
    the update's step and its last minibatch's `losses`. Once per update: on a GPU every check waits
    for the device."""
    if not torch.stack([torch.isfinite(p).all() for p in parameters]).all():
        last = ", ".join(
            f"{name.replace('_', ' ')} {loss.item():.4g}" for name, loss in losses.items()
        )
        raise TrainingDiverged(
            f"a loss or parameter became NaN or inf in the update at step {global_step} (last minibatch: {last}); "
            "the last good checkpoint is kept"
        )

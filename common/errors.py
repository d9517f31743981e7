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


class NoNumpyForm(Exception):
    """A module or function has no NumPy form in the rollout's NumPy copy of the policy
    (`common.numpy_copy`); the message names it. The rollout then acts with torch."""


class PolicyMismatch(RunStopped):
    """The rollout acted with another policy than the one whose log-probabilities the update uses."""


def check_finite(
    parameters: torch.nn.Module | Iterable[torch.Tensor],
    global_step: int,
    page: str | None = None,
    **losses: torch.Tensor,
) -> None:
    """Raise TrainingDiverged if a parameter is NaN or inf (where a NaN or inf loss ends up), naming
    the update's step, the first such parameter (by name, given the module), its last minibatch's
    `losses`, the likely cause and where the fix goes (`page`, the script's docs). Once per update:
    on a GPU every check waits for the device."""
    named = (
        list(parameters.named_parameters())
        if isinstance(parameters, torch.nn.Module)
        else [(f"parameter {i}", p) for i, p in enumerate(parameters)]
    )
    finite = torch.stack([torch.isfinite(p).all() for _, p in named])
    if finite.all():
        return
    first = named[int((~finite).nonzero()[0, 0])][0]
    last = ", ".join(f"{name.replace('_', ' ')} {loss.item():.4g}" for name, loss in losses.items())
    infinite = [name.replace("_", " ") for name, loss in losses.items() if not torch.isfinite(loss)]
    cause = (
        f"the {' and the '.join(infinite)} went first: a term that can be infinite (a log of zero, a division by "
        "what can be zero), or a NaN reward or observation that reached it"
        if infinite
        else "the losses stayed finite, so a step moved it: a learning rate or a loss scale too large for the edit"
    )
    section = f' ({page}, "When a check stops a run")' if page else ""
    raise TrainingDiverged(
        f"a loss or parameter became NaN or inf in the update at step {global_step}, first {first} (last "
        f"minibatch: {last}); {cause}; the fix goes in the loss or the update in train(){section}; the last good "
        "checkpoint is kept"
    )

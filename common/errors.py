"""The errors a script reports as one `error:` line: bad input (exit status 2) and a run stopped by a check (1)."""


class UsageError(Exception):
    """Bad input: one `error:` line on stderr and exit status 2, before anything is built or written."""


class RunStopped(Exception):
    """Training stopped on a check that failed during the run (exit status 1); the last good checkpoint is kept."""


class TrainingDiverged(RunStopped):
    """A loss or parameter became NaN or inf."""


class PolicyMismatch(RunStopped):
    """The rollout acted with another policy than the one whose log-probabilities the update uses."""

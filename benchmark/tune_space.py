"""The search space of a sweep (`python -m benchmark tune`, docs/tune.md): which flags of a script vary, over what.

A space is a list of lines, one per flag, on the command line (``--space learning-rate=log:1e-5:1e-2``) or in a small
text file (one such line each; ``#`` starts a comment):

- ``FLAG=float:LOW:HIGH`` a float, uniform in [LOW, HIGH]; ``FLAG=log:LOW:HIGH`` the same on a log scale (LOW > 0);
- ``FLAG=int:LOW:HIGH`` an integer in [LOW, HIGH]; ``FLAG=choice:A,B,...`` one of the values as the flag takes them
  (``true``/``false`` for a toggle, ``None`` for an optional value).

FLAG is the script's flag without its dashes (``learning-rate`` or ``learning_rate``). A space is checked against
the script before any trial starts: a flag it does not have, an empty range, or an end of a range (each choice) that
the script refuses is a `UsageError`, which the command prints as one ``error:`` line."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from benchmark.registry import load_script, resolve_args
from common.errors import UsageError
from common.run_start import usage_errors

Kind = Literal["float", "log", "int", "choice"]

DEFAULT_SPACES: dict[str, tuple[str, ...]] = {
    "ppo_fc": (
        "learning-rate=log:1e-5:3e-3", "update-epochs=int:1:10", "num-minibatches=choice:1,2,4,8",
        "clip-coef=float:0.05:0.4", "ent-coef=float:0:0.05", "gae-lambda=float:0.8:0.99",
        "hidden-size=choice:32,64,128,256",
    ),
    "ppo_lstm": (
        "learning-rate=log:1e-5:3e-3", "update-epochs=int:1:10", "num-minibatches=choice:1,2,4",
        "clip-coef=float:0.05:0.4", "ent-coef=float:0:0.05", "gae-lambda=float:0.8:0.99",
        "rnn-hidden-size=choice:32,64,128,256", "bptt-len=choice:0,16,32,64",
    ),
    "ppo_transformer": (
        "learning-rate=log:1e-5:3e-3", "update-epochs=int:1:10", "num-minibatches=choice:1,2,4",
        "clip-coef=float:0.05:0.4", "ent-coef=float:0:0.05", "gae-lambda=float:0.8:0.99",
        "d-model=choice:32,64,128", "n-layers=int:1:4", "context-len=choice:8,16,32,64",
    ),
    "ddpg": (
        "learning-rate=log:1e-5:3e-3", "tau=log:1e-3:5e-2", "batch-size=choice:64,128,256,512",
        "exploration-noise=float:0.05:0.5", "noise=choice:gaussian,ou", "hidden-size=choice:64,128,256,512",
    ),
}  # fmt: skip
"""each script's default space: PPO's learning rate, epochs, minibatches, clip, entropy and GAE
lambda, and the script's own sizes (the cell and its BPTT length, the transformer's width, depth and
window, DDPG's noise)"""


@dataclass(frozen=True)
class Param:
    """One flag of the space and the values it may take."""

    field: str
    """the script's `Args` field (learning_rate)"""
    kind: Kind
    low: float = 0.0
    high: float = 0.0
    choices: tuple[str, ...] = ()
    """for a choice: the values as the command line writes them"""

    @property
    def line(self) -> str:
        """The space's line for the flag, as `parse_param` reads it."""
        values = ",".join(self.choices) if self.kind == "choice" else f"{self.low!r}:{self.high!r}"
        return f"{self.field.replace('_', '-')}={self.kind}:{values}"

    @property
    def flag(self) -> str:
        return "--" + self.field.replace("_", "-")

    def suggest(self, trial: Any) -> Any:
        """A value for an Optuna trial (a choice's value is its text, as the command line takes it)."""
        if self.kind == "choice":
            return trial.suggest_categorical(self.field, list(self.choices))
        if self.kind == "int":
            return trial.suggest_int(self.field, int(self.low), int(self.high))
        return trial.suggest_float(self.field, self.low, self.high, log=self.kind == "log")

    def flags(self, value: Any) -> list[str]:
        """The command-line flags that set the field to `value` (a toggle: --flag or --no-flag)."""
        if str(value).lower() in ("true", "false"):
            return [self.flag if str(value).lower() == "true" else "--no-" + self.flag[2:]]
        return [self.flag, str(value)]

    def value_of(self, setting: Any) -> Any:
        """`setting`, a value of the field, as this parameter's value (a choice's text); None if
        outside the space."""
        if self.kind == "choice":
            text = str(setting).lower() if isinstance(setting, bool) else str(setting)
            return text if text in self.choices else None
        if (
            isinstance(setting, bool)
            or not isinstance(setting, (int, float))
            or not self.low <= setting <= self.high
        ):
            return None
        return int(setting) if self.kind == "int" else float(setting)

    def ends(self) -> list[Any]:
        """The values the script is asked about before a trial starts: a range's ends, or every
        choice."""
        if self.kind == "choice":
            return list(self.choices)
        return [int(self.low), int(self.high)] if self.kind == "int" else [self.low, self.high]


def parse_param(line: str, fields: set[str]) -> Param:
    """One line of a space (``FLAG=KIND:...``) as a `Param` of a script whose `Args` has `fields`."""
    flag, _, spec = line.strip().partition("=")
    field = flag.strip().lstrip("-").replace("-", "_")
    kind, _, values = spec.strip().partition(":")
    where = f"search space {line.strip()!r}"
    if not spec or kind not in ("float", "log", "int", "choice"):
        raise UsageError(
            f"{where}: write FLAG=float:LOW:HIGH, log:LOW:HIGH, int:LOW:HIGH or choice:A,B"
        )
    if field not in fields:
        raise UsageError(f"{where}: the script has no flag --{field.replace('_', '-')}")
    if kind == "choice":
        choices = tuple(value.strip() for value in values.split(",") if value.strip())
        if not choices:
            raise UsageError(f"{where}: no values to choose from")
        return Param(field, kind, choices=choices)
    try:
        low, high = (float(value) for value in values.split(":"))
    except ValueError:
        raise UsageError(f"{where}: a range is LOW:HIGH, two numbers") from None
    if kind == "int" and (low != int(low) or high != int(high)):
        raise UsageError(f"{where}: an int range's ends are integers")
    if not low < high:
        raise UsageError(f"{where}: an empty range (LOW must be below HIGH)")
    if kind == "log" and low <= 0:
        raise UsageError(f"{where}: a log range starts above 0")
    return Param(field, kind, low, high)


def space_lines(lines: list[str], files: list[Path]) -> list[str]:
    """The lines of a space given on the command line and in files (comments and blank lines left
    out)."""
    from_files = []
    for path in files:
        try:
            text = path.read_text()
        except OSError as error:
            raise UsageError(f"cannot read search space file {path}: {error.strerror}") from None
        from_files += [line.split("#")[0].strip() for line in text.splitlines()]
    return [line for line in [*from_files, *lines] if line.strip()]


def build_space(script: str, lines: list[str], base_flags: list[str]) -> list[Param]:
    """The space of `script` from `lines` (its default space when none), checked against the script:
    the script accepts each end of each range (each choice) with `base_flags`, as its own
    `check_args` would at start-up."""
    module = load_script(script)
    fields = {field.name for field in dataclasses.fields(module.Args)}
    params = [parse_param(line, fields) for line in (lines or DEFAULT_SPACES[script])]
    names = [param.field for param in params]
    if len(set(names)) < len(names):
        raise UsageError(
            f"search space: a flag is given twice ({', '.join(sorted(n for n in names if names.count(n) > 1))})"
        )
    for param in params:
        for value in param.ends():
            try:
                check_args = usage_errors(module.check_args)  # as the script's Run calls it
                check_args(resolve_args(script, [*base_flags, *param.flags(value)]))
            except UsageError as error:
                raise UsageError(
                    f"search space: {script}.py refuses {' '.join(param.flags(value))}: {error}"
                ) from None
    return params

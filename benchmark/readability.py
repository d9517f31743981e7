"""How each script reads, in the numbers issue 40 sets goals for: ``python -m
benchmark.readability``.

Per script: lines, characters, lines over 100 characters, the length of `train()` and the line it
starts at, and where `env_id` comes among the fields of `Args`. Prints a markdown table (issue 40's
goals: `train()` at most 170 lines, at most 15 lines over 100 characters, no script longer in
characters than before)."""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

from benchmark.registry import REPO, SCRIPTS

LONG_LINE = 100


@dataclass(frozen=True)
class Reading:
    """The numbers of one script."""

    script: str
    lines: int
    characters: int
    long_lines: int
    """lines over `LONG_LINE` characters"""
    train_lines: int | None
    train_start: int | None
    args_fields: int | None
    env_id_position: int | None
    """1 for the first field of `Args`"""


def read(path: Path) -> Reading:
    """The numbers of the script at `path` (None where it has no `train()` or `Args`)."""
    text = path.read_text()
    tree = ast.parse(text)
    train = next(
        (node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "train"),
        None,
    )
    args = next(
        (node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "Args"), None
    )
    fields = (
        [node.target.id for node in args.body if isinstance(node, ast.AnnAssign)] if args else []
    )
    lines = text.splitlines()
    return Reading(
        path.stem,
        len(lines),
        len(text),
        sum(len(line) > LONG_LINE for line in lines),
        train.end_lineno - train.lineno + 1 if train else None,
        train.lineno if train else None,
        len(fields) if args else None,
        fields.index("env_id") + 1 if "env_id" in fields else None,
    )


COLUMNS = ("lines", "characters", "lines over 100", "`train()` lines", "`train()` starts at", "`Args` fields",
           "`env_id` is field")  # fmt: skip


def table(readings: list[Reading]) -> list[str]:
    """A markdown table of `readings`, a row each."""
    rows = ["| script | " + " | ".join(COLUMNS) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
    for r in readings:
        values = [r.lines, f"{r.characters:,}", r.long_lines, r.train_lines, r.train_start, r.args_fields,
                  r.env_id_position]  # fmt: skip
        rows.append(
            f"| {r.script} | " + " | ".join("-" if v is None else str(v) for v in values) + " |"
        )
    return rows


if __name__ == "__main__":
    print("\n".join(table([read(REPO / f"{name}.py") for name in (sys.argv[1:] or SCRIPTS)])))

"""How each script reads, in the numbers issue 40 sets goals for: ``python -m
benchmark.readability``.

Per script: lines, characters, lines over 100 characters, the length of `train()` and the line it
starts at, and where `env_id` comes among the fields of `Args`. Prints a markdown table (issue 40's
goals: `train()` at most 170 lines, at most 15 lines over 100 characters, no script longer in
characters than before)."""

from __future__ import annotations

import argparse
import ast
import importlib
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from types import CodeType, FrameType

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


def common_names(path: Path) -> tuple[list[str], list[str]]:
    """The names a script imports from `common/` (a module imported whole counts once), and the
    names of `common/` it uses: functions, classes and constants imported by name or reached as
    `module.name` (issue 52's count: at most 12)."""
    tree = ast.parse(path.read_text())
    imported, modules, used = [], {}, set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "common":
            for alias in node.names:
                imported.append(f"{node.module}.{alias.name}")
                if node.module == "common":
                    modules[alias.asname or alias.name] = f"common.{alias.name}"
                else:
                    used.add(f"{node.module}.{alias.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id in modules:
                used.add(f"{modules[node.value.id]}.{node.attr}")
    return sorted(imported), sorted(used)


def _loop_with_env_step(train: ast.FunctionDef) -> tuple[list[ast.stmt], ast.stmt]:
    """The body of the innermost loop of `train` that calls `<...>envs.step(...)`, and that call's
    statement in it."""
    for loop in sorted(
        (node for node in ast.walk(train) if isinstance(node, ast.For)), key=lambda n: -n.lineno
    ):
        for statement in loop.body:
            for call in (n for n in ast.walk(statement) if isinstance(n, ast.Call)):
                func = call.func
                if isinstance(func, ast.Attribute) and func.attr == "step":
                    if ast.unparse(func.value).endswith("envs"):
                        return loop.body, statement
    raise ValueError("train() has no loop that calls envs.step")


def _names(node: ast.AST, context: type) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, context)}


def _assigned(statement: ast.stmt) -> set[str]:
    """The names a statement assigns, in its branches too, an item of an array included
    (`actions[step] = ...`)."""
    names = set()
    for node in ast.walk(statement):
        targets = getattr(node, "targets", None) or [getattr(node, "target", None)]
        for target in (
            targets if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign) else ()
        ):
            while isinstance(target, ast.Subscript | ast.Attribute):
                target = target.value
            names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
    return names


def action_statements(train: ast.FunctionDef) -> tuple[list[ast.stmt], list[ast.stmt]]:
    """The statements of the rollout step that compute the action `envs.step` takes (a backward
    slice through the loop's body), and the statements of `train` before the loop that made the
    functions those statements call (`act = rollout_policy(...)`)."""
    body, env_step = _loop_with_env_step(train)
    needed = set().union(*(_names(arg, ast.Load) for arg in env_step.value.args))
    path: list[ast.stmt] = []
    for statement in reversed(body[: body.index(env_step)]):
        if _assigned(statement) & needed:
            path.insert(0, statement)
            needed |= _names(statement, ast.Load)
    called = {
        n.func.id
        for statement in path
        for n in ast.walk(statement)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
    }
    makers = [
        statement
        for statement in ast.walk(train)
        if isinstance(statement, ast.Assign | ast.AnnAssign)
        and statement.lineno < body[0].lineno
        and _assigned(statement) & called
    ]
    return path, makers


def _top_level_name(code: CodeType) -> str:
    """The function a reader opens to read `code`: the outermost def around it."""
    name = code.co_qualname.split(".<locals>")[0]
    return f"<lambda> line {code.co_firstlineno}" if name == "<lambda>" else name


def _repo_code(code: CodeType) -> bool:
    path = Path(code.co_filename)
    return path.is_relative_to(REPO) and not path.is_relative_to(REPO / ".venv")


PATH_FLAGS = {"ddpg": {"learning_starts": 0}}
"""Settings other than the defaults for measuring the path: ddpg's actor acts once learning starts"""


def action_path(script: str) -> list[str]:
    """The functions a reader opens to follow the rollout's action from `train()` to `envs.step`,
    with default flags on CartPole-v1 (Pendulum-v1 for ddpg), as `file: function`, measured by
    running one iteration: `train` itself, the functions executed while the statements of
    `action_statements` run (grouped by the outermost def around them), and the functions those
    statements' makers call directly."""
    module_path = REPO / f"{script}.py"
    train = next(
        n for n in ast.parse(module_path.read_text()).body if getattr(n, "name", "") == "train"
    )
    path, makers = action_statements(train)
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    module = importlib.import_module(script)
    args = module.Args()
    env_id = "Pendulum-v1" if script == "ddpg" else "CartPole-v1"
    batch = args.num_envs * getattr(args, "num_steps", 1)
    settings = {"env_id": env_id, "total_timesteps": batch, "progress": False, "save_model": False}
    settings |= {"eval_episodes": 0, **PATH_FLAGS.get(script, {})}
    seen: dict[str, str] = {f"{script}.py: train": ""}

    def lines(statements: list[ast.stmt]) -> Iterator[int]:
        for statement in statements:
            yield from range(statement.lineno, statement.end_lineno + 1)

    on_path, in_makers = set(lines(path)), set(lines(makers))

    def profile(frame: FrameType, event: str, _arg: object) -> None:
        if event != "call" or not _repo_code(frame.f_code):
            return
        caller, depth = frame.f_back, 1
        while caller is not None and caller.f_code is not train_code:
            caller, depth = caller.f_back, depth + 1
        if caller is None:
            return
        if caller.f_lineno in on_path or (caller.f_lineno in in_makers and depth == 1):
            file = Path(frame.f_code.co_filename).relative_to(REPO)
            seen.setdefault(f"{file}: {_top_level_name(frame.f_code)}", "")

    train_code = module.train.__code__
    with tempfile.TemporaryDirectory() as folder:
        sys.setprofile(profile)
        try:
            module.train(replace(args, **settings, run_dir=folder))
        finally:
            sys.setprofile(None)
    return list(seen)


def main() -> None:
    parser = argparse.ArgumentParser(
        description="How each script reads, in the numbers issue 40 sets goals for."
    )
    parser.add_argument("scripts", nargs="*", help=f"any of {', '.join(SCRIPTS)} (default: all)")
    names = parser.parse_args().scripts or list(SCRIPTS)
    if unknown := sorted(set(names) - set(SCRIPTS)):
        parser.error(f"no such script: {', '.join(unknown)}")
    print("\n".join(table([read(REPO / f"{name}.py") for name in names])))
    print()
    for name in names:
        functions = action_path(name)
        files = sorted({function.split(":")[0] for function in functions})
        print(f"{name}: the action's path, {len(functions)} functions in {len(files)} files:")
        print("    " + "; ".join(functions))
    print()
    for name in names:
        imported, used = common_names(REPO / f"{name}.py")
        print(
            f"{name}: {len(imported)} names imported from common/, {len(used)} of its names used:"
        )
        print("    " + " ".join(name.removeprefix("common.") for name in used))


if __name__ == "__main__":
    main()

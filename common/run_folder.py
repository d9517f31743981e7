"""Run folders (and trajectory recordings' folders) that never take an earlier run's, and files
written whole."""

from __future__ import annotations

import os
import time
from pathlib import Path

from common.errors import UsageError


def run_name(env_id: str, exp_name: str, seed: int) -> str:
    """CleanRL's run name, `{env_id}__{exp_name}__{seed}__{unix time}`, with `/` and `:` of the env id made safe.

    >>> run_name("popgym:popgym-RepeatPreviousEasy-v0", "ppo_fc", 1).split("__")[:3]
    ['popgym-popgym-RepeatPreviousEasy-v0', 'ppo_fc', '1']
    """
    return f"{env_id.replace('/', '-').replace(':', '-')}__{exp_name}__{seed}__{int(time.time())}"


def create_run_folder(run_dir: str | Path, name: str, ending: str = "") -> Path:
    """Create `run_dir/{name}{ending}` and return it; if it exists (two runs started in the same
    second), `{name}_2{ending}`, `{name}_3{ending}`, ... instead. Creation is atomic: two processes
    never share a folder."""
    try:
        Path(run_dir).mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise UsageError(
            f"--run-dir {str(run_dir)!r} is a file, or inside one: give a folder"
        ) from None
    for suffix in ("", *(f"_{n}" for n in range(2, 10_000))):
        folder = Path(run_dir) / f"{name}{suffix}{ending}"
        try:
            folder.mkdir()
        except FileExistsError:
            continue
        return folder
    raise FileExistsError(f"no free run folder name for {name!r} in {run_dir}")


def write_atomically(path: Path, data: bytes | memoryview) -> None:
    """Write `data` to `path` through a temporary file in the same folder and a rename: a reader, or
    a process killed meanwhile, sees the old file or the new one, never a part."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_bytes(data)
    os.replace(temporary, path)

"""Run folders and output files that never overwrite an earlier run's."""

from __future__ import annotations

import time
from pathlib import Path


def run_name(env_id: str, exp_name: str, seed: int) -> str:
    """CleanRL's run name, `{env_id}__{exp_name}__{seed}__{unix time}`, with `/` and `:` of the env id made safe.

    >>> run_name("popgym:popgym-RepeatPreviousEasy-v0", "ppo_fc", 1).split("__")[:3]
    ['popgym-popgym-RepeatPreviousEasy-v0', 'ppo_fc', '1']
    """
    return f"{env_id.replace('/', '-').replace(':', '-')}__{exp_name}__{seed}__{int(time.time())}"


def create_run_folder(run_dir: str | Path, name: str, ending: str = "") -> Path:
    """Create `run_dir/{name}{ending}` and return it; if it exists (two runs started in the same second),
    `{name}_2{ending}`, `{name}_3{ending}`, ... instead. Creation is atomic: two processes never share a folder."""
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    for suffix in ("", *(f"_{n}" for n in range(2, 10_000))):
        folder = Path(run_dir) / f"{name}{suffix}{ending}"
        try:
            folder.mkdir()
        except FileExistsError:
            continue
        return folder
    raise FileExistsError(f"no free run folder name for {name!r} in {run_dir}")


def unused_path(path: str | Path) -> Path:
    """`path`, or, if a file is there already, the first of `stem_2.ext`, `stem_3.ext`, ... that is free: an
    output file of an earlier run (or of the first part of a resumed run) is never overwritten."""
    path = Path(path)
    candidate, number = path, 1
    while candidate.exists():
        number += 1
        candidate = path.with_name(f"{path.stem}_{number}{path.suffix}")
    return candidate

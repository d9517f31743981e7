"""--check-resume: whether a script, an edited copy above all, resumes exactly. It runs the command's
settings for a few iterations in a fresh process with a checkpoint halfway, resumes that checkpoint
in another fresh process, and compares the two runs' last checkpoints and logged values."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils import _pytree as pytree

from common import distributed
from common.checkpoints import RUN_TIME_FLAGS, load
from common.errors import RunStopped, UsageError

STOP_AFTER = "ONEFILE_RL_STOP_AFTER"
"""the environment variable that stops a run after this iteration as a SIGTERM would"""
MACHINE = ("system/", "perf/", "SPS", "time")
"""logged values that measure the machine, not the run (by a part of their tags): left out"""
SECTION = '(docs/outputs.md, "Does my copy resume exactly?")'


def check_resume(script: str, argv: Sequence[str], args: Any) -> None:
    """Run `script` with the flags `argv` (parsed: `args`) twice from one checkpoint, whole and
    resumed, and print that they agree; else raise RunStopped naming what differs first and what to
    register. PPO scripts: 4 iterations, the checkpoint after 2; ddpg: updates on either side of it
    (its learning starts within the first half), with its replay buffer in the checkpoint."""
    distributed.single_process("--check-resume")
    if args.resume or args.eval_checkpoint:
        raise UsageError("--check-resume starts runs of its own: give it a new run's flags")
    flags = [flag for flag in argv if flag != "--check-resume"]
    if hasattr(args, "num_steps"):
        batch, half = args.num_envs * args.num_steps, 2
    else:  # ddpg: an iteration is a step of every env; updates start within the first half
        batch = args.num_envs
        starts = min(args.learning_starts, args.batch_size)
        half = math.ceil(max(starts, args.batch_size) / batch) + 8
        flags += ["--learning-starts", str(starts)]
    flags += ["--total-timesteps", str(2 * half * batch), "--save-model", "--eval-episodes", "0"]
    flags += ["--no-progress", "--no-track"]
    step = half * batch
    with tempfile.TemporaryDirectory() as folder:
        whole, resumed = Path(folder) / "whole", Path(folder) / "resumed"
        _run([script, *flags, "--run-dir", folder, "--run-name", "whole"])
        # stopped after the first half as by a SIGTERM (its checkpoint: a stop's), then resumed
        _run(
            [script, *flags, "--run-dir", folder, "--run-name", "resumed"],
            {STOP_AFTER: str(half)},
            143,
        )
        _run([script, "--resume", str(resumed / "checkpoints" / "latest.pt"), "--no-progress"])
        differences = _differences(
            load(whole / "checkpoints" / "latest.pt"), load(resumed / "checkpoints" / "latest.pt")
        )
        differences += _logged_differences(whole, resumed)
    if differences:
        raise RunStopped(
            f"{Path(script).name} does not resume exactly: resumed at step {step} in a fresh process, it differs "
            f"from the run that went on, first in {'; '.join(differences[:3])}. State the run keeps outside the "
            "dict train() gives run.start (a second network, its optimizer, an array the loop updates in place) "
            "starts afresh on a resume: give each to that dict (ddpg: a replay buffer's fields to its state and "
            f"restore) {SECTION}"
        )
    print(
        f"{Path(script).name} resumes exactly: resumed at step {step} in a fresh process, its checkpoint at step "
        f"{2 * step} and its logged values equal those of the run that went on"
    )


def stop_after() -> int:
    """The iteration after which this run stops as by a SIGTERM (`STOP_AFTER`), or 0 (none)."""
    return int(os.environ.get(STOP_AFTER, 0))


def _run(command: list[str], env: dict[str, str] | None = None, status: int = 0) -> None:
    environment = {k: v for k, v in os.environ.items() if k != STOP_AFTER} | (env or {})
    done = subprocess.run(
        [sys.executable, *command], capture_output=True, text=True, env=environment
    )
    if done.returncode != status:
        raise RunStopped(
            f"--check-resume: its run stopped (exit status {done.returncode}): "
            f"{done.stderr.strip().splitlines()[-1] if done.stderr.strip() else 'no message'}"
        )


def _differences(whole: dict, resumed: dict) -> list[str]:
    """Where two checkpoints' contents differ, each named by its keys (the run-time flags left out)."""
    flat = []
    for checkpoint in (whole, resumed):
        checkpoint["args"] = {
            k: v for k, v in checkpoint["args"].items() if k not in RUN_TIME_FLAGS
        }
        leaves = pytree.tree_flatten_with_path(checkpoint)[0]
        flat.append(
            {
                ".".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path): x
                for path, x in leaves
            }
        )
    if flat[0].keys() != flat[1].keys():
        return [f"the checkpoint's keys ({sorted(set(flat[0]) ^ set(flat[1]))})"]
    differences = []
    for name, a in flat[0].items():
        b = flat[1][name]
        if not isinstance(a, torch.Tensor | np.ndarray):
            differences += [] if a == b else [f"{name} ({a!r} against {b!r})"]
            continue
        a, b = torch.as_tensor(a), torch.as_tensor(b)
        if a.shape != b.shape or not a.is_floating_point():
            differences += [] if a.shape == b.shape and torch.equal(a, b) else [name]
        elif not torch.equal(a, b):
            differences.append(f"{name} (by up to {(a - b).abs().max().item():.3g})")
    return differences


def _logged_differences(whole: Path, resumed: Path) -> list[str]:
    """The logged values of the resumed run that differ from the whole run's at the same step."""
    logs = [
        EventAccumulator(str(folder), size_guidance={"scalars": 0}) for folder in (whole, resumed)
    ]
    for log in logs:
        log.Reload()
    differences = []
    for tag in logs[1].Tags()["scalars"]:
        if any(part in tag for part in MACHINE):
            continue
        runs = [{} for _ in logs]  # each run's values by step (episodes can end at one step)
        for values, log in zip(runs, logs, strict=True):
            for event in log.Scalars(tag):
                values.setdefault(event.step, []).append(event.value)
        steps = [
            step
            for step in sorted(runs[1])
            if sorted(runs[1][step]) != sorted(runs[0].get(step, []))
        ]
        if steps:
            differences.append(f"the logged {tag} at step {steps[0]}")
    return differences

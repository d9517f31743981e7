"""Benchmark of ppo_fc.py on CartPole-v1: does it learn on every seed, how fast is it, against which baselines.

``python -m benchmark.ppo_fc_bench`` (``--help`` lists the flags) does, in order:
1. the baselines, each in its own process (see benchmark/baselines.py): the raw speed of the vector env with random
   actions, and Stable-Baselines3 PPO with the same settings;
2. one ppo_fc.py process per seed, `--workers` at a time, with a line per finished run; a crashed run is reported
   with the tail of its stderr and the others go on;
3. reads each run's TensorBoard events with TensorBoard's own reader and writes `<out>/results.md` (tables) and
   `<out>/results.json` (the same numbers).

Speed is measured, not asserted, so keep `--workers 1` unless only the returns matter: runs sharing the CPU slow
each other down (two runs on a 2-core machine already do).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from datetime import datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import tyro
from tensorboard.backend.event_processing import event_accumulator

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "ppo_fc.py"
ENV_ID = "CartPole-v1"
STDERR_TAIL_LINES = 15


@dataclass
class Args:
    total_timesteps: int = 500_000
    """env steps of each ppo_fc run"""
    seeds: tuple[int, ...] = (1, 2, 3)
    """the seeds of the ppo_fc runs (one run each)"""
    workers: int = 1
    """ppo_fc runs at a time (more than 1 distorts SPS: the runs share the CPU)"""
    eval_episodes: int = 10
    """deterministic evaluation episodes at the end of each ppo_fc run"""
    threshold: float = 490.0
    """PASS when the mean return of the last 100 training episodes reaches this on every seed"""
    sb3_timesteps: int = 100_000
    """env steps of the Stable-Baselines3 PPO baseline (0: skip it)"""
    env_steps: int = 200_000
    """env steps per measurement of the raw vector-env speed (0: skip it)"""
    env_repeats: int = 3
    """measurements of the raw vector-env speed (the median is reported)"""
    out: str | None = None
    """output folder (default: benchmark/results/<date>_<time>); the runs go to <out>/runs"""


@dataclass
class SeedResult:
    """One ppo_fc run: how its process ended and what its events say."""

    seed: int
    returncode: int
    wall_seconds: float
    run_dir: str | None = None
    steps: int | None = None
    episodes: int | None = None
    last100_return: float | None = None
    eval_return: float | None = None
    eval_episodes: int | None = None
    sps: float | None = None
    """steps / wall time between the first and the last charts/SPS record (excludes iteration 1 and evaluation)"""
    logged_sps: float | None = None
    """the last charts/SPS value, ppo_fc's own figure: steps / time since the training loop started"""
    peak_rss_mb: float | None = None
    rollout_seconds: float | None = None
    update_seconds: float | None = None
    error: str | None = None

    def passed(self, threshold: float) -> bool:
        return self.error is None and self.last100_return is not None and self.last100_return >= threshold


def ppo_fc_flags(args: Args, seed: int | str, runs_dir: Path) -> list[str]:
    """The command-line flags of one ppo_fc run."""
    return [
        "--env-id",
        ENV_ID,
        "--total-timesteps",
        str(args.total_timesteps),
        "--seed",
        str(seed),
        "--run-dir",
        str(runs_dir),
        "--no-progress",
        "--eval-episodes",
        str(args.eval_episodes),
    ]


def tail(text: str, lines: int = STDERR_TAIL_LINES) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def run_seed(args: Args, seed: int, runs_dir: Path, logs_dir: Path) -> SeedResult:
    """Run ppo_fc.py for one seed in its own process, then summarise the run folder it created."""
    pattern = f"{ENV_ID}__ppo_fc__{seed}__*"
    existing = set(runs_dir.glob(pattern))
    start = time.perf_counter()
    process = subprocess.run(
        [sys.executable, str(SCRIPT), *ppo_fc_flags(args, seed, runs_dir)], cwd=REPO, capture_output=True, text=True
    )
    wall_seconds = time.perf_counter() - start
    (logs_dir / f"seed{seed}.stdout").write_text(process.stdout)
    (logs_dir / f"seed{seed}.stderr").write_text(process.stderr)
    result = SeedResult(seed=seed, returncode=process.returncode, wall_seconds=wall_seconds)
    if process.returncode != 0:
        result.error = f"exit status {process.returncode}:\n{tail(process.stderr) or '(no stderr)'}"
        return result
    created = sorted(set(runs_dir.glob(pattern)) - existing, key=lambda path: path.stat().st_mtime)
    if not created:
        result.error = f"no new run folder matching {pattern} in {runs_dir}"
        return result
    result.run_dir = str(created[-1])
    try:
        summarise_run(created[-1], result)
    except Exception as exc:  # a broken or incomplete event file is reported like a crash
        result.error = f"reading the events of {created[-1]} failed: {exc!r}"
    return result


def read_scalars(run_dir: Path) -> dict[str, list[event_accumulator.ScalarEvent]]:
    """Every scalar record of a run folder, by tag, in the order they were written (no sampling: size guidance 0)."""
    accumulator = event_accumulator.EventAccumulator(str(run_dir), size_guidance={event_accumulator.SCALARS: 0})
    accumulator.Reload()
    return {tag: accumulator.Scalars(tag) for tag in accumulator.Tags()["scalars"]}


def summarise_run(run_dir: Path, result: SeedResult) -> None:
    """Fill `result` from the run's events."""
    scalars = read_scalars(run_dir)
    for tag in ("charts/episodic_return", "charts/SPS"):
        if not scalars.get(tag):
            raise ValueError(f"no {tag} records")
    returns = [event.value for event in scalars["charts/episodic_return"]]
    result.episodes = len(returns)
    result.last100_return = float(np.mean(returns[-100:]))
    eval_returns = [event.value for event in scalars.get("eval/episodic_return", [])]
    if eval_returns:
        result.eval_return, result.eval_episodes = float(np.mean(eval_returns)), len(eval_returns)
    sps_records = scalars["charts/SPS"]
    first, last = sps_records[0], sps_records[-1]
    result.steps = last.step
    result.logged_sps = last.value
    if last.wall_time > first.wall_time:
        result.sps = (last.step - first.step) / (last.wall_time - first.wall_time)
    else:  # a single iteration: only ppo_fc's own figure exists
        result.sps = last.value
    if scalars.get("system/rss_mb"):
        result.peak_rss_mb = max(event.value for event in scalars["system/rss_mb"])
    for tag, name in (("perf/rollout_seconds", "rollout_seconds"), ("perf/update_seconds", "update_seconds")):
        if scalars.get(tag):
            setattr(result, name, float(np.mean([event.value for event in scalars[tag][1:] or scalars[tag]])))


def run_baseline(name: str, options: list[str]) -> dict[str, Any]:
    """Run one subcommand of benchmark.baselines in its own process; its result, or {"error": ...}."""
    command = [sys.executable, "-m", "benchmark.baselines", name, *options]
    start = time.perf_counter()
    process = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    wall_seconds = time.perf_counter() - start
    if process.returncode != 0:
        return {"error": f"exit status {process.returncode}:\n{tail(process.stderr) or '(no stderr)'}"}
    try:
        result = json.loads(process.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"error": f"no JSON result on stdout:\n{tail(process.stdout + process.stderr)}"}
    result["command"] = shlex.join(["python", "-m", "benchmark.baselines", name, *options])
    result["process_seconds"] = wall_seconds
    return result


# Formatting


def fmt(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{value:,.{digits}f}"


def mean_std(values: list[float | None], digits: int = 1) -> str:
    known = [value for value in values if value is not None]
    if not known:
        return "n/a"
    text = f"{np.mean(known):,.{digits}f} ± {np.std(known):,.{digits}f}"
    return text if len(known) == len(values) else f"{text} ({len(known)} of {len(values)} seeds)"


def ratio(numerator: float | None, denominator: float | None) -> str:
    return "n/a" if not numerator or not denominator else f"{numerator / denominator:.3f}"


def package_versions() -> str:
    versions = []
    for package in ("torch", "gymnasium", "numpy", "stable-baselines3", "tensorboard"):
        try:
            versions.append(f"{package} {metadata.version(package)}")
        except metadata.PackageNotFoundError:
            versions.append(f"{package} (not installed)")
    return ", ".join(versions)


def script_digest() -> str:
    """The start of the SHA-256 of ppo_fc.py: which version ran, as the file may be uncommitted."""
    return hashlib.sha256(SCRIPT.read_bytes()).hexdigest()[:12]


def git_revision() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True)
    except OSError:
        return "unknown"
    revision = head.stdout.strip() or "unknown"
    return f"{revision} (uncommitted changes)" if dirty.stdout.strip() else revision


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def peak_rss(seeds: list[SeedResult]) -> float | None:
    return max((result.peak_rss_mb for result in seeds if result.peak_rss_mb is not None), default=None)


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
        *("| " + " | ".join(row) + " |" for row in rows),
    ]


def render(
    args: Args, out: Path, seeds: list[SeedResult], raw: dict[str, Any], sb3: dict[str, Any], script_version: str
) -> str:
    """results.md: the learning table, the speed table, how the numbers are measured, and any failures."""
    passed = bool(seeds) and all(result.passed(args.threshold) for result in seeds)
    runs_dir = out / "runs"
    shown_runs_dir = runs_dir.relative_to(REPO) if runs_dir.is_relative_to(REPO) else runs_dir
    command = shlex.join(["python", SCRIPT.name, *ppo_fc_flags(args, "SEED", shown_runs_dir)])
    lines = [
        f"# ppo_fc benchmark on {ENV_ID}",
        "",
        f"- date: {datetime.now().astimezone().isoformat(timespec='seconds')}; git {git_revision()}; {script_version}",
        f"- machine: {cpu_model()}, {os.cpu_count() or '?'} CPUs; Python {platform.python_version()}; {package_versions()}",
        f"- command: `{command}` for SEED in {' '.join(str(seed) for seed in args.seeds)}; "
        f"{args.workers} run{'s' if args.workers > 1 else ''} at a time",
        f"- threshold: mean return of the last 100 training episodes >= {args.threshold:g} on every seed: "
        f"**{'PASS' if passed else 'FAIL'}**",
        "",
        "## Learning",
        "",
    ]
    rows = [
        [
            str(result.seed),
            fmt(result.steps, 0),
            fmt(result.episodes, 0),
            fmt(result.last100_return),
            fmt(result.eval_return),
            fmt(result.sps, 0),
            fmt(result.logged_sps, 0),
            fmt(result.peak_rss_mb, 0),
            f"{fmt(result.rollout_seconds, 2)} / {fmt(result.update_seconds, 2)}",
            fmt(result.wall_seconds, 0),
            "PASS" if result.passed(args.threshold) else ("CRASH" if result.returncode != 0 else "FAIL"),
        ]
        for result in seeds
    ]
    rows.append(
        [
            "mean ± std",
            "",
            "",
            mean_std([result.last100_return for result in seeds]),
            mean_std([result.eval_return for result in seeds]),
            mean_std([result.sps for result in seeds], 0),
            mean_std([result.logged_sps for result in seeds], 0),
            fmt(peak_rss(seeds), 0) + (" (max)" if peak_rss(seeds) is not None else ""),
            "",
            mean_std([None if result.error else result.wall_seconds for result in seeds], 0),
            "PASS" if passed else "FAIL",
        ]
    )
    header = [
        "seed",
        "steps",
        "episodes",
        "last-100 mean return",
        f"eval return (greedy, {args.eval_episodes} ep)",
        "SPS",
        "logged SPS",
        "peak RSS (MB)",
        "rollout / update (s per iteration)",
        "wall (s)",
        "result",
    ]
    lines += table(header, rows)

    ppo_sps_values = [result.sps for result in seeds if result.sps is not None]
    ppo_sps = float(np.mean(ppo_sps_values)) if ppo_sps_values else None
    raw_sps, sb3_sps = raw.get("sps"), sb3.get("sps")
    sb3_note = ""
    if "sps" in sb3:
        sb3_note = f"{fmt(sb3.get('steps'), 0)} steps, seed {args.seeds[0]}; last-100 mean return {fmt(sb3.get('last100_return'))}"
    raw_note = ""
    if "sps" in raw:
        raw_note = f"median of {raw['repeats']} x {raw['steps']:,} steps: " + ", ".join(
            fmt(value, 0) for value in raw["sps_all"]
        )
    lines += [
        "",
        "## Speed",
        "",
        *table(
            ["what", "SPS", "ppo_fc / this", "peak RSS (MB)", "notes"],
            [
                [
                    "raw vector env (SyncVectorEnv, 4 x CartPole-v1, random actions)",
                    fmt(raw_sps, 0),
                    ratio(ppo_sps, raw_sps),
                    fmt(raw.get("peak_rss_mb"), 0),
                    raw_note or ("skipped (--env-steps 0)" if "skipped" in raw else "failed"),
                ],
                [
                    "Stable-Baselines3 PPO, same settings",
                    fmt(sb3_sps, 0),
                    ratio(ppo_sps, sb3_sps),
                    fmt(sb3.get("peak_rss_mb"), 0),
                    sb3_note or ("skipped (--sb3-timesteps 0)" if "skipped" in sb3 else "failed"),
                ],
                [
                    "ppo_fc (mean over seeds)",
                    fmt(ppo_sps, 0),
                    ratio(ppo_sps, ppo_sps),
                    fmt(peak_rss(seeds), 0),
                    f"{len(ppo_sps_values)} seeds x {fmt(seeds[0].steps if seeds else None, 0)} steps",
                ],
            ],
        ),
        "",
        "## How the numbers are measured",
        "",
        "- Returns come from the runs' TensorBoard events, read with TensorBoard's `EventAccumulator` keeping every "
        "record: last-100 mean = mean of the last 100 `charts/episodic_return` records (every finished episode of "
        "every env); eval return = mean of `eval/episodic_return` (greedy policy after training). mean ± std is over "
        "seeds (population std, numpy's default).",
        "- ppo_fc SPS = (last step - first step) / (wall time between the first and the last `charts/SPS` record): "
        "from the end of iteration 1 to the end of training, so start-up, iteration 1 (warm-up) and the final "
        "evaluation are excluded. Logged SPS = the last `charts/SPS` value, ppo_fc's own steps / time since its "
        "training loop started (includes iteration 1).",
        "- rollout / update = mean `perf/rollout_seconds` / `perf/update_seconds` per iteration after the first; "
        "wall = the whole ppo_fc process (start-up, training, evaluation, checkpoint).",
        "- Peak RSS = the largest `system/rss_mb` record (resident memory sampled once per iteration). Baselines: the "
        "process's peak RSS (`ru_maxrss`).",
        "- Raw env SPS: ppo_fc's env stack (SyncVectorEnv, 4 x CartPole-v1, SAME_STEP autoreset, "
        "RecordEpisodeStatistics) stepped with `envs.action_space.sample()`; 4 env steps per vector step. An upper "
        "bound for any agent on this env stack.",
        "- SB3 SPS: the same span as ppo_fc's (end of iteration 1 to the end of `learn()`), from a callback's clock. "
        "SB3 settings: n_envs 4, n_steps 128, batch 128, 4 epochs, lr 2.5e-4 linear to 0, gamma 0.99, GAE 0.95, "
        "clip 0.2, ent 0.01, vf 0.5, max grad norm 0.5, 64-64 tanh separate actor/critic, 1 torch thread, CPU; "
        "no value clipping (SB3's clip_range_vf is not CleanRL's clip_vloss). Its return is over its own, shorter "
        "run and is not comparable with ppo_fc's.",
        "- Every measurement runs in its own process, one at a time"
        + (" (ppo_fc runs: several at a time, so their SPS are distorted)." if args.workers > 1 else "."),
    ]
    failures = [(f"ppo_fc seed {result.seed}", result.error) for result in seeds if result.error]
    failures += [
        (f"baseline {name}", data["error"]) for name, data in (("raw-env", raw), ("sb3", sb3)) if "error" in data
    ]
    if failures:
        lines += ["", "## Failures", ""]
        for name, error in failures:
            lines += [f"### {name}", "", "```", str(error), "```", ""]
    return "\n".join(lines).rstrip() + "\n"


# Main


def progress(message: str) -> None:
    print(message, flush=True)


def run_seeds(args: Args, out: Path, report: Callable[[str], None]) -> list[SeedResult]:
    runs_dir, logs_dir = out / "runs", out / "logs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    logs_dir.mkdir(parents=True, exist_ok=True)
    results: list[SeedResult] = []
    with ThreadPoolExecutor(max_workers=args.workers) as pool:
        futures = {pool.submit(run_seed, args, seed, runs_dir, logs_dir): seed for seed in args.seeds}
        for done, future in enumerate(as_completed(futures), start=1):
            seed = futures[future]
            try:
                result = future.result()
            except Exception as exc:  # the benchmark itself failed around this run; the others go on
                result = SeedResult(seed=seed, returncode=-1, wall_seconds=0.0, error=repr(exc))
            results.append(result)
            prefix = f"[{done}/{len(args.seeds)}] ppo_fc seed {seed}"
            if result.error:
                report(f"{prefix} FAILED after {result.wall_seconds:.0f} s: {result.error}")
            else:
                verdict = "PASS" if result.passed(args.threshold) else "FAIL"
                report(
                    f"{prefix} done in {result.wall_seconds:.0f} s: last-100 mean return {fmt(result.last100_return)}, "
                    f"eval {fmt(result.eval_return)}, SPS {fmt(result.sps, 0)}, peak RSS {fmt(result.peak_rss_mb, 0)} MB"
                    f" -> {verdict}"
                )
    return sorted(results, key=lambda result: args.seeds.index(result.seed))


def check(args: Args) -> None:
    problems = []
    if args.total_timesteps <= 0:
        problems.append("--total-timesteps must be positive")
    if not args.seeds:
        problems.append("--seeds needs at least one seed")
    if len(set(args.seeds)) != len(args.seeds):
        problems.append("--seeds must be distinct (each seed's run folder is found by its seed)")
    if args.workers < 1:
        problems.append("--workers must be at least 1")
    if min(args.sb3_timesteps, args.env_steps, args.eval_episodes) < 0 or args.env_repeats < 1:
        problems.append("--sb3-timesteps, --env-steps and --eval-episodes must be >= 0, --env-repeats >= 1")
    if not SCRIPT.exists():
        problems.append(f"{SCRIPT} is missing")
    if problems:
        print("error: " + "; ".join(problems), file=sys.stderr)
        sys.exit(2)


def main(args: Args) -> int:
    check(args)
    out = Path(args.out or REPO / "benchmark" / "results" / datetime.now().strftime("%Y-%m-%d_%H%M%S")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    progress(f"benchmark of ppo_fc on {ENV_ID}: results in {out}")
    digest = script_digest()

    raw: dict[str, Any] = {"skipped": True}
    if args.env_steps:
        raw = run_baseline("raw-env", ["--steps", str(args.env_steps), "--repeats", str(args.env_repeats)])
        progress(
            f"baseline raw env: {fmt(raw.get('sps'), 0)} SPS" if "sps" in raw else f"baseline raw env FAILED: {raw}"
        )
    sb3: dict[str, Any] = {"skipped": True}
    if args.sb3_timesteps:
        sb3 = run_baseline("sb3", ["--timesteps", str(args.sb3_timesteps), "--seed", str(args.seeds[0])])
        if "sps" in sb3:
            progress(
                f"baseline SB3 PPO: {fmt(sb3['sps'], 0)} SPS, last-100 mean return {fmt(sb3.get('last100_return'))}"
            )
        else:
            progress(f"baseline SB3 PPO FAILED: {sb3.get('error')}")

    seeds = run_seeds(args, out, progress)

    script_version = f"ppo_fc.py sha256 {digest}"
    if script_digest() != digest:
        script_version = f"ppo_fc.py CHANGED during the benchmark (sha256 {digest}, then {script_digest()})"
        progress(f"warning: {script_version}; the runs may not all be of the same version")
    (out / "results.md").write_text(render(args, out, seeds, raw, sb3, script_version))
    (out / "results.json").write_text(
        json.dumps(
            {
                "args": asdict(args),
                "script_version": script_version,
                "ppo_fc": [asdict(result) for result in seeds],
                "raw_env": raw,
                "sb3": sb3,
            },
            indent=2,
        )
        + "\n"
    )
    passed = all(result.passed(args.threshold) for result in seeds)
    progress(f"{'PASS' if passed else 'FAIL'}: wrote {out / 'results.md'}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main(tyro.cli(Args)))

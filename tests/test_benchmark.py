"""The benchmark harness: the event reader, the case table, and a tiny suite end to end (table, figures, failures)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

import benchmark.__main__ as harness
from benchmark import cases
from benchmark.events import find_run_dirs, summarise_run

REPO = Path(__file__).resolve().parent.parent
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_case_table_lookup():
    full = cases.find_case("ppo_fc", "CartPole-v1")
    assert full.total_timesteps == 500_000 and full.threshold == 490.0
    assert cases.find_case("ppo_fc", "CartPole-v1", 100_000).threshold == 150.0
    shorter = cases.find_case("ppo_fc", "CartPole-v1", 30_000)
    assert shorter.total_timesteps == 30_000 and shorter.threshold is None  # a threshold is for its own length
    unlisted = cases.find_case("ppo_fc", "Acrobot-v1")
    assert unlisted.total_timesteps == cases.DEFAULT_TIMESTEPS and unlisted.threshold is None and not unlisted.flags
    for entries, seeds in cases.SUITES.values():
        assert seeds and all(cases.find_case(*entry).threshold is not None for entry in entries)


def test_baseline_gets_only_the_flags_it_shares_with_the_script():
    case = cases.Case(
        "ppo_fc", "Pendulum-v1", 1000, flags=("--num-envs", "1", "--no-bootstrap-truncation", "--norm-obs")
    )
    assert harness.sb3_flags(case) == ["--num-envs", "1", "--norm-obs"]


def test_tiny_suite_table_figures_and_failures(tmp_path, monkeypatch, capsys):
    # Probe1 pays 1 per episode: a threshold of 0.5 passes, 2.0 cannot; 7 minibatches do not divide 512: a crash.
    table = (
        cases.Case("ppo_fc", "Probe1-v0", 1024, threshold=0.5),
        cases.Case("ppo_fc", "Probe2-v0", 1024, threshold=2.0),
        cases.Case("ppo_fc", "Probe3-v0", 1024, threshold=0.0, flags=("--num-minibatches", "7")),
    )
    monkeypatch.setattr(cases, "CASES", table)
    args = harness.Run(
        envs=("Probe1-v0", "Probe2-v0", "Probe3-v0"),
        seeds=(1, 2),
        total_timesteps=1024,
        eval_episodes=2,
        baselines=True,
        workers=2,
        out=str(tmp_path / "out"),
    )
    assert harness.run(args) == 1
    printed = capsys.readouterr().out
    assert printed.count("ppo_fc Probe") == 6 and "FAILED" in printed  # a line per finished run
    results = (tmp_path / "out" / "results.md").read_text()
    results_section = results.split("## Results")[1].split("##")[0]
    rows = {line.split(" | ")[1]: line for line in results_section.splitlines() if line.startswith("| ppo_fc |")}
    assert rows.keys() == {"Probe1-v0", "Probe2-v0", "Probe3-v0"}
    assert "| 1 2 | 1,024 | 1.0 ± 0.0 | 1.0 ± 0.0 |" in rows["Probe1-v0"] and rows["Probe1-v0"].endswith("| PASS |")
    assert rows["Probe2-v0"].endswith("| FAIL |") and "not reached" in rows["Probe2-v0"]
    assert "1 (failed) 2 (failed)" in rows["Probe3-v0"] and rows["Probe3-v0"].endswith("| FAIL |")
    assert "error: --num-minibatches 7 must divide" in results  # the crash's own message, under Failures
    assert any(line.startswith("| sb3_ppo | Probe1-v0 | 1 2 |") for line in results.splitlines())
    assert "## Speed against the baselines" in results
    for name in ("sps.png", "return_vs_steps_Probe1-v0.png", "return_vs_time_Probe2-v0.png"):
        figure = tmp_path / "out" / name
        assert figure.read_bytes()[:8] == PNG_MAGIC and f"]({name})" in results
    record = json.loads((tmp_path / "out" / "results.json").read_text())
    assert sum(job["error"] is not None for job in record["jobs"]) == 2

    # The same figures for runs made outside the harness.
    plot = subprocess.run(
        [sys.executable, "-m", "benchmark", "plot", str(tmp_path / "out" / "runs"), "--out", str(tmp_path / "plots")],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert plot.returncode == 0, plot.stderr
    plotted = (tmp_path / "plots" / "results.md").read_text()
    assert "| ppo_fc | Probe1-v0 | 1 2 |" in plotted and "| sb3_ppo | Probe2-v0 | 1 2 |" in plotted
    assert (tmp_path / "plots" / "return_vs_steps_Probe2-v0.png").read_bytes()[:8] == PNG_MAGIC


@pytest.mark.parametrize(
    "argv, message",
    [
        (["run", "--scripts", "no_such_script"], "no script no_such_script.py"),
        (["run", "--seeds", "1", "1"], "distinct"),
        (["plot", "/nonexistent-folder"], "no TensorBoard event files"),
    ],
)
def test_bad_input_is_one_error_line(argv, message, tmp_path):
    process = subprocess.run(
        [sys.executable, "-m", "benchmark", *argv, "--out", str(tmp_path / "out")],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert process.returncode == 2
    assert process.stderr.startswith("error: ") and message in process.stderr
    assert len(process.stderr.strip().splitlines()) == 1 and "Traceback" not in process.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "algo, env_id, flags",
    [
        ("recurrent_ppo", "Probe1-v0", ["--num-steps", "64"]),
        ("ddpg", "ContinuousProbe1-v0", ["--num-envs", "1", "--learning-starts", "64", "--batch-size", "32"]),
    ],
)
def test_sb3_baselines_write_runs_the_reader_understands(algo, env_id, flags, tmp_path):
    command = [sys.executable, "-m", "benchmark.baselines", "sb3", "--algo", algo, "--env-id", env_id]
    command += ["--total-timesteps", "1024", "--eval-episodes", "3", "--run-dir", str(tmp_path), *flags]
    process = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    assert process.returncode == 0, process.stderr
    printed = json.loads(process.stdout.strip().splitlines()[-1])
    [run_dir] = find_run_dirs([tmp_path])
    assert Path(printed["run_dir"]).resolve() == run_dir
    run = summarise_run(run_dir)
    assert (run.script, run.env_id, run.seed) == (f"sb3_{algo}", env_id, 1)
    # one-step episodes paying 1, each logged: about one per env step
    assert len(run.episode_returns) >= 1000 and set(run.episode_returns.tolist()) == {1.0}
    assert run.sps is not None and run.peak_rss_mb is not None and run.eval_returns == [1.0, 1.0, 1.0]

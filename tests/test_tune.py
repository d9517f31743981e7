"""`python -m benchmark tune` and `tune-report` (benchmark/tune.py): Optuna sweeps on probe envs, read back from the
journal with Optuna's own client."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from benchmark import tune as tune_module
from benchmark.__main__ import main as harness_main

REPO = Path(__file__).resolve().parent.parent
# Two one-step probes: the random policy scores 0 on both, the right action 1 (probe_envs/probes.py).
PROBES = [
    "--env-id",
    "Probe4-v0",
    "--env-id",
    "Probe5-v0",
    "--target",
    "Probe4-v0=1",
    "--target",
    "Probe5-v0=1",
]
QUICK = ["--steps", "1024", "--flags=--num-envs 4", "--eval-episodes", "5"]


def tune_command(tmp_path: Path, *extra: str, study: str = "probes") -> list[str]:
    storage = ["--storage", str(tmp_path / "tune.journal"), "--out", str(tmp_path / "runs")]
    return [
        sys.executable,
        "-m",
        "benchmark",
        "tune",
        "ppo_fc",
        *PROBES,
        *storage,
        "--study",
        study,
        *extra,
    ]


def load(tmp_path: Path, study: str = "probes") -> optuna.Study:
    storage = tune_module.open_storage(str(tmp_path / "tune.journal"))
    return optuna.load_study(study_name=study, storage=storage)


def descendants(pid: int) -> set[int]:
    """Every living process below `pid`, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except (OSError, ValueError):
            continue
        fields = stat.rpartition(")")[2].split()
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, waiting = set(), [pid]
    while waiting:
        for child in children.get(waiting.pop(), []):
            found.add(child)
            waiting.append(child)
    return found


def living(pids: set[int], seconds: float = 10.0) -> set[int]:
    """Those of `pids` still running (not zombies) after up to `seconds`."""
    deadline = time.time() + seconds
    while True:
        alive = set()
        for pid in pids:
            try:
                if Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z":
                    alive.add(pid)
            except OSError:
                pass
        if not alive or time.time() > deadline:
            return alive
        time.sleep(0.2)


def described(pids: set[int]) -> set[str]:
    """Each of `pids` with its command line, for an assertion's message."""
    found = set()
    for pid in pids:
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        found.add(f"{pid}: {command}")
    return found


def harness(monkeypatch: pytest.MonkeyPatch, *argv: str) -> int:
    monkeypatch.setattr(sys, "argv", ["benchmark", *argv])
    return harness_main()


def test_a_tiny_study_completes_its_best_command_runs_and_a_rerun_adds_trials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    first = subprocess.run(
        tune_command(tmp_path, *QUICK, "--trials", "3", "--workers", "2", "--sampler-seed", "1"),
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert first.returncode == 0, first.stderr
    study = load(tmp_path)
    trials = study.get_trials()
    assert [trial.state for trial in trials] == [TrialState.COMPLETE] * 3
    for trial in trials:
        assert trial.user_attrs["sps"] > 0 and trial.user_attrs["wall_seconds"] > 0
        assert len(trial.user_attrs["scores"]) == 2 and trial.value == pytest.approx(
            sum(trial.user_attrs["scores"]) / 2
        )
        assert set(trial.params) == {p.field for p in tune_module.build_space("ppo_fc", [], [])}
    # The first trial is the yardstick: the script's defaults with --flags.
    space, defaults = (
        tune_module.build_space("ppo_fc", [], []),
        tune_module.resolve_args("ppo_fc", ["--num-envs", "4"]),
    )
    assert trials[0].params == {
        param.field: param.value_of(getattr(defaults, param.field)) for param in space
    }
    assert trials[0].params["learning_rate"] == 2.5e-4 and trials[0].params["hidden_size"] == "64"
    assert {path.name for path in (tmp_path / "runs" / "report").iterdir()} == {
        "history.png", "importances.png", "best_by_wall_clock.png",
    }  # fmt: skip

    # The report prints the best trial's command on each env: it runs, with the trial's settings. (The report and the
    # rerun below in this process: the first sweep ran the command line.)
    capsys.readouterr()
    assert harness(monkeypatch, "tune-report", "--study", "probes", "--storage", str(tmp_path / "tune.journal"),
                   "--out", str(tmp_path / "report")) == 0  # fmt: skip
    report = capsys.readouterr().out
    best = max(trials, key=lambda trial: trial.value)
    assert f"best: trial {best.number}, value {best.value:.4f}" in report
    commands = [
        line.strip() for line in report.splitlines() if line.strip().startswith("python ppo_fc.py")
    ]
    assert [shlex.split(command)[3] for command in commands] == ["Probe4-v0", "Probe5-v0"]
    assert commands[0].endswith(best.user_attrs["flags"])
    run = subprocess.run(
        [sys.executable, *shlex.split(commands[0])[1:], "--no-progress", "--run-dir", str(tmp_path / "best")],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr

    # Rerunning the command continues the study.
    assert harness(monkeypatch, *tune_command(tmp_path, *QUICK, "--trials", "1")[3:]) == 0
    numbers = [trial.number for trial in load(tmp_path).get_trials(states=(TrialState.COMPLETE,))]
    assert numbers == [0, 1, 2, 3]


def test_two_processes_share_a_journal(tmp_path: Path) -> None:
    command = tune_command(
        tmp_path, *QUICK, "--trials", "2", "--random", "Probe4-v0=0", "--random", "Probe5-v0=0"
    )
    processes = [
        subprocess.Popen(
            command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    for process in processes:
        _, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, stderr
    trials = load(tmp_path).get_trials()
    assert sorted(trial.number for trial in trials) == [0, 1, 2, 3]
    assert all(trial.state == TrialState.COMPLETE for trial in trials)
    assert len({trial.user_attrs["host"] for trial in trials}) == 2  # two processes ran them


def test_a_failed_run_fails_its_trial_and_the_study_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    start = tune_module.start_stoppable

    def second_trial_crashes(
        command: list[str], cwd: Path, log_stem: Path, environment: dict
    ) -> subprocess.Popen:
        if "trial-0001" in str(log_stem):
            command = [
                sys.executable,
                "-c",
                "import sys; print('boom: the env broke', file=sys.stderr); sys.exit(3)",
            ]
        return start(command, cwd, log_stem, environment)

    monkeypatch.setattr(tune_module, "start_stoppable", second_trial_crashes)
    arguments = tune_command(tmp_path, *QUICK, "--trials", "3", "--pruner", "none")[3:]
    assert harness(monkeypatch, *arguments) == 0
    states = [trial.state for trial in load(tmp_path).get_trials()]
    assert states == [TrialState.COMPLETE, TrialState.FAIL, TrialState.COMPLETE]
    error = load(tmp_path).get_trials()[1].user_attrs["error"]
    assert "exit status 3" in error and "boom: the env broke" in error
    assert "trial 1 failed" in capsys.readouterr().out


def test_pruning_stops_every_run_of_the_trial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A pruner that stops every trial at its first report; runs long enough that only pruning ends them soon, with
    # env worker processes (--async-envs) that must end too, before the next trial starts.
    monkeypatch.setattr(
        optuna.pruners, "MedianPruner", lambda **_: optuna.pruners.ThresholdPruner(lower=10.0)
    )
    monkeypatch.setattr(tune_module, "EVENTS_EVERY_SECONDS", 1.0)
    start, left_running = tune_module.start_stoppable, []
    # processes an earlier test in this pytest worker left running are not this test's
    earlier = living(descendants(os.getpid()), seconds=0)

    def note_what_runs(
        command: list[str], cwd: Path, log_stem: Path, environment: dict
    ) -> subprocess.Popen:
        if log_stem.parent.name == "trial-0001" and log_stem.name.startswith("Probe4"):
            left_running.append(described(living(descendants(os.getpid()) - earlier, seconds=0)))
        return start(command, cwd, log_stem, environment)

    monkeypatch.setattr(tune_module, "start_stoppable", note_what_runs)
    flags = "--flags=--num-envs 4 --async-envs --num-steps 64"
    arguments = tune_command(
        tmp_path, "--steps", "50000", flags, "--trials", "2", "--pruner", "median"
    )[3:]
    assert harness(monkeypatch, *arguments) == 0
    trials = load(tmp_path).get_trials()
    assert [trial.state for trial in trials] == [TrialState.PRUNED] * 2
    assert [list(trial.intermediate_values) for trial in trials] == [[5_000]] * 2
    # trial 0's runs and their env workers had ended when trial 1 started
    assert left_running == [set()]
    assert described(living(descendants(os.getpid()) - earlier)) == set()
    for run_dir in (tmp_path / "runs").glob("trial-*/Probe*__1"):
        # stopped early: at the first report (a tenth of the steps), well before half of them
        assert 5_000 <= tune_module.TrialRun("", 1, run_dir, None).read().steps < 25_000


@pytest.mark.parametrize("sent", [signal.SIGINT, signal.SIGTERM, signal.SIGUSR1])
def test_ctrl_c_stops_the_runs_and_leaves_no_trial_running(
    tmp_path: Path, sent: signal.Signals
) -> None:
    command = tune_command(tmp_path, "--steps", "1000000", "--flags=--num-envs 4 --async-envs", "--trials", "3",
                           "--workers", "2", "--random", "Probe4-v0=0", "--random", "Probe5-v0=0")  # fmt: skip
    # In a session of its own, as a terminal's foreground job: Ctrl-C reaches its process group.
    tuner = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)  # fmt: skip
    try:
        deadline = time.time() + 120
        while (
            len(list((tmp_path / "runs").glob("trial-*/*.stdout"))) < 4 and time.time() < deadline
        ):
            time.sleep(0.1)
        # the runs and their env workers are up: 4 runs of 4 env workers each
        while len(descendants(tuner.pid)) < 4 * (1 + 4) and time.time() < deadline:
            time.sleep(0.1)
        runs = descendants(tuner.pid)
        assert len(runs) >= 4 * (1 + 4), described(runs)
        os.killpg(tuner.pid, sent)
        _, stderr = tuner.communicate(timeout=120)
    finally:
        tuner.kill()  # where the test failed: its runs end with it
    assert tuner.returncode == 128 + sent, stderr
    trials = load(tmp_path).get_trials()
    assert [trial.state for trial in trials] == [TrialState.FAIL] * 2
    assert all("interrupted" in trial.user_attrs["error"] for trial in trials)
    assert living(runs) == set()


def test_a_killed_tuner_leaves_no_run_and_its_trial_is_failed_on_resume(tmp_path: Path) -> None:
    quick_random = ["--random", "Probe4-v0=0", "--random", "Probe5-v0=0"]
    command = tune_command(tmp_path, "--steps", "1000000", "--flags=--num-envs 4", "--heartbeat-seconds", "1",
                           *quick_random)  # fmt: skip
    tuner = subprocess.Popen(
        [*command, "--trials", "1"], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.time() + 120
        while (
            len(list((tmp_path / "runs").glob("trial-*/*.stdout"))) < 2 and time.time() < deadline
        ):
            time.sleep(0.1)
        # both runs started (their log files are opened before they are), then a little more
        while len(descendants(tuner.pid)) < 2 and time.time() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)
        runs = descendants(tuner.pid)
        assert len(runs) == 2
    finally:
        tuner.kill()  # SIGKILL: no handler runs
        tuner.wait()
    assert living(runs) == set()  # each run is sent SIGTERM when its tuner dies
    # Another process's trial, beating, is not touched.
    study = load(tmp_path)
    beating = study.ask()
    beating.set_user_attr("heartbeat_seconds", 60.0)
    beating.set_user_attr("heartbeat", time.time())
    time.sleep(3.5)  # three of the killed trial's heartbeats
    rerun = subprocess.run([*command, "--trials", "0"], cwd=REPO,
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    assert rerun.returncode == 0, rerun.stderr
    killed, beating_now = load(tmp_path).get_trials()
    assert killed.state == TrialState.FAIL and "no heartbeat since" in killed.user_attrs["error"]
    assert beating_now.state == TrialState.RUNNING
    assert "trial 0 of" in rerun.stdout


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--space", "no-such-flag=float:0:1"], "the script has no flag --no-such-flag"),
        (["--space", "learning-rate=float:1e-3:1e-4"], "an empty range"),
        (["--space", "num-minibatches=choice:1,3"], "refuses --num-minibatches 3"),
        (["--flags=--seed 3"], "the sweep sets --seed itself"),
        (
            ["--flags=--total-timesteps=500 --eval-episodes=1"],
            "the sweep sets --eval-episodes, --total-timesteps itself",
        ),
        (["--env-id", "NoSuchEnv-v0"], "NoSuchEnv-v0"),
        (["--random", "CartPole-v1=0"], "the sweep does not run CartPole-v1"),
    ],
)
def test_bad_input_is_one_error_line_and_writes_nothing(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
    extra: list[str],
    message: str,
) -> None:
    arguments = tune_command(tmp_path, *QUICK, *extra)[3:]
    assert harness(monkeypatch, *arguments) == 2
    stderr = capsys.readouterr().err
    assert re.fullmatch(r"error: [^\n]+\n", stderr) and message in stderr, stderr
    assert not (tmp_path / "tune.journal").exists() and not (tmp_path / "runs").exists()


def test_a_rerun_with_other_settings_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    arguments = tune_command(
        tmp_path, *QUICK, "--trials", "0", "--random", "Probe4-v0=0", "--random", "Probe5-v0=0"
    )
    assert harness(monkeypatch, *arguments[3:]) == 0
    assert harness(monkeypatch, *arguments[3:], "--space", "learning-rate=log:1e-4:1e-2") == 2
    assert "was made with other settings (space)" in capsys.readouterr().err


def test_a_trial_flag_replaces_the_same_flag_of_the_sweeps_flags() -> None:
    flags = ["--num-envs", "4", "--no-shared-core", "--gamma", "0.9"]
    settings = {"script": "ppo_lstm", "steps": 1000, "eval_episodes": 2, "flags": flags}
    command = tune_module.command_line(
        settings, "PendulumNoVel-v1", ["--shared-core", "--num-envs", "8"]
    )
    assert command[6:] == [
        "--eval-episodes",
        "2",
        "--gamma",
        "0.9",
        "--shared-core",
        "--num-envs",
        "8",
    ]
    assert tune_module.resolve_args("ppo_lstm", command[2:]).shared_core is True


def test_a_new_study_refuses_a_folder_of_another_studys_trials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    (tmp_path / "runs" / "trial-0000").mkdir(parents=True)
    arguments = tune_command(
        tmp_path, *QUICK, "--trials", "1", "--random", "Probe4-v0=0", "--random", "Probe5-v0=0"
    )
    assert harness(monkeypatch, *arguments[3:]) == 2
    assert "holds the trials of another study" in capsys.readouterr().err
    assert load(tmp_path).trials == []


def test_a_database_url_is_optunas_rdb_storage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'tune.db'}"
    arguments = [
        *tune_command(
            tmp_path, *QUICK, "--trials", "1", "--random", "Probe4-v0=0", "--random", "Probe5-v0=0"
        )
    ]
    arguments[arguments.index("--storage") + 1] = url
    assert harness(monkeypatch, *arguments[3:]) == 0
    [trial] = optuna.load_study(study_name="probes", storage=url).get_trials()
    assert trial.state == TrialState.COMPLETE and trial.user_attrs["sps"] > 0
    assert not (tmp_path / "tune.journal").exists()
    assert (
        harness(
            monkeypatch,
            "tune-report",
            "--study",
            "probes",
            "--storage",
            url,
            "--out",
            str(tmp_path / "r"),
        )
        == 0
    )

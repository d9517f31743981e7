import os
from pathlib import Path

import pytest
from hypothesis import settings

# CI machines are noisy: a property test must fail on a wrong answer, never on a slow example.
settings.register_profile("default", deadline=None)
settings.load_profile("default")

# Headless machines: pygame (classic-control rendering) must not look for a display or audio device.
os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
# pytest -n 2 runs two workers on the two cores: one thread each, also where a network's default is every core.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(autouse=True, scope="session")
def no_run_folder_in_the_checkout():
    """Tests write their runs under tmp_path. A run folder in the checkout's runs/ is a test that left out its run
    folder: one waited a minute for its evaluation's folder under tmp_path while the run wrote it here."""
    runs = Path(__file__).resolve().parents[1] / "runs"
    before = set(os.listdir(runs)) if runs.is_dir() else set()
    yield
    written = sorted(set(os.listdir(runs)) - before) if runs.is_dir() else []
    assert not written, f"tests wrote run folders into {runs}: {written}"


@pytest.fixture(autouse=True)
def fresh_notices(monkeypatch):
    """Each test sees every notice its code prints: `common.cli.notice` prints a message once per process."""
    monkeypatch.setattr("common.cli._printed_notices", set())


# The quick tier (`python -m pytest -n 2 -m quick`): each PPO script trains a few iterations from its command line,
# answers --help, refuses bad input with one `error:` line, resumes a cut run exactly and learns the value of
# Probe1-v0; ddpg.py trains twice to the same bits, resumes a cut run with its buffer exactly and refuses bad input;
# then the shared plumbing's own tests, the README's CI commands and the packaging. An entry takes the tests whose id
# it is, or begins (followed by "::", "[" or "-"); an entry that takes none is an error.
QUICK = [
    *(
        f"tests/test_{script}.py::{test}"
        for script in ("ppo_fc", "ppo_lstm", "ppo_transformer")
        for test in (
            "test_cli_run_writes_the_conventional_log_keys",
            "test_help",
            "test_bad_input_gives_one_error_line_and_exit_status_2[flags0-unknown env id 'NoSuchEnv-v0']",
            "test_discrete_probes[Probe1-v0",
        )
    ),
    "tests/test_ppo_fc.py::test_resume_continues_the_cut_episodes_as_an_uninterrupted_run",
    "tests/test_ppo_lstm.py::test_resume_continues_the_cut_episodes_with_their_memory_as_an_uninterrupted_run",
    "tests/test_ppo_transformer.py::test_resume_continues_the_cut_episodes_with_their_context_as_an_uninterrupted_run",
    "tests/test_ddpg.py::test_resume_with_the_buffer_gives_the_uninterrupted_run",
    "tests/test_ddpg.py::test_bad_input_is_one_error_line[flags0-Discrete action space]",
    "tests/test_ddpg.py::test_the_same_seed_gives_the_same_run",
    "tests/test_data_helpers.py",
    "tests/test_common.py",
    "tests/test_numpy_copy.py",
    "tests/test_trajectories.py",
    "tests/test_envs.py",
    "tests/test_minari_export.py",
    "tests/test_capture.py",
    "tests/test_envpool.py::test_without_the_extra_the_error_says_how_to_install_it",
    "tests/test_docs.py::test_ci_runs_the_readme_test_commands",
    "tests/test_packaging.py",
]


def pytest_collection_modifyitems(config, items):
    # a file asked for by test (path::name) is collected in part: its entries are not checked
    in_part = {Path(arg.split("::")[0]).resolve() for arg in config.args if "::" in arg}
    collected_files = {
        Path(item.nodeid.split("::")[0]).as_posix()
        for item in items
        if Path(item.path).resolve() not in in_part
    }
    found = set()
    for item in items:
        for test in QUICK:
            if item.nodeid == test or any(
                item.nodeid.startswith(test + end) for end in ("::", "[", "-")
            ):
                item.add_marker(pytest.mark.quick)
                found.add(test)
    missing = [
        test for test in QUICK if test.split("::")[0] in collected_files and test not in found
    ]
    if missing:
        raise pytest.UsageError(
            f"tests/conftest.py's quick tier names tests that do not exist: {missing}"
        )

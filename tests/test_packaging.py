"""pyproject.toml: what the project installs must be able to run it."""

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib

REPO = Path(__file__).resolve().parents[1]


def test_the_torch_floor_has_fused_adam_on_the_cpu():
    # ppo_fc.py builds torch.optim.Adam(..., fused=True) for parameters on the CPU, which torch supports from 2.4 on.
    assert "fused=True" in (REPO / "ppo_fc.py").read_text()
    dependencies = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    (torch,) = [d for d in dependencies if re.match(r"torch\b", d)]
    floor = tuple(int(part) for part in re.search(r">=\s*([\d.]+)", torch).group(1).split(".")[:2])
    assert floor >= (2, 4), torch


def test_the_install_holds_the_shared_packages_and_no_script_or_test(tmp_path):
    # The wheel carries onefile_rl.py, through which a copy kept elsewhere finds the checkout, the packages that
    # `python -m` runs from any folder, and the dependencies; the scripts, tests and docs stay in the checkout.
    source = tmp_path / "source"
    skipped = shutil.ignore_patterns(
        ".*", "docs", "runs", "wandb", "build", "*.egg-info", "__pycache__"
    )
    shutil.copytree(REPO, source, ignore=skipped)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
         "--wheel-dir", str(tmp_path / "wheel"), str(source)],
        check=True, capture_output=True,
    )  # fmt: skip
    (wheel,) = (tmp_path / "wheel").glob("onefile_rl-*.whl")
    installed = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    expected = {"onefile_rl.py", "common", "benchmark", "probe_envs"}
    assert installed == expected | {f"{wheel.name.split('-py')[0]}.dist-info"}, installed


def run_copy(folder: Path, *, pythonpath: str | None = None, code: str | None = None):
    """`python my_ppo.py --help` (a copy of ppo_fc.py) in `folder`, or `python -c code` there, with PYTHONPATH as
    given (unset for None), as a user runs it after the README's install."""
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    if pythonpath is not None:
        environment["PYTHONPATH"] = pythonpath
    if code is None:
        shutil.copy(REPO / "ppo_fc.py", folder / "my_ppo.py")
    command = [sys.executable, "-c", code] if code else [sys.executable, "my_ppo.py", "--help"]
    return subprocess.run(command, cwd=folder, env=environment, capture_output=True, text=True)


def test_a_copy_outside_the_checkout_runs_after_the_install_alone(tmp_path):
    # The README's install (pip install -e .) is all a copy kept in the researcher's own folder needs.
    where = run_copy(tmp_path, code="import onefile_rl; print(onefile_rl.CHECKOUT)")
    assert where.stdout.strip() == str(REPO), (
        f"the environment's install is of another checkout: {where}"
    )
    done = run_copy(tmp_path)
    assert done.returncode == 0, done.stderr
    assert "--env-id" in done.stdout
    # with the checkout on PYTHONPATH too, as the README asked before
    assert run_copy(tmp_path, pythonpath=str(REPO)).returncode == 0


@pytest.mark.parametrize(
    "module", ["benchmark --help", "common.trajectories --help", "benchmark.same_parameters --help"]
)
def test_the_modules_run_with_python_m_from_any_folder_after_the_install(tmp_path, module):
    done = subprocess.run(
        [sys.executable, "-m", *module.split()], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0 and "usage:" in done.stdout, done.stderr


def test_the_installed_packages_come_after_everything_on_the_path(tmp_path):
    # found in the checkout where nothing else is; another project's `common` earlier on the path is not shadowed
    found = "import common; print(common.__file__)"
    assert run_copy(tmp_path, code=found).stdout.strip() == str(REPO / "common" / "__init__.py")
    (tmp_path / "elsewhere" / "common").mkdir(parents=True)
    (tmp_path / "elsewhere" / "common" / "__init__.py").write_text("")
    other = run_copy(tmp_path, pythonpath=str(tmp_path / "elsewhere"), code=found)
    assert other.stdout.strip() == str(tmp_path / "elsewhere" / "common" / "__init__.py")


def test_another_projects_common_found_first_stops_a_copy_with_one_error_line(tmp_path):
    # in the copy's own folder: the script's folder comes first on the path
    (tmp_path / "common").mkdir()
    (tmp_path / "common" / "__init__.py").write_text("")
    done = run_copy(tmp_path)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(
        f"error: `import common` finds {tmp_path / 'common'}, not onefile-rl's"
    )
    assert "keep the script in another folder" in done.stderr
    # on PYTHONPATH, before the checkout (a folder without __init__.py gives way to a regular package found later)
    shutil.rmtree(tmp_path / "common")
    (tmp_path / "theirs" / "common").mkdir(parents=True)
    assert run_copy(tmp_path, pythonpath=str(tmp_path / "theirs")).returncode == 0
    (tmp_path / "theirs" / "common" / "__init__.py").write_text("")
    done = run_copy(tmp_path, pythonpath=str(tmp_path / "theirs"))
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert f"finds {tmp_path / 'theirs' / 'common'}, not" in done.stderr
    assert f"PYTHONPATH={REPO}" in done.stderr
    # The checkout first on PYTHONPATH: its own packages are found, theirs stays where it is.
    assert run_copy(tmp_path, pythonpath=f"{REPO}:{tmp_path / 'theirs'}").returncode == 0


def test_an_install_without_its_checkout_says_how_to_install(tmp_path):
    # onefile_rl.py installed without -e sits in site-packages, away from common/: one error line, not a traceback.
    (tmp_path / "site").mkdir()
    shutil.copy(REPO / "onefile_rl.py", tmp_path / "site")
    done = run_copy(tmp_path, pythonpath=str(tmp_path / "site"))
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "installed without its checkout" in done.stderr and "pip install -e ." in done.stderr

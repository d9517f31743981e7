"""pyproject.toml: what the project installs must be able to run it."""

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parents[1]


def test_the_torch_floor_has_fused_adam_on_the_cpu():
    # ppo_fc.py builds torch.optim.Adam(..., fused=True) for parameters on the CPU, which torch supports from 2.4 on.
    assert "fused=True" in (REPO / "ppo_fc.py").read_text()
    dependencies = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    (torch,) = [d for d in dependencies if re.match(r"torch\b", d)]
    floor = tuple(int(part) for part in re.search(r">=\s*([\d.]+)", torch).group(1).split(".")[:2])
    assert floor >= (2, 4), torch


def test_the_install_puts_no_package_at_the_top_level_of_site_packages(tmp_path):
    # `common` and `probe_envs` are found in the checkout, beside the scripts: installed at the top level of
    # site-packages they would clash with another project's `common`. The wheel carries the dependencies alone.
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
    assert installed == {f"{wheel.name.split('-py')[0]}.dist-info"}, installed


def test_a_copy_outside_the_checkout_runs_with_the_checkout_on_its_path(tmp_path):
    # The README's copy-and-modify section: a copy kept elsewhere finds common/ through PYTHONPATH.
    shutil.copy(REPO / "ppo_fc.py", tmp_path / "my_ppo.py")
    environment = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "my_ppo.py", "--help"],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "--env-id" in done.stdout

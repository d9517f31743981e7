"""pyproject.toml: what the project installs must be able to run it."""

import re
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

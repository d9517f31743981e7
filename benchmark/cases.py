"""The standard benchmark cases of every script, and the named suites built from them.

A later script adds its rows to `CASES` (and, if it has one, its Stable-Baselines3 counterpart to `SB3_ALGOS`); the
harness, the tables and the plots need nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Case:
    """One (script, env) pair: how long to train, which flags differ from the script's defaults, and when it passes."""

    script: str
    """the script's file stem, e.g. ppo_fc"""
    env_id: str
    """the gymnasium env id"""
    total_timesteps: int
    """env steps of each run"""
    threshold: float | None = None
    """PASS when the mean return of the last 100 training episodes reaches this on every seed (None: no verdict)"""
    flags: tuple[str, ...] = ()
    """command-line flags that differ from the script's defaults"""
    num_envs: int = 4
    """the script's number of parallel envs in this case (the raw-env baseline steps as many)"""

    @property
    def name(self) -> str:
        return f"{self.script} {self.env_id}"


# Thresholds sit under what the reference implementations reach (CleanRL publishes 490.04 ± 6.12 for ppo.py on
# CartPole-v1 at 500k steps), so that a PASS means the algorithm works, not that a seed was lucky. The 100k-step row
# is the quick suite's check that learning happens at all.
CASES: tuple[Case, ...] = (
    Case("ppo_fc", "CartPole-v1", 500_000, threshold=490.0),
    Case("ppo_fc", "CartPole-v1", 100_000, threshold=150.0),
)

# Each script's Stable-Baselines3 counterpart for the `--baselines` rows (sb3-contrib for the recurrent ones).
SB3_ALGOS: dict[str, str] = {
    "ppo_fc": "ppo",
    "ppo_lstm": "recurrent_ppo",
    "ppo_transformer": "recurrent_ppo",
    "ddpg": "ddpg",
}

# A suite: the cases (script, env id, steps: a row of CASES) and the seeds to run each with.
SUITES: dict[str, tuple[tuple[tuple[str, str, int], ...], tuple[int, ...]]] = {
    "quick": ((("ppo_fc", "CartPole-v1", 100_000),), (1, 2)),  # a few minutes on 2 cores
    "full": ((("ppo_fc", "CartPole-v1", 500_000),), (1, 2, 3)),  # the numbers in the README
}

# Steps of a (script, env) pair that has no row in CASES.
DEFAULT_TIMESTEPS = 100_000


def find_case(script: str, env_id: str, total_timesteps: int | None = None) -> Case:
    """The row of CASES for `script` on `env_id` with `total_timesteps` steps (the longest row when not given).

    Another length keeps the row's flags but has no threshold (one set for 500k steps means nothing at 50k); a pair
    with no row runs with the script's defaults and no threshold.
    """
    rows = sorted(
        (case for case in CASES if case.script == script and case.env_id == env_id),
        key=lambda case: case.total_timesteps,
    )
    for case in rows:
        if case.total_timesteps == total_timesteps:
            return case
    if not rows:
        return Case(script, env_id, total_timesteps or DEFAULT_TIMESTEPS)
    longest = rows[-1]
    if total_timesteps is None:
        return longest
    return Case(script, env_id, total_timesteps, None, longest.flags, longest.num_envs)

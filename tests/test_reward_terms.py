"""`python -m benchmark.reward_terms`: the terms of a MuJoCo task's returns, read from a ppo_fc recording."""

import pytest

from benchmark.reward_terms import episode_terms
from common.data_helpers import split_episodes
from common.trajectories import load_trajectories
from tests.helpers import assert_one_error_line, run_in_one_process

# ppo_fc's recordings: Hopper-v5's step infos carry reward terms, CartPole-v1's do not, and Pendulum-v1's 200-step
# episodes do not end in 128 steps.
RECORDED = {"Hopper-v5": 256, "CartPole-v1": 256, "Pendulum-v1": 64}


@pytest.fixture(scope="module")
def recordings(tmp_path_factory):
    folder = tmp_path_factory.mktemp("reward_terms")
    common = "--num-envs 2 --eval-episodes 0 --no-progress".split()
    calls = [
        ["ppo_fc.py", "--env-id", env_id, "--num-steps", str(steps), "--total-timesteps", str(4 * steps), *common,
         "--run-dir", str(folder / "runs"), "--save-trajectories", str(folder / env_id)]
        for env_id, steps in RECORDED.items()
    ]  # fmt: skip
    for completed in run_in_one_process(calls):
        assert completed.returncode == 0, completed.stderr[-3000:]
    return folder


@pytest.mark.xdist_group("reward_terms_recordings")  # its module fixture made once
def test_the_terms_add_up_to_each_episodes_return(recordings):
    # Hopper-v5 pays no healthy reward on the step that ends an episode, but its forward and control terms are in
    # that step's final_info: without it the terms fall short of the return.
    episodes = [
        e for e in split_episodes(load_trajectories(recordings / "Hopper-v5")) if e.finished
    ]
    assert len(episodes) >= 4
    for episode in episodes:
        terms = episode_terms(episode)
        assert set(terms) == {"reward_forward", "reward_ctrl", "reward_survive"}
        assert sum(terms.values()) == pytest.approx(episode.total_reward, abs=1e-6)
        assert terms["reward_survive"] == pytest.approx(1.0 * (episode.length - 1))


@pytest.mark.xdist_group("reward_terms_recordings")  # its module fixture made once
def test_the_command_line_gives_the_table_and_refuses_a_recording_without_terms(recordings):
    table, no_terms, unfinished, missing = run_in_one_process(
        [
            ["-m", "benchmark.reward_terms", str(recordings / name)]
            for name in ("Hopper-v5", "CartPole-v1", "Pendulum-v1", "nowhere")
        ]
    )
    assert table.returncode == 0, table.stderr
    header, _, numbers = table.stdout.splitlines()[1:4]
    columns = [name.strip() for name in header.strip("|").split("|")]
    means = [float(cell.split("±")[0].replace(",", "")) for cell in numbers.strip("|").split("|")]
    assert columns[:3] == ["reward_ctrl", "reward_forward", "reward_survive"]
    values = dict(zip(columns, means, strict=True))
    assert values["sum of the terms"] == pytest.approx(values["return"], abs=0.1)
    assert_one_error_line(no_terms, "hold no reward_* terms")
    assert_one_error_line(unfinished, "holds no finished episode")
    assert_one_error_line(missing, "does not exist")

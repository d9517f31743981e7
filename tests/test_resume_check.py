"""--check-resume: each script resumes exactly, and a copy that keeps state outside the dict it gives run.start (an
RND-like second network and its optimizer) is caught, with what to register; registered, it passes."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import run_in_one_process

REPO = Path(__file__).resolve().parents[1]
SMALL = {
    "ppo_fc.py": ["--env-id", "CartPole-v1", "--num-envs", "2", "--num-steps", "64"],
    "ppo_lstm.py": ["--env-id", "CartPole-v1", "--num-envs", "2", "--num-steps", "64"],
    "ppo_transformer.py": ["--env-id", "CartPole-v1", "--num-envs", "2", "--num-steps", "64"],
    "ddpg.py": ["--env-id", "Pendulum-v1", "--batch-size", "32", "--hidden-size", "32"],
}

# RND's shape: a fixed random target network, a predictor trained after each rollout to match it, and its error
# added to the rewards as a bonus. The predictor and its optimizer change every iteration.
RND_NETWORKS = (
    "    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)\n",
    "    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)\n"
    "    observation_size = int(np.prod(run.observation_space.shape))\n"
    "    rnd_target = nn.Linear(observation_size, 8).to(device)\n"
    "    rnd_predictor = nn.Linear(observation_size, 8).to(device)\n"
    "    rnd_optimizer = torch.optim.Adam(rnd_predictor.parameters(), lr=1e-2)\n",
)
RND_BONUS = (
    "            run.combine_return_stats()  # all ranks go on from the return statistics of all envs\n",
    "            run.combine_return_stats()  # all ranks go on from the return statistics of all envs\n"
    "            rnd_obs = observation_tensor(obs, device).flatten(0, 1).float()\n"
    "            rnd_error = (rnd_predictor(rnd_obs) - rnd_target(rnd_obs)).pow(2).mean(-1)\n"
    "            rnd_optimizer.zero_grad()\n"
    "            rnd_error.mean().backward()\n"
    "            rnd_optimizer.step()\n"
    "            rewards += 0.1 * rnd_error.detach().reshape(rewards.shape).cpu().numpy()\n",
)
REGISTERED = (
    'run.start({"model": agent, "optimizer": optimizer}, global_batch_size)',
    'run.start({"model": agent, "optimizer": optimizer, "rnd_target": rnd_target, "rnd_predictor": rnd_predictor, '
    '"rnd_optimizer": rnd_optimizer}, global_batch_size)',
)


def rnd_copy(folder: Path, registered: bool) -> Path:
    source = (REPO / "ppo_fc.py").read_text()
    for old, new in (RND_NETWORKS, RND_BONUS, *((REGISTERED,) if registered else ())):
        assert old in source, f"the RND edit no longer applies to ppo_fc.py: {old!r}"
        source = source.replace(old, new)
    folder.mkdir()
    path = folder / f"ppo_rnd{'_registered' * registered}.py"
    path.write_text(source)
    return path


@pytest.mark.xdist_group("resume_check")
def test_every_script_resumes_exactly_and_an_rnd_copy_resumes_exactly_once_its_state_is_registered(
    tmp_path,
):
    unregistered, registered = rnd_copy(tmp_path / "a", False), rnd_copy(tmp_path / "b", True)
    calls = [[str(REPO / script), *flags, "--check-resume"] for script, flags in SMALL.items()]
    calls += [
        [str(copy), *SMALL["ppo_fc.py"], "--check-resume"] for copy in (unregistered, registered)
    ]
    *scripts, caught, passed = run_in_one_process(calls)
    for script, done in zip(SMALL, scripts, strict=True):
        assert done.returncode == 0, done.stderr[-3000:]
        assert f"{Path(script).name} resumes exactly: resumed at step" in done.stdout, done.stdout
    assert passed.returncode == 0 and "ppo_rnd_registered.py resumes exactly" in passed.stdout, (
        passed.stderr
    )
    lines = caught.stderr.strip().splitlines()
    assert caught.returncode == 1 and len(lines) == 1, caught.stderr[-3000:]
    assert lines[0].startswith("error: ppo_rnd.py does not resume exactly: resumed at step 256"), (
        lines[0]
    )
    # the first difference is the agent's parameters, trained on bonuses of a predictor that started afresh
    assert "first in model." in lines[0] and "(by up to " in lines[0], lines[0]
    assert "give each to that dict" in lines[0] and '"Does my copy resume exactly?"' in lines[0], (
        lines[0]
    )

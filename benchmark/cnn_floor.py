"""The least time ppo_fc.py's or ppo_lstm.py's update can take with a CNN, against what it takes, in
one run: ``python -m benchmark.cnn_floor [--script ppo_lstm] [FLAGS OF THE SCRIPT]`` (default:
BreakoutNoFrameskip-v4 with CleanRL's Atari settings for the script, `benchmark.atari_speed.OURS`).

The floor is the network's arithmetic alone: the script's own agent (built as the script builds it,
with its default threads) forward and backward over one minibatch of random uint8 frames (for
ppo_lstm, whole training sequences with no episode start inside, so nothing is padded), with the
loss's outputs and Adam's step, times the minibatches of an iteration. The script then trains with
the flags, and its `perf/update_seconds` (the median over its iterations after the first) is set
against the floor. Run it alone on the machine.

With `--env-backend envpool` the rollout has a floor too: EnvPool's games, made as the script makes
them (`common.envpool_atari`), stepped --num-steps times on the agent's greedy actions, with one
forward of the agent per step and nothing else. The iteration's floor is the two floors together,
and the most SPS the script could reach here is its steps per iteration over that."""

from __future__ import annotations

import argparse
import sys

import numpy as np
import torch

from benchmark.atari_speed import ENV_ID, OURS, median_after_first, script_sessions
from benchmark.recurrent_floor import floor_agent, median_seconds, random_observations
from common.cli import exit_status
from common.envpool_atari import EnvPoolGames
from common.envs import env_spaces, observation_tensor, resolve_env_id


def update_floor_seconds(
    script_name: str, flags: list[str], repeats: int = 20
) -> tuple[float, int]:
    """Seconds of an iteration's update that the network's arithmetic takes, and the threads it ran
    on."""
    script, args, agent = floor_agent(script_name, flags)
    observation_space, _, _ = env_spaces(script.make_env(resolve_env_id(args.env_id)))
    recurrent = script_name == "ppo_lstm"
    sequence_len = (args.bptt_len or args.num_steps) if recurrent else 1
    minibatch_size = args.num_envs * args.num_steps // args.num_minibatches // sequence_len
    frames = random_observations(
        observation_space, *((sequence_len,) if recurrent else ()), minibatch_size
    )
    actions = torch.randint(0, agent.action_size, frames.shape[: 2 if recurrent else 1])
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)

    no_starts = torch.zeros(actions.shape, dtype=torch.bool)
    initial_state = agent.initial_state(minibatch_size) if recurrent else None

    def minibatch() -> None:
        if recurrent:
            actor_out, value, _ = agent(frames, initial_state, no_starts)
            policy = agent.distribution(actor_out)
            logprob, entropy = policy.log_prob(actions), policy.entropy()
        else:
            _, logprob, entropy, value = agent.get_action_and_value(frames, actions)
        loss = (
            -logprob.mean() - args.ent_coef * entropy.mean() + args.vf_coef * value.square().mean()
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    seconds = median_seconds(minibatch, repeats) * args.update_epochs * args.num_minibatches
    return seconds, torch.get_num_threads()


def rollout_floor_seconds(
    script_name: str,
    flags: list[str],
    repeats: int = 5,
    device: str = "cpu",
    agent_acts: bool = True,
) -> float:
    """Seconds of an iteration's rollout that EnvPool's games and the agent's forward (on `device`)
    take alone (the median of `repeats` rollouts); without `agent_acts`, the games alone, on random
    actions."""
    import envpool

    script, args, agent = floor_agent(script_name, flags)
    env_id = resolve_env_id(args.env_id)
    observation_space, _, _ = env_spaces(script.make_env(env_id))
    frame_stack = observation_space.shape[0] if len(observation_space.shape) == 3 else 1
    games = EnvPoolGames(env_id, args.num_envs)
    pool = envpool.make(
        games.task, env_type="gymnasium", num_envs=args.num_envs, seed=args.seed,
        stack_num=frame_stack, **games.settings,
    )  # fmt: skip
    frames, _ = pool.reset()
    recurrent = script_name == "ppo_lstm"
    state = agent.initial_state(args.num_envs) if recurrent else None
    no_starts = torch.zeros((1, args.num_envs), dtype=torch.bool)
    agent.eval().to(device)
    state = None if state is None else state.to(device)
    no_starts = no_starts.to(device)
    random_actions = np.random.default_rng(0).integers(
        0, agent.action_size, (args.num_steps, args.num_envs), dtype=np.int32
    )

    @torch.no_grad()
    def rollout() -> None:
        nonlocal frames, state
        for step in range(args.num_steps):
            if not agent_acts:
                frames = pool.step(random_actions[step])[0]
                continue
            x = observation_tensor(frames.reshape(args.num_envs, *observation_space.shape), device)
            if recurrent:
                actor_out, _, state = agent(x[None], state, no_starts)
                actor_out = actor_out[0]
            else:
                actor_out, _ = agent(x)
            frames = pool.step(actor_out.argmax(-1).cpu().numpy().astype(np.int32))[0]

    seconds = median_seconds(rollout, repeats)
    pool.close()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--script", choices=["ppo_fc", "ppo_lstm"], default="ppo_fc")
    options, flags = parser.parse_known_args()
    flags = flags or ["--env-id", ENV_ID, *OURS[options.script][1:], "--total-timesteps", "6144"]
    floor, threads = update_floor_seconds(options.script, flags)
    envpool = "envpool" in flags  # --env-backend envpool
    rollout_floor = rollout_floor_seconds(options.script, flags) if envpool else None
    sessions = script_sessions(f"{options.script}.py", flags)
    update = median_after_first(sessions, "perf/update_seconds")
    print(f"floor {floor:.2f} s per iteration ({threads} threads); the script's update {update:.2f} s: "
          f"{floor / update:.2f} of the floor's speed")  # fmt: skip
    if rollout_floor is not None:
        rollout = median_after_first(sessions, "perf/rollout_seconds")
        _, args, _ = floor_agent(options.script, flags)
        steps = args.num_envs * args.num_steps
        print(f"rollout floor {rollout_floor:.2f} s; the script's rollout {rollout:.2f} s: "
              f"{rollout_floor / rollout:.2f} of the floor's speed. Iteration floor "
              f"{floor + rollout_floor:.2f} s against {update + rollout:.2f} s: at most "
              f"{steps / (floor + rollout_floor):.0f} SPS here, the script at "
              f"{steps / (update + rollout):.0f}")  # fmt: skip


if __name__ == "__main__":
    sys.exit(exit_status(main))

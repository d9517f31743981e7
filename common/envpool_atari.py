"""Atari games stepped in EnvPool's C++ threads (`--env-backend envpool`, the `[envpool]` extra) in
place of the envs `common.envs.make` builds, inside the script's own `make_env`.

The stand-in is derived from the script, not written beside it: while the training envs are made,
each call of `common.envs.make` returns a `PoolSlot`, one game of a shared `EnvPoolGames`, with the
frame stack the script asked for, and whatever `make_env` wraps around it (ppo_transformer's
previous action and reward, a researcher's own wrapper) wraps the slot as it would have wrapped the
gymnasium env. The slots are stepped by gymnasium's SyncVectorEnv (SAME_STEP autoreset, final
observations, episode statistics of whole games as on the gymnasium path), after one batched
EnvPool step of every game: a wrapper that changes the actions on their way in cannot be served,
and is refused at its first step.

EnvPool does CleanRL's Atari preprocessing itself: no-op reset up to 30, frame skip 4 with a max
over the last two frames, episodic life, rewards clipped to their sign, 84x84
greyscale and the frame stack, with the id's own sticky actions and episode limit; FIRE after a
game's start or a lost life is taken here (see `EnvPoolGames.step`). A lost life ends
an episode (terminated) and the game goes on from the same frame; a game's end (or its step limit)
resets that game by id in the same step. docs/ppo_fc.md "EnvPool" says where this differs from the
gymnasium path, with numbers. An EnvPool game cannot be saved: a resumed run starts new games, with
a notice."""

from __future__ import annotations

import importlib.util
from typing import Any

import gymnasium as gym
import numpy as np

from common.atari import FRAME_SKIP, NOOP_MAX, SCREEN_SIZE, _spec, is_atari_id, make_kwargs
from common.errors import UsageError


def uses_envpool(args: Any) -> bool:
    """Whether a script's `args` step their Atari games in EnvPool (--env-backend envpool)."""
    return getattr(args, "env_backend", "gymnasium") == "envpool"


def task_id(env_id: str) -> str:
    """EnvPool's id of the game `env_id` names (its `-v5` task: `BreakoutNoFrameskip-v4` and
    `ALE/Breakout-v5` are both `Breakout-v5`; the id's own settings are passed on by
    `EnvPoolGames`)."""
    game = _spec(env_id).kwargs["game"]
    return "".join(part.capitalize() for part in game.split("_")) + "-v5"


def check(env_id: str, args: Any) -> None:
    """Refuse `--env-backend envpool` (UsageError) where EnvPool cannot stand in: an id that is not
    one of ale-py's games, EnvPool not installed or without the game, or a flag it cannot
    serve."""
    if not is_atari_id(env_id):
        raise UsageError(f"--env-backend envpool runs Atari games only, and {env_id!r} is not one")
    if importlib.util.find_spec("envpool") is None:
        raise UsageError(
            "--env-backend envpool needs EnvPool: pip install -e '.[envpool]' (Python 3.11 or later)"
        )
    import envpool

    if task_id(env_id) not in envpool.list_all_envs():
        raise UsageError(f"--env-backend envpool: EnvPool has no {task_id(env_id)} for {env_id!r}")
    for flag, refused, why in (
        ("--capture-video", args.capture_video, "EnvPool's games do not render frames"),
        ("--async-envs", getattr(args, "async_envs", False), "EnvPool steps its own threads"),
    ):
        if refused:
            raise UsageError(f"{flag} with --env-backend envpool: {why}")


class EnvPoolGames:
    """`num_envs` games of `env_id` in one EnvPool, stepped together by `step`; game i's results
    wait for its `PoolSlot` (`slot` hands them out in order). The pool is made on the first reset,
    and again on a reset with a seed (game i draws from seed + i, as gymnasium's vector envs seed
    env i)."""

    def __init__(self, env_id: str, num_envs: int):
        import envpool

        spec = _spec(env_id)
        self.task, self.num_envs = task_id(env_id), num_envs
        self.settings = dict(
            episodic_life=True,
            reward_clip=True,
            use_fire_reset=False,  # FIRE and UP below, as common.atari.FireReset presses them
            noop_max=NOOP_MAX,
            frame_skip=FRAME_SKIP,
            img_height=SCREEN_SIZE,
            img_width=SCREEN_SIZE,
            repeat_action_probability=spec.kwargs.get("repeat_action_probability", 0.0),
            full_action_space=spec.kwargs.get("full_action_space", False),
            max_episode_steps=spec.kwargs.get("max_num_frames_per_episode", 108_000) // FRAME_SKIP,
        )
        self.actions = int(envpool.make_spec(self.task, **self.settings).action_space.n)
        game = gym.make(env_id, **make_kwargs(env_id))
        # the steps common.atari's FireReset takes after a reset, and EpisodicLife's no-op before
        # them after a lost life
        fire = "FIRE" in game.unwrapped.get_action_meanings()
        self.after_a_new_game, self.after_a_lost_life = ((1, 2), (0, 1, 2)) if fire else ((), (0,))
        game.close()
        self.taken_for_the_agent: list[list[int]] = [[] for _ in range(num_envs)]
        self.slots: list[PoolSlot] = []
        self.frame_stack = 0
        self.pool = None

    def slot(self, frame_stack: int) -> PoolSlot:
        """The next game, as one env of `frame_stack` frames (1: one frame, no stack axis), as
        `common.envs.make` would have made it."""
        if self.frame_stack not in (0, frame_stack) or len(self.slots) == self.num_envs:
            raise UsageError(
                f"--env-backend envpool: make_env made more than {self.num_envs} envs, or envs of "
                "different frame stacks: use --env-backend gymnasium"
            )
        self.frame_stack = frame_stack
        self.slots.append(PoolSlot(self, len(self.slots)))
        return self.slots[-1]

    def start(self, seed: int | None) -> None:
        """A new pool (seeded with `seed`, 0 for None), every game at its start."""
        import envpool

        if self.pool is not None:
            self.pool.close()
        self.pool = envpool.make(
            self.task, env_type="gymnasium", num_envs=self.num_envs, seed=seed or 0,
            stack_num=self.frame_stack, **self.settings,
        )  # fmt: skip
        frames, info = self.pool.reset()
        self.taken_for_the_agent = [list(self.after_a_new_game) for _ in range(self.num_envs)]
        for game, frame in zip(info["env_id"].tolist(), frames, strict=True):
            self.slots[game].started(frame)

    def step(self, actions: np.ndarray) -> None:
        """Step every game with `actions`; a game that ended starts again in this step. The steps
        the gymnasium path takes inside its resets (FIRE and UP after a game's start, a no-op, FIRE
        and UP after a lost life, in the games that have FIRE) are taken here in place of the
        agent's next actions: a game that waits for FIRE (Breakout) goes on. (EnvPool's own fire
        reset presses FIRE for one frame, which a sticky action can swallow.)"""
        executed = actions.copy()
        for game, taken in enumerate(self.taken_for_the_agent):
            if taken:
                executed[game] = taken.pop(0)
        frames, rewards, terminations, truncations, info = self.pool.step(executed)
        game_over = info["terminated"].astype(bool) | truncations  # not a lost life
        for game in info["env_id"][terminations & ~game_over].tolist():
            self.taken_for_the_agent[game] = list(self.after_a_lost_life)
        new_frames = {}
        if game_over.any():
            games = info["env_id"][game_over].astype(np.int32)
            for game in games.tolist():
                self.taken_for_the_agent[game] = list(self.after_a_new_game)
            frames_of_games, started = self.pool.reset(games)
            new_frames = dict(zip(started["env_id"].tolist(), frames_of_games, strict=True))
        for i, game in enumerate(info["env_id"].tolist()):
            self.slots[game].stepped(
                actions[game], frames[i], float(rewards[i]), float(info["reward"][i]),
                bool(terminations[i]), bool(truncations[i]), new_frames.get(game),
            )  # fmt: skip

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None


class PoolSlot(gym.Env):
    """Game `index` of `games`, as one gymnasium env whose step returns what the pool's batched step
    gave it. `next_reset_continues` (as `common.atari.EpisodicLife` has it) makes
    `common.envs.episode_statistics` report whole games: `info["episode"]` at a game's end holds
    its score (before the clip) and its length in agent steps."""

    def __init__(self, games: EnvPoolGames, index: int):
        self.games, self.index = games, index
        shape = (SCREEN_SIZE, SCREEN_SIZE)
        if games.frame_stack > 1:
            shape = (games.frame_stack, *shape)
        self.observation_space = gym.spaces.Box(0, 255, shape, np.uint8)
        self.action_space = gym.spaces.Discrete(games.actions)
        self.next_reset_continues = False
        self.score, self.length = 0.0, 0
        self._frame: np.ndarray | None = None
        self._next_game: np.ndarray | None = None
        self._step: tuple | None = None

    def _observation(self, frame: np.ndarray) -> np.ndarray:
        return frame.reshape(self.observation_space.shape)

    def started(self, frame: np.ndarray) -> None:
        self._frame, self.score, self.length = frame, 0.0, 0

    def stepped(self, action, frame, reward, raw_reward, terminated, truncated, next_game) -> None:
        self.score, self.length = self.score + raw_reward, self.length + 1
        info: dict[str, Any] = {"raw_reward": raw_reward, "game_over": next_game is not None}
        if next_game is not None:
            info["episode"] = {"r": self.score, "l": self.length, "t": 0.0}
        self.next_reset_continues = next_game is None
        self._frame, self._next_game = frame, next_game
        observation = self._observation(frame)
        self._step = (action, (observation, reward, terminated, truncated, info))

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        if self.games.pool is None or (seed is not None and self.index == 0):
            self.games.start(seed)  # every game: SyncVectorEnv seeds env i with seed + i
        elif self._next_game is not None:  # a game ended: the pool started the next one
            self.started(self._next_game)
            self._next_game = None
        # after a lost life the game goes on from the same frame
        return self._observation(self._frame), {}

    def step(self, action):
        if self._step is None:
            raise UsageError(
                "--env-backend envpool: a wrapper of make_env steps the env more than once in one "
                "of the agent's steps, which EnvPool steps once: use --env-backend gymnasium"
            )
        (sent, result), self._step = self._step, None
        if not np.array_equal(sent, action):
            raise UsageError(
                "--env-backend envpool: a wrapper of make_env changed the actions, which EnvPool "
                "took before it: use --env-backend gymnasium"
            )
        return result

    def episode_so_far(self) -> dict[str, Any]:
        """For `common.env_state`: an EnvPool game cannot be saved, nor replayed."""
        return {"replayable": False}


class EnvPoolEnvs(gym.vector.SyncVectorEnv):
    """The envs of `env_fns` (the script's `make_env`, made while `common.envs.make` hands out the
    slots of `games`), stepped as gymnasium steps them after one EnvPool step of every game."""

    def __init__(self, env_fns: list, games: EnvPoolGames):
        self.games = games
        super().__init__(env_fns, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
        if len(games.slots) != len(env_fns):
            self.refuse(
                "--env-backend envpool stands in for common.envs.make, which make_env did not call "
                "once for each env: use --env-backend gymnasium"
            )
        for env in self.envs:
            while isinstance(env, gym.Wrapper):
                if isinstance(env, gym.ActionWrapper):
                    self.refuse(
                        f"--env-backend envpool: make_env's {type(env).__name__} changes the "
                        "actions, which EnvPool takes before it: use --env-backend gymnasium"
                    )
                env = env.env

    def refuse(self, message: str) -> None:
        """Close the envs, and raise UsageError(`message`)."""
        self.close()
        raise UsageError(message)

    def try_each_action(self) -> None:
        """Step one game with each action once: a wrapper of make_env that changes actions, or
        steps more than once, is refused here, before the run has a folder, rather than at the
        step where it first does."""
        self.reset(seed=0)
        try:
            for action in range(self.single_action_space.n):
                self.step(np.full(self.num_envs, action))
        except UsageError:
            self.close()
            raise

    def step(self, actions):
        self.games.step(np.asarray(actions))
        return super().step(actions)

    def close_extras(self, **kwargs: Any) -> None:
        super().close_extras(**kwargs)
        self.games.close()

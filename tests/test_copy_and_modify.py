"""Copy and modify: ordinary edits a researcher makes to a copy of a script, applied to fresh copies, each trained on a
probe whose answer the edit does not change. Each copy must reach the probe's target, with at most one notice: no
error, no traceback, never another policy than the one that acted. Where the NumPy copy of the policy can follow the
edit it must (`numpy`), and where it cannot the run says so once and acts with torch (`torch`)."""

from __future__ import annotations

import importlib.util
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from helpers import play_optimally, sharp_agent, visit_states

from benchmark.registry import script_make_env
from common.errors import PolicyMismatch, UsageError

REPO = Path(__file__).resolve().parents[1]
FALLBACK = "the rollout acts with the torch policy at every step"
TRAINS_OTHERWISE = "the network computes otherwise in train mode"


@dataclass(frozen=True)
class Edit:
    script: str
    replacements: tuple[tuple[str, str], ...]
    """(text in the script, what it becomes), each applied to every occurrence"""
    rollout: str | None = "numpy"
    """how the copy acts: through the NumPy copy (numpy), the torch policy (torch), or None (no NumPy copy)"""
    notice: str | None = None
    """the one notice line the run prints, if any"""


TIME_BATCH_NORM = (
    "class TimeBatchNorm(nn.BatchNorm1d):\n"
    "    def forward(self, x):  # over every step of every sequence: (..., features)\n"
    "        return super().forward(x.reshape(-1, x.shape[-1])).reshape(x.shape)\n\n\n"
)
MLP_ACTOR = """            self.actor = nn.Sequential(  # logits (discrete) or the Gaussian mean (continuous)
                layer_init(nn.Linear(observation_size, hidden_size)),
                nn.Tanh(),
                layer_init(nn.Linear(hidden_size, hidden_size)),
                nn.Tanh(),
                layer_init(nn.Linear(hidden_size, self.action_size), std=0.01),
            )"""
MLP_CRITIC = """            self.critic = nn.Sequential(
                layer_init(nn.Linear(observation_size, hidden_size)),
                nn.Tanh(),
                layer_init(nn.Linear(hidden_size, hidden_size)),
                nn.Tanh(),
                layer_init(nn.Linear(hidden_size, 1), std=1.0),
            )"""
FC_HIDDEN = "            hidden = self.obs_norm(self.normalised_part(x))"
FC_RETURN = "        return self.actor(hidden), self.critic(hidden).squeeze(-1)"

LEARNED_START_PARAMETER = (
    "        self.critic = layer_init(nn.Linear(self.cores()[-1].rnn.hidden_size, 1), std=1.0)\n",
    "        self.critic = layer_init(nn.Linear(self.cores()[-1].rnn.hidden_size, 1), std=1.0)\n"
    "        self.start = nn.Parameter(torch.zeros(self.rnn_layers, 1, self.state_size))\n",
)
LEARNED_START = (
    "        device = next(self.parameters()).device\n"
    "        return torch.zeros(self.rnn_layers, batch_size, self.state_size, device=device)\n",
    "        return self.start.expand(-1, batch_size, -1)\n",
)

EDITS = {
    # a copy made before common/stand_in.py was split (2026-12-06): its names are still there
    "fc_made_before_the_split": Edit(
        "ppo_fc",
        (
            ("from common.numpy_copy import numpy_copy\n", ""),
            (" numpy_copy(", " stand_in.numpy_copy("),
            ("rollout_checks", "stand_in"),
        ),
    ),
    # ppo_fc: the MLP's activations, width, norms, torso and heads, its loss
    "fc_relu_and_wider": Edit(
        "ppo_fc",
        (("nn.Tanh()", "nn.ReLU()"), ("hidden_size: int = 64", "hidden_size: int = 256")),
    ),
    "fc_layer_norm": Edit(
        "ppo_fc",
        (
            (
                "                nn.Tanh(),\n",
                "                nn.LayerNorm(hidden_size),\n                nn.Tanh(),\n",
            ),
        ),
    ),
    "fc_shared_torso_two_heads": Edit(
        "ppo_fc",
        (
            (
                MLP_CRITIC + "\n" + MLP_ACTOR,
                "            self.torso = nn.Sequential(\n"
                "                layer_init(nn.Linear(observation_size, hidden_size)), nn.Tanh(),\n"
                "                layer_init(nn.Linear(hidden_size, hidden_size)), nn.Tanh(),\n"
                "            )\n"
                "            self.critic = layer_init(nn.Linear(hidden_size, 1), std=1.0)\n"
                "            self.actor = layer_init(nn.Linear(hidden_size, self.action_size), std=0.01)",
            ),
            (FC_HIDDEN, "            hidden = self.torso(self.obs_norm(self.normalised_part(x)))"),
        ),
    ),
    "fc_huber_value_loss": Edit(
        "ppo_fc",
        (
            (
                "v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()",
                "v_loss = nn.functional.smooth_l1_loss(newvalue, b_returns[mb_inds])",
            ),
        ),
    ),
    "fc_extra_output_sliced_off": Edit(
        "ppo_fc",
        (
            (
                "layer_init(nn.Linear(hidden_size, self.action_size), std=0.01),",
                "layer_init(nn.Linear(hidden_size, self.action_size + 2), std=0.01),",
            ),
            (
                FC_RETURN,
                "        return self.actor(hidden)[..., : self.action_size], self.critic(hidden).squeeze(-1)",
            ),
        ),
    ),
    "fc_dropout": Edit(
        "ppo_fc",
        (
            (
                "                nn.Tanh(),\n",
                "                nn.Tanh(),\n                nn.Dropout(0.1),\n",
            ),
        ),
        notice=TRAINS_OTHERWISE,
    ),
    "fc_batch_norm_in_the_actor": Edit(
        "ppo_fc",
        (
            (
                MLP_ACTOR,
                MLP_ACTOR.replace(
                    "                nn.Tanh(),\n",
                    "                nn.BatchNorm1d(hidden_size),\n                nn.Tanh(),\n",
                ),
            ),
        ),
        notice=TRAINS_OTHERWISE,
    ),
    "fc_softsign_and_spectral_norm": Edit(
        "ppo_fc",
        (
            ("nn.Tanh()", "nn.Softsign()"),
            (
                "layer_init(nn.Linear(hidden_size, self.action_size), std=0.01),",
                "nn.utils.parametrizations.spectral_norm(\n"
                "                    layer_init(nn.Linear(hidden_size, self.action_size), std=0.01)\n"
                "                ),",
            ),
        ),
        notice=TRAINS_OTHERWISE,  # its power iteration runs in train mode only
    ),
    "fc_residual_block_with_a_gate": Edit(
        "ppo_fc",
        (
            (
                FC_RETURN,
                "        hidden = hidden + torch.sigmoid(self.gate) * self.actor[:2](hidden).mean(-1, keepdim=True)\n"
                + FC_RETURN,
            ),
            (
                "        if not self.discrete:\n            self.actor_logstd",
                "        self.gate = nn.Parameter(torch.zeros(1))\n"
                "        if not self.discrete:\n            self.actor_logstd",
            ),
        ),
    ),
    "fc_old_weight_norm": Edit(  # a forward pre-hook, and a network deepcopy refuses
        "ppo_fc",
        (
            (
                MLP_ACTOR,
                MLP_ACTOR.replace(
                    "                layer_init(nn.Linear(observation_size, hidden_size)),",
                    "                nn.utils.weight_norm(layer_init(nn.Linear(observation_size, hidden_size))),",
                ),
            ),
        ),
    ),
    "fc_resblock_with_in_place_sum_and_group_norm": Edit(
        "ppo_fc",
        (
            (
                "def layer_init(",
                "class ResBlock(nn.Module):\n"
                "    def __init__(self, size: int):\n"
                "        super().__init__()\n"
                "        self.fc, self.norm = nn.Linear(size, size), nn.GroupNorm(4, size)\n\n"
                "    def forward(self, x: Tensor) -> Tensor:\n"
                "        out = self.norm(torch.tanh(self.fc(x)))\n"
                "        out += x\n"
                "        return out\n\n\n"
                "def layer_init(",
            ),
            (
                MLP_ACTOR,
                MLP_ACTOR.replace(
                    "                layer_init(nn.Linear(hidden_size, hidden_size)),\n",
                    "                ResBlock(hidden_size),\n",
                ),
            ),
        ),
    ),
    "fc_an_activation_it_has_no_numpy_form_for": Edit(
        "ppo_fc", (("nn.Tanh()", "nn.PReLU()"),), rollout="torch", notice=FALLBACK
    ),
    # ppo_lstm: the recurrent core and what comes around it
    "lstm_layer_after_the_core": Edit(
        "ppo_lstm",
        (
            (
                "        self.rnn = cell(encoder_size, args.rnn_hidden_size, args.rnn_layers)\n",
                "        self.rnn = cell(encoder_size, args.rnn_hidden_size, args.rnn_layers)\n"
                "        self.post = nn.Sequential(nn.Linear(args.rnn_hidden_size, args.rnn_hidden_size), nn.Tanh())\n",
            ),
            (
                "return output, self.flat_state(next_state)",
                "return self.post(output), self.flat_state(next_state)",
            ),
            (
                "return segments.unpad(output), None",
                "return self.post(segments.unpad(output)), None",
            ),
        ),
    ),
    # the state every episode starts from, learned: one definition to edit (Agent.initial_state), with its parameter
    "lstm_learned_initial_state": Edit("ppo_lstm", (LEARNED_START_PARAMETER, LEARNED_START)),
    # an auxiliary head and its loss: one more field of AgentOutput, given in forward; no call site changes
    "lstm_auxiliary_output": Edit(
        "ppo_lstm",
        (
            (
                '    """the state after the step (one step alone: T = 1), else None"""\n',
                '    """the state after the step (one step alone: T = 1), else None"""\n'
                "    observation: Tensor | None = None\n",
            ),
            (
                LEARNED_START_PARAMETER[0],
                LEARNED_START_PARAMETER[0]
                + "        self.observation_head = nn.Linear(self.cores()[-1].rnn.hidden_size, 1)\n",
            ),
            (
                "            self.actor(actor_hidden), self.critic(critic_hidden).squeeze(-1), next_state\n",
                "            self.actor(actor_hidden), self.critic(critic_hidden).squeeze(-1), next_state,\n"
                "            self.observation_head(actor_hidden),\n",
            ),
            (
                "                    loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef\n",
                "                    loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef\n"
                "                    loss = loss + ((output.observation - b_obs[mb_inds][..., :1]) ** 2).mean()\n",
            ),
        ),
    ),
    "lstm_relu_deeper_encoder": Edit(
        "ppo_lstm",
        (
            (
                "self.encoder = nn.Sequential(linear, nn.Tanh())",
                "self.encoder = nn.Sequential(\n"
                "                linear, nn.ReLU(), nn.Linear(args.hidden_size, args.hidden_size), nn.ReLU()\n"
                "            )",
            ),
        ),
    ),
    "lstm_dropout_in_the_encoder": Edit(
        "ppo_lstm",
        (
            (
                "self.encoder = nn.Sequential(linear, nn.Tanh())",
                "self.encoder = nn.Sequential(linear, nn.Tanh(), nn.Dropout(0.1))",
            ),
        ),
        notice=TRAINS_OTHERWISE,
    ),
    # batch norm's statistics move in the update's train-mode pass; the replay check's eval-mode pass takes the
    # rollout's. A subclass of the user's: the NumPy copy follows it into F.batch_norm.
    "lstm_batch_norm_of_the_user_s_in_the_encoder": Edit(
        "ppo_lstm",
        (
            ("class Core(nn.Module):", TIME_BATCH_NORM + "class Core(nn.Module):"),
            (
                "self.encoder = nn.Sequential(linear, nn.Tanh())",
                "self.encoder = nn.Sequential(linear, nn.Tanh(), TimeBatchNorm(args.hidden_size))",
            ),
        ),
        notice=TRAINS_OTHERWISE,
    ),
    "lstm_two_layer_gru_after_a_layer_norm": Edit(
        "ppo_lstm",
        (
            (
                "self.rnn = cell(encoder_size, args.rnn_hidden_size, args.rnn_layers)",
                "self.rnn = nn.GRU(encoder_size, args.rnn_hidden_size, 2)",
            ),
            (
                "nn.Sequential(linear, nn.Tanh())",
                "nn.Sequential(linear, nn.Tanh(), nn.LayerNorm(args.hidden_size))",
            ),
        ),
    ),
    # ppo_transformer: the attention, the blocks, the MLP. --n-heads stays 4: the attention's own count sets its heads'
    # width, RoPE's and the context's; --n-layers stays 2: the receptive field and the context follow the blocks.
    "transformer_head_count_in_the_attention": Edit(
        "ppo_transformer",
        (("        self.n_heads = config.n_heads\n", "        self.n_heads = 2\n"),),
        rollout=None,
    ),
    "transformer_dropout_in_each_block": Edit(
        "ppo_transformer",
        (
            (
                "        self.mlp = MLP(config)\n",
                "        self.mlp = MLP(config)\n        self.dropout = nn.Dropout(0.1)\n",
            ),
            ("        x = x + attended\n", "        x = x + self.dropout(attended)\n"),
            (
                "        x = x + self.mlp(self.ln_2(x))\n",
                "        x = x + self.dropout(self.mlp(self.ln_2(x)))\n",
            ),
        ),
        rollout=None,
        notice=TRAINS_OTHERWISE,
    ),
    "transformer_batch_norm_of_the_user_s_on_the_tokens": Edit(
        "ppo_transformer",
        (
            ("class Agent(nn.Module):", TIME_BATCH_NORM + "class Agent(nn.Module):"),
            (
                "        x = self.embed(self.token_input(obs))\n",
                "        x = self.token_norm(self.embed(self.token_input(obs)))\n",
            ),
            (
                "        self.embed = layer_init(",
                "        self.token_norm = TimeBatchNorm(args.d_model)\n        self.embed = layer_init(",
            ),
        ),
        rollout=None,
        notice=TRAINS_OTHERWISE,
    ),
    "transformer_narrower_mlp": Edit(
        "ppo_transformer", (("4 * config.d_model", "2 * config.d_model"),), rollout=None
    ),
    "transformer_extra_output_sliced_in_the_distribution": Edit(
        "ppo_transformer",
        (
            (
                "self.actor = layer_init(nn.Linear(args.d_model, self.action_size), std=0.01)",
                "self.actor = layer_init(nn.Linear(args.d_model, self.action_size + 1), std=0.01)",
            ),
            (
                "return Categorical(logits=actor_out, validate_args=False)",
                "return Categorical(logits=actor_out[..., :-1], validate_args=False)",
            ),
        ),
        rollout=None,
    ),
    "transformer_one_more_block": Edit(
        "ppo_transformer",
        (("for _ in range(args.n_layers))", "for _ in range(args.n_layers + 1))"),),
        rollout=None,
    ),
    "transformer_relu_for_gelu": Edit(
        "ppo_transformer", (("self.gelu = nn.GELU()", "self.gelu = nn.ReLU()"),), rollout=None
    ),
    # ddpg: the actor and the critic
    "ddpg_deeper_actor": Edit(
        "ddpg",
        (
            (
                "            nn.Linear(hidden_size, int(np.prod(action_space.shape))),",
                "            nn.Linear(hidden_size, hidden_size),\n            nn.ReLU(),\n"
                "            nn.Linear(hidden_size, int(np.prod(action_space.shape))),",
            ),
        ),
        rollout=None,
    ),
    "ddpg_batch_norm_in_the_actor": Edit(  # acts in eval mode: one env is a batch of one
        "ddpg",
        (
            (
                "            nn.Linear(observation_size, hidden_size),\n            nn.ReLU(),\n",
                "            nn.Linear(observation_size, hidden_size),\n            nn.BatchNorm1d(hidden_size),\n"
                "            nn.ReLU(),\n",
            ),
        ),
        rollout=None,
    ),
    "ddpg_layer_norm_elu_critic": Edit(
        "ddpg",
        (
            (
                "            nn.Linear(hidden_size, 1),\n",
                "            nn.LayerNorm(hidden_size),\n            nn.ELU(),\n"
                "            nn.Linear(hidden_size, 1),\n",
            ),
        ),
        rollout=None,
    ),
}


def edited_copy(edit: Edit, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str):
    """A fresh copy of the edit's script with the edit applied, imported as its own module."""
    source = (REPO / f"{edit.script}.py").read_text()
    for old, new in edit.replacements:
        assert old in source, (
            f"the edit {name!r} no longer applies to {edit.script}.py: update this test"
        )
        source = source.replace(old, new)
    folder = tmp_path / "copy"
    folder.mkdir()
    (folder / f"{edit.script}.py").write_text(source)
    spec = importlib.util.spec_from_file_location(f"edited_{name}", folder / f"{edit.script}.py")
    copy = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, copy)  # dataclasses look their module up there
    spec.loader.exec_module(copy)
    return copy


def fc_reaches_the_target(copy, result) -> None:
    """Probe5-v0: the value of every state within 0.15 of the optimum, the right action with probability 0.9."""
    agent = result.agent.eval()
    for env, observation in visit_states("Probe5-v0"):
        with torch.no_grad():
            actor_out, value = agent(torch.as_tensor(observation[None], dtype=torch.float32))
        assert value.item() == pytest.approx(env.optimal_value(0.99), abs=0.15), observation
        probability = agent.distribution(actor_out).probs[0, env.optimal_action()].item()
        assert probability >= 0.9, observation


def lstm_reaches_the_target(copy, result) -> None:
    """Probe7-v0, memory: at the last step the cue's action is the greedy one, in every episode, and the last 200
    training episodes earn 0.8 or more (a memoryless agent earns 0.5)."""
    for env, _, policy in play_optimally(result.agent.eval(), "Probe7-v0"):
        if env.t == env.horizon - 1:
            assert policy.probs[0].argmax().item() == env.optimal_action(), env.cue
    assert np.mean(result.episode_returns[-200:]) >= 0.8


def ddpg_reaches_the_target(copy, result) -> None:
    """ContinuousProbe5-v0: the actor's action within 0.1 of the optimum at every state, and the critic's value of it
    within 0.1 of the optimal value."""
    agent = result.agent.eval()
    for env, observation in visit_states("ContinuousProbe5-v0"):
        x = torch.as_tensor(observation, dtype=torch.float32)[None]
        with torch.no_grad():
            action = agent.actor(x)
            value = agent.qf1(x, action).item()
        assert action[0, 0].item() == pytest.approx(env.optimal_action()[0], abs=0.1), observation
        assert value == pytest.approx(env.optimal_value(0.99), abs=0.1), observation


def transformer_reaches_the_target(copy, result) -> None:
    """Probe4-v0: the value within 0.1 of the optimum, the right action with probability 0.95."""
    agent = result.agent.eval()
    env = script_make_env(copy, result_args(copy))("Probe4-v0")()
    for seed in range(4):
        observation, _ = env.reset(seed=seed)
        actor_out, value = copy.Context.empty(agent, 1).step(observation[None], [0], [True])
        assert value.item() == pytest.approx(env.unwrapped.optimal_value(0.99), abs=0.1)
        probability = agent.distribution(actor_out).probs[0, env.unwrapped.optimal_action()]
        assert probability.item() >= 0.95


def result_args(copy):
    return copy.Args(**PROBES["ppo_transformer"][0])


PROBES = {
    "ppo_fc": (dict(env_id="Probe5-v0", total_timesteps=20_480), fc_reaches_the_target),
    "ppo_lstm": (dict(env_id="Probe7-v0", total_timesteps=20_480), lstm_reaches_the_target),
    "ppo_transformer": (
        dict(env_id="Probe4-v0", total_timesteps=10_240, norm_reward=False),
        transformer_reaches_the_target,
    ),
    "ddpg": (
        dict(
            env_id="ContinuousProbe5-v0",
            total_timesteps=3000,
            learning_rate=1e-3,
            learning_starts=256,
            batch_size=64,
            hidden_size=64,
            buffer_size=10_000,
        ),
        ddpg_reaches_the_target,
    ),
}


@pytest.mark.parametrize("name", EDITS)
def test_an_edited_copy_trains_to_the_probes_target(tmp_path, monkeypatch, capsys, name):
    edit = EDITS[name]
    copy = edited_copy(edit, tmp_path, monkeypatch, name)
    settings, reaches_the_target = PROBES[edit.script]
    args = copy.Args(
        run_dir=str(tmp_path / "runs"), progress=False, eval_episodes=0, save_model=True, **settings
    )
    passes = []  # (agent, with gradients, in train mode) of every pass
    forward = copy.Agent.forward

    def recorded_forward(self, *inputs, **options):
        passes.append((self, torch.is_grad_enabled(), self.training))
        return forward(self, *inputs, **options)

    monkeypatch.setattr(copy.Agent, "forward", recorded_forward)
    result = copy.train(args)
    if edit.script != "ddpg":
        # the rollout, its checks and evaluation without gradients in eval mode, the update in train mode (the trial
        # of both modes runs on a copy of the agent)
        modes = {
            (gradients, training) for agent, gradients, training in passes if agent is result.agent
        }
        if name == "fc_old_weight_norm":  # no copy of it can be made: the trial runs on it
            modes.discard((False, True))
        assert modes == {(False, False), (True, True)}
    notices = re.findall(r"^notice: .*$", capsys.readouterr().err, re.MULTILINE)
    notices = [line for line in notices if "rounded down" not in line]
    assert len(notices) <= 1, notices
    if edit.notice is None:
        assert not notices, notices
    else:
        assert notices and edit.notice in notices[0], notices
    if edit.rollout == "torch":
        assert FALLBACK in notices[0]
    reaches_the_target(copy, result)
    # and its checkpoint evaluates
    returns = copy.evaluate_checkpoint(
        copy.Args(
            eval_checkpoint=str(result.checkpoint), run_dir=str(tmp_path / "runs"), eval_episodes=2
        )
    )
    assert len(returns) == 2


# --- ppo_transformer: the context a rollout acts through --------------------------------------------------------


# noise in eval mode too: no policy that trains is the one that acted
NOISE_WHILE_ACTING = (
    (
        "        x = x + self.mlp(self.ln_2(x))\n",
        "        x = x + self.mlp(self.ln_2(x))\n        x = x + 0.1 * torch.randn_like(x)\n",
    ),
)


def test_a_copy_with_one_more_block_rebuilds_a_rollouts_context_from_as_many_steps_as_its_blocks_reach(
    tmp_path, monkeypatch
):
    # a sharp agent's outputs depend on every step within reach: the carried steps must be all of them
    copy = edited_copy(EDITS["transformer_one_more_block"], tmp_path, monkeypatch, "one_more_block")
    observation_space = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
    args = copy.Args(context_len=3)
    agent = sharp_agent(copy.Agent, seed=1)(observation_space, gym.spaces.Discrete(3), args)
    obs = torch.randn(2, 30, 4, generator=torch.Generator().manual_seed(0))
    positions = torch.arange(30).expand(2, 30)
    with torch.no_grad():
        mask = copy.window_mask(torch.zeros(2, 30, dtype=torch.long), args.context_len)
        actor_out, value, _ = agent(obs, positions, mask)
    # a rollout from step 20 on, in the middle of the episodes, from the steps carried from the one before
    carried = slice(20 - agent.receptive_field, 20)
    valid = torch.ones(2, agent.receptive_field, dtype=torch.bool)
    context = copy.Context.after(agent, obs[:, carried], positions[:, carried], valid)
    for t in range(20, 30):
        step_out, step_value = context.step(
            obs[:, t], positions[:, t], torch.zeros(2, dtype=torch.bool)
        )
        torch.testing.assert_close(step_out, actor_out[:, t], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(step_value, value[:, t], rtol=1e-5, atol=1e-5)


def test_a_copy_whose_block_layers_have_no_bias_builds_with_the_initialisation_of_the_weights(
    tmp_path, monkeypatch
):
    # GPT-2-style bias-free projections: the init loop zeroes the biases there are
    edit = Edit(
        "ppo_transformer",
        (
            (
                "self.c_fc = nn.Linear(config.d_model, 4 * config.d_model)",
                "self.c_fc = nn.Linear(config.d_model, 4 * config.d_model, bias=False)",
            ),
        ),
        rollout=None,
    )
    copy = edited_copy(edit, tmp_path, monkeypatch, "bias_free")
    observation_space = gym.spaces.Box(-1, 1, (4,), np.float32)
    torch.manual_seed(0)
    agent = copy.Agent(observation_space, gym.spaces.Discrete(2), copy.Args())
    for block in agent.blocks:
        assert block.mlp.c_fc.bias is None
        assert block.mlp.c_fc.weight.std().item() == pytest.approx(0.02, rel=0.1)
        assert not block.mlp.c_proj.bias.any()


def test_a_copy_that_draws_at_random_while_acting_stops_and_says_so(tmp_path, monkeypatch):
    copy = edited_copy(Edit("ppo_transformer", NOISE_WHILE_ACTING), tmp_path, monkeypatch, "noise")
    args = copy.Args(
        env_id="Probe4-v0", num_envs=4, num_steps=32, num_minibatches=2, total_timesteps=256,
        run_dir=str(tmp_path / "runs"), progress=False, eval_episodes=0, save_model=False,
    )  # fmt: skip
    with pytest.raises(PolicyMismatch, match=r"key/value context.*at random in eval mode"):
        copy.train(args)


# --- checkpoints: a copy and its original ---------------------------------------------------------------------------


def renamed_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, *replacements: tuple[str, str]
):
    """ppo_fc.py copied to `name`.py (its runs and checkpoints are `name`'s), with `replacements` made, imported."""
    source = (REPO / "ppo_fc.py").read_text()
    for old, new in replacements:
        assert old in source, f"{old!r} is no longer in ppo_fc.py: update this test"
        source = source.replace(old, new)
    (tmp_path / f"{name}.py").write_text(source)
    spec = importlib.util.spec_from_file_location(name, tmp_path / f"{name}.py")
    copy = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, copy)
    spec.loader.exec_module(copy)
    return copy


def test_a_copy_goes_on_from_the_original_s_checkpoint_exactly_and_evaluates_it(
    tmp_path, monkeypatch
):
    import ppo_fc

    settings = dict(
        env_id="Probe5-v0", total_timesteps=1024, num_steps=64, checkpoint_every=1, eval_episodes=0
    )
    original = ppo_fc.train(ppo_fc.Args(run_dir=str(tmp_path / "runs"), progress=False, **settings))
    copy = renamed_copy(tmp_path, monkeypatch, "new_name")
    assert copy.SCRIPT == "new_name"
    halfway = original.run_dir / "checkpoints" / "step_512.pt"
    resumed = copy.train(copy.Args(resume=str(halfway), progress=False))
    assert resumed.global_step == 1024 and resumed.run_dir == original.run_dir
    for theirs, ours in zip(
        original.agent.state_dict().values(), resumed.agent.state_dict().values(), strict=True
    ):
        assert torch.equal(theirs, ours)
    returns = copy.evaluate_checkpoint(
        copy.Args(eval_checkpoint=str(halfway), run_dir=str(tmp_path / "eval"), eval_episodes=2)
    )
    assert len(returns) == 2


NEW_PARAMETER = (
    "        self.discrete = isinstance(action_space, gym.spaces.Discrete)\n",
    "        self.discrete = isinstance(action_space, gym.spaces.Discrete)\n"
    "        self.bonus_scale = nn.Parameter(torch.ones(1))\n",
)
NEW_ARRAY = (
    '{"model": agent, "optimizer": optimizer}',
    '{"model": agent, "optimizer": optimizer, "visits": np.zeros(8)}',
)


@pytest.mark.parametrize(
    ("edit", "refusal"),
    [
        (
            NEW_PARAMETER,
            "the checkpoint's 'model' (written by ppo_fc.py) does not fit this run's: the checkpoint lacks bonus_scale",
        ),
        (
            NEW_ARRAY,
            "the checkpoint (written by ppo_fc.py) has no 'visits', which this script saves and restores",
        ),
    ],
    ids=["a parameter", "an array"],
)
def test_an_edit_that_adds_to_the_checkpoint_needs_no_other_change(
    tmp_path, monkeypatch, edit, refusal
):
    # Its own checkpoints resume and evaluate; the original's, which lack the new part, are refused by name.
    import ppo_fc

    settings = dict(
        env_id="Probe1-v0", total_timesteps=512, num_steps=64, checkpoint_every=1, eval_episodes=0
    )
    copy = renamed_copy(tmp_path, monkeypatch, "my_ppo", edit)
    own = copy.train(copy.Args(run_dir=str(tmp_path / "own"), progress=False, **settings))
    resumed = copy.train(
        copy.Args(resume=str(own.run_dir / "checkpoints" / "step_256.pt"), progress=False)
    )
    for done, again in zip(
        own.agent.state_dict().values(), resumed.agent.state_dict().values(), strict=True
    ):
        assert torch.equal(done, again)
    assert len(copy.evaluate_checkpoint(copy.Args(eval_checkpoint=str(own.checkpoint), eval_episodes=1,
                                                  run_dir=str(tmp_path / "eval")))) == 1  # fmt: skip
    original = ppo_fc.train(
        ppo_fc.Args(run_dir=str(tmp_path / "original"), progress=False, **settings)
    )
    with pytest.raises(UsageError) as refused:
        copy.train(
            copy.Args(resume=str(original.run_dir / "checkpoints" / "step_256.pt"), progress=False)
        )
    assert str(refused.value) == refusal


def test_a_learned_initial_state_is_trained_by_the_update_and_resumes_exactly(
    tmp_path, monkeypatch
):
    # The update's sequences start episodes from it too: it moves, and a resumed run equals an uninterrupted one.
    copy = edited_copy(EDITS["lstm_learned_initial_state"], tmp_path, monkeypatch, "learned_start")
    settings = dict(
        env_id="Probe7-v0",
        total_timesteps=2048,
        checkpoint_every=1,
        eval_episodes=0,
        progress=False,
    )
    done = copy.train(copy.Args(run_dir=str(tmp_path / "runs"), **settings))
    assert done.agent.start.abs().max() > 1e-3
    halfway = done.run_dir / "checkpoints" / "step_1024.pt"
    resumed = copy.train(copy.Args(resume=str(halfway), progress=False))
    for name, parameter in done.agent.state_dict().items():
        assert torch.equal(resumed.agent.state_dict()[name], parameter), name


# --- wrong edits: each stops with its own message, and the fix that message names trains ----------------------------

FC_ACT = "                actions[step] = act(obs[step], noise[step])\n"
FC_POLICY = "        return agent.sample(agent.distribution(agent(obs)[0]), noise)\n"
FC_CATEGORICAL = "            return Categorical(logits=actor_out, validate_args=False)\n"
FC_MAKE = (
    "        return envs.make(env_id, frame_stack=4, video_folder=video, video_every=video_every)\n"
)
FC_LOGSTD = "        if not self.discrete:\n            self.actor_logstd"
EXPLORER = (
    MLP_ACTOR.replace("self.actor =", "self.explorer =") + "\n"
)  # the actor's twin, for acting
# a wrapper made in make_env: gymnasium.Wrapper is what a researcher reaches for
REPEAT_WRAPPER = (
    "class RepeatAction(gym.Wrapper):\n"
    "    def step(self, action):\n"
    "        total = 0.0\n"
    "        for _ in range(2):\n"
    "            obs, reward, terminated, truncated, info = self.env.step(action)\n"
    "            total += reward\n"
    "            if terminated or truncated:\n"
    "                break\n"
    "        return obs, total, terminated, truncated, info\n\n\n"
    "def make_env("
)
REWARD_WRAPPER = (
    "class RewardInObservation(gym.Wrapper):\n"
    "    def step(self, action):\n"
    "        obs, reward, terminated, truncated, info = self.env.step(action)\n"
    "        return obs + np.float32(0.1 * reward), reward, terminated, truncated, info\n\n\n"
    "def make_env("
)


@dataclass(frozen=True)
class WrongEdit:
    script: str
    wrong: tuple[tuple[str, str], ...]
    """the edit that makes the rollout act otherwise than the update scores"""
    message: str
    """a regular expression the error line matches: what differed, the likely edit, and the place of the fix"""
    fix: tuple[tuple[str, str], ...] | str
    """the fix the message names, made in a fresh copy; or the EDITS entry that is that fix (trained there)"""


WRONG_EDITS = {
    "epsilon_greedy_in_the_loop": WrongEdit(
        "ppo_fc",
        (
            (
                FC_ACT,
                FC_ACT + "                explore = np.random.random(args.num_envs) < 0.2\n"
                "                actions[step][explore] = np.random.randint(0, agent.action_size, explore.sum())\n",
            ),
        ),
        r"^the loop changed \d+ of the \d+ actions `act` drew before storing them .*as ε-greedy there does.*"
        r"exploration belongs in Agent\.distribution .*docs/ppo_fc\.md, \"When a check stops a run\"",
        (
            (
                FC_CATEGORICAL,
                "            probs = 0.9 * torch.softmax(actor_out, -1) + 0.1 / self.action_size\n"
                "            return Categorical(probs=probs, validate_args=False)\n",
            ),
        ),
    ),
    "temperature_in_the_rollout_only": WrongEdit(
        "ppo_fc",
        ((FC_POLICY, FC_POLICY.replace("agent(obs)[0]", "agent(obs)[0] / 2.0")),),
        r"^the rollout acted with another policy than the update's: .*rollout_policy's policy calls the update's "
        r"modules on the same inputs but draws otherwise, first at step \d+, env \d+: .*a temperature.*belongs "
        r"there\), or the update's scoring .*an unstable inverse.*To tell them apart.* \(docs/ppo_fc",
        ((FC_CATEGORICAL, FC_CATEGORICAL.replace("logits=actor_out", "logits=actor_out / 2.0")),),
    ),
    "noise_scaled_in_the_loop": WrongEdit(
        "ppo_fc",
        ((FC_ACT, FC_ACT.replace("noise[step])", "noise[step] * 2.0)")),),
        r"^the loop gave `act` other noise than Agent\.sampling_noise drew \(noise\[step\], first at step 0.*"
        r"a temperature or an exploration scale belongs in Agent\.distribution \(docs/ppo_fc",
        "temperature_in_the_rollout_only",
    ),
    "action_repeated_in_the_loop": WrongEdit(
        "ppo_fc",
        (
            (
                FC_ACT,
                FC_ACT
                + "                if step % 2:\n                    actions[step] = actions[step - 1]\n",
            ),
        ),
        r"^the loop replaced \d+ of the \d+ actions `act` drew with the env's action of the step before .*"
        r"a wrapper in make_env that steps each action k times",
        (
            ("def make_env(", REPEAT_WRAPPER),
            (
                FC_MAKE,
                FC_MAKE.replace("return envs.make(", "return RepeatAction(envs.make(").replace(
                    "every)\n", "every))\n"
                ),
            ),
        ),
    ),
    "reward_added_to_the_observations_in_the_loop": WrongEdit(
        "ppo_fc",
        (
            (
                FC_ACT,
                FC_ACT.replace("act(obs[step]", "act(obs[step] + 0.1 * rewards[step - 1][:, None]"),
            ),
        ),
        r"^the loop gave `act` another obs\[step\] than it stored for the update \(first at step \d+, env \d+\).*"
        r"change the observation in make_env, with a wrapper",
        (
            ("def make_env(", REWARD_WRAPPER),
            (
                FC_MAKE,
                FC_MAKE.replace(
                    "return envs.make(", "return RewardInObservation(envs.make("
                ).replace("every)\n", "every))\n"),
            ),
        ),
    ),
    "another_network_in_the_rollout": WrongEdit(
        "ppo_fc",
        (
            (FC_LOGSTD, EXPLORER + FC_LOGSTD),
            (
                FC_POLICY,
                FC_POLICY.replace(
                    "agent(obs)[0]", "agent.explorer(agent.obs_norm(agent.normalised_part(obs)))"
                ),
            ),
        ),
        r"^the rollout acted with another policy than the update's: .*rollout_policy's policy calls explorer where "
        r"the update's pass \(Agent\.forward\) calls actor, critic: .*belongs in Agent\.forward \(docs/ppo_fc",
        (
            (FC_LOGSTD, EXPLORER + FC_LOGSTD),
            (FC_RETURN, FC_RETURN.replace("self.actor(hidden)", "self.explorer(hidden)")),
        ),
    ),
    "a_lagged_copy_acts": WrongEdit(
        "ppo_fc",
        (
            (
                "            act = rollout_policy(agent,",
                "            if iteration % 2 == 1:\n                import copy\n\n"
                "                behaviour = copy.deepcopy(agent)\n"
                "            act = rollout_policy(behaviour,",
            ),
        ),
        r"^the rollout's policy was made from another Agent than the one the update trains: .*rollout_policy must be "
        r"given the agent that trains \(docs/ppo_fc",
        (),  # the script as it is: its rollout acts with the agent that trains
    ),
    "noise_in_the_network_while_acting": WrongEdit(
        "ppo_fc",
        ((FC_RETURN, "        hidden = hidden + 0.1 * torch.randn_like(hidden)\n" + FC_RETURN),),
        r"^the rollout acted with another policy than the update's: .*the torch policy gives other outputs on a "
        r"second call with the same inputs, in eval mode: .*Tie noise in the network to module\.training",
        (
            (
                FC_RETURN,
                "        if self.training:\n            hidden = hidden + 0.1 * torch.randn_like(hidden)\n"
                + FC_RETURN,
            ),
        ),
    ),
    "learned_start_state_in_forward_only": WrongEdit(
        "ppo_lstm",
        (
            LEARNED_START_PARAMETER,
            (
                "        state = self.reset_state(state, episode_starts[0])\n",
                "        starting = self.start.expand(-1, state.shape[1], -1)\n"
                "        state = torch.where(episode_starts[0][None, :, None], starting, state)\n",
            ),
        ),
        r"^the rollout acted with another policy than the update's: .*the update's pass along the rollout departs from "
        r"the rollout's steps at step \d+, env \d+, where an episode starts: .*"
        r"define it in Agent\.initial_state alone.*docs/ppo_lstm\.md",
        "lstm_learned_initial_state",
    ),
}


@pytest.mark.parametrize("name", WRONG_EDITS)
def test_a_wrong_edit_stops_with_its_own_message_and_the_fix_it_names_trains(
    tmp_path, monkeypatch, name
):
    row = WRONG_EDITS[name]
    settings, reaches_the_target = PROBES[row.script]
    folders = {kind: tmp_path / kind for kind in ("wrong", "fixed")}
    for folder in folders.values():
        folder.mkdir()

    def args(copy):
        return copy.Args(
            run_dir=str(tmp_path / "runs"), progress=False, eval_episodes=0, **settings
        )

    wrong = edited_copy(Edit(row.script, row.wrong), folders["wrong"], monkeypatch, f"{name}_wrong")
    with pytest.raises(PolicyMismatch) as stopped:
        wrong.train(args(wrong))
    assert re.search(row.message, str(stopped.value)), str(stopped.value)
    # its own message: no other row's matches it
    others = [
        other
        for other, edit in WRONG_EDITS.items()
        if other != name and re.search(edit.message, str(stopped.value))
    ]
    assert not others, others
    if isinstance(
        row.fix, str
    ):  # the fix is another test's edit, trained to the probe's target there
        fix = EDITS[row.fix] if row.fix in EDITS else Edit(row.script, WRONG_EDITS[row.fix].fix)
        assert fix.script == row.script
        if row.fix in EDITS:
            return
    else:
        fix = Edit(row.script, row.fix)
    fixed = edited_copy(fix, folders["fixed"], monkeypatch, f"{name}_fixed")
    reaches_the_target(fixed, fixed.train(args(fixed)))

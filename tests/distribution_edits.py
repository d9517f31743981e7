"""Three copies of ppo_fc.py with another distribution, edited as the docs say (docs/ppo_fc.md, "A distribution
of your own"): a tanh-squashed Gaussian and a Beta for Box actions, and an independent categorical per part of a
MultiDiscrete action. `copy_source(name)` gives the copy's text."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

IMPORTS = (
    "from torch.distributions import Categorical, Normal\n",
    "from torch.distributions import AffineTransform, Beta, Categorical, Normal, TanhTransform\n"
    "from torch.distributions import TransformedDistribution\n",
)
BOUNDS = (  # the Box's bounds as tensors, in the state dict: the copy's policy maps onto them
    "        if not self.discrete:\n            self.actor_logstd = nn.Parameter(torch.zeros(1, self.action_size))\n",
    "        if not self.discrete:\n            self.actor_logstd = nn.Parameter(torch.zeros(1, self.action_size))\n"
    "            self.register_buffer('low', torch.as_tensor(action_space.low, dtype=torch.float32).flatten())\n"
    "            self.register_buffer('high', torch.as_tensor(action_space.high, dtype=torch.float32).flatten())\n",
)
NORMAL = "        return Normal(actor_out, self.actor_logstd.expand_as(actor_out).exp(), validate_args=False)\n"
GAUSSIAN_DRAW = "            return policy.mean + policy.stddev * noise\n"
ENTROPY = "policy.entropy().sum(-1), value"

TANH_GAUSSIAN = (
    IMPORTS,
    BOUNDS,
    (
        NORMAL,
        "        gaussian = Normal(actor_out, self.actor_logstd.expand_as(actor_out).exp(), validate_args=False)\n"
        "        to_bounds = AffineTransform((self.high + self.low) / 2, (self.high - self.low) / 2)\n"
        "        return TransformedDistribution(gaussian, [TanhTransform(), to_bounds], validate_args=False)\n",
    ),
    (
        GAUSSIAN_DRAW,
        GAUSSIAN_DRAW + "        if isinstance(policy, TransformedDistribution):\n"
        "            action = policy.base_dist.mean + policy.base_dist.stddev * noise\n"
        "            for transform in policy.transforms:\n"
        "                action = transform(action)\n"
        "            return action\n",
    ),
    # the squashed Gaussian has no closed-form entropy: the Gaussian's stands in for it
    (ENTROPY, "policy.base_dist.entropy().sum(-1), value"),
)

# A Beta per dimension, its two concentrations from the actor (1 + softplus: unimodal), scaled to the bounds. Its
# draw from uniform noise: two Gamma quantiles (Newton's method on the regularised incomplete gamma function, from
# Wilson and Hilferty's start), X / (X + Y).
GAMMA_QUANTILE = '''

def gamma_quantile(concentration: Tensor, u: Tensor, steps: int = 12) -> Tensor:
    """The `u`-quantile of Gamma(concentration, 1), in float64."""
    a, u = concentration.double(), u.double()
    x = (a * (1 - 1 / (9 * a) + torch.special.ndtri(u) / (3 * a.sqrt())) ** 3).clamp(min=1e-3)
    for _ in range(steps):
        density = torch.exp((a - 1) * x.log() - x - torch.lgamma(a))
        x = (x - (torch.special.gammainc(a, x) - u) / density).clamp(min=1e-6)
    return x


class Agent(nn.Module):'''
BETA = (
    IMPORTS,
    BOUNDS,
    ("\n\nclass Agent(nn.Module):", GAMMA_QUANTILE),
    (
        "layer_init(nn.Linear(hidden_size, self.action_size), std=0.01)",
        "layer_init(nn.Linear(hidden_size, self.action_size * (1 + (not self.discrete))), std=0.01)",
    ),
    (
        NORMAL,
        "        alpha, beta = (1 + nn.functional.softplus(part) for part in actor_out.chunk(2, -1))\n"
        "        to_bounds = AffineTransform(self.low, self.high - self.low)\n"
        "        beta = Beta(alpha, beta, validate_args=False)\n"
        "        return TransformedDistribution(beta, [to_bounds], validate_args=False)\n",
    ),
    (
        "        noise = torch.empty((*batch_shape, self.action_size), device=next(self.parameters()).device)\n",
        "        size = self.action_size * (1 + (not self.discrete))  # a Beta's: two uniforms per dimension\n"
        "        noise = torch.empty((*batch_shape, size), device=next(self.parameters()).device)\n",
    ),
    ("        return noise.normal_()\n", "        return noise.uniform_(1e-6, 1 - 1e-6)\n"),
    (
        GAUSSIAN_DRAW,
        GAUSSIAN_DRAW + "        if isinstance(policy, TransformedDistribution):\n"
        "            beta = policy.base_dist\n"
        "            u, v = noise.chunk(2, -1)\n"
        "            x, y = gamma_quantile(beta.concentration1, u), gamma_quantile(beta.concentration0, v)\n"
        "            action = (x / (x + y)).to(noise.dtype)\n"
        "            for transform in policy.transforms:\n"
        "                action = transform(action)\n"
        "            return action\n",
    ),
    ("policy.entropy().sum(-1), value", "policy.base_dist.entropy().sum(-1), value"),
)


def copy_source(edits: tuple[tuple[str, str], ...]) -> str:
    source = (REPO / "ppo_fc.py").read_text()
    for old, new in edits:
        assert old in source, f"the edit no longer applies to ppo_fc.py: {old!r}"
        source = source.replace(old, new)
    return source


# An independent categorical per part of a MultiDiscrete action: the actor's logits split by part, a Gumbel-max draw
# in each, the parts' log-probabilities and entropies added. The envs keep the parts (envs.make's joint=False) and
# the run takes the space.
MULTI_CATEGORICAL = '''

class MultiCategorical(torch.distributions.Distribution):
    """One categorical per part of a MultiDiscrete action, independent: `logits` split by `nvec`."""

    def __init__(self, logits: Tensor, nvec: list[int]):
        self.nvec = nvec
        self.parts = [Categorical(logits=part, validate_args=False) for part in logits.split(nvec, -1)]
        super().__init__(logits.shape[:-1], torch.Size([len(nvec)]), validate_args=False)

    def log_prob(self, action: Tensor) -> Tensor:
        return sum(part.log_prob(a) for part, a in zip(self.parts, action.unbind(-1)))

    def entropy(self) -> Tensor:
        return sum(part.entropy() for part in self.parts)

    def sample(self, sample_shape: torch.Size = torch.Size()) -> Tensor:
        return torch.stack([part.sample(sample_shape) for part in self.parts], -1)

    @property
    def mode(self) -> Tensor:
        return torch.stack([part.probs.argmax(-1) for part in self.parts], -1)


class Agent(nn.Module):'''
RUN = "Run(args, SCRIPT, make_env, check_args"
MULTI_DISCRETE = (
    ("\n\nclass Agent(nn.Module):", MULTI_CATEGORICAL),
    ("video_every=video_every)", "video_every=video_every, joint=False)"),
    (RUN, RUN + ", actions=(gym.spaces.Discrete, gym.spaces.Box, gym.spaces.MultiDiscrete)"),
    (
        "        self.discrete = isinstance(action_space, gym.spaces.Discrete)\n",
        "        self.discrete = isinstance(action_space, gym.spaces.Discrete)\n"
        "        self.multi = isinstance(action_space, gym.spaces.MultiDiscrete)\n",
    ),
    (
        "int(action_space.n) if self.discrete else int(np.prod(action_space.shape))",
        "int(action_space.n) if self.discrete else int(action_space.nvec.sum()) if self.multi "
        "else int(np.prod(action_space.shape))",
    ),
    ("        if not self.discrete:\n", "        if not self.discrete and not self.multi:\n"),
    (
        "        if self.discrete:\n            # validating costs more than the network\n",
        "        if self.multi:\n            return MultiCategorical(actor_out, self.action_space.nvec.tolist())\n"
        "        if self.discrete:\n            # validating costs more than the network\n",
    ),
    (
        "        if self.discrete:\n            return action, policy.log_prob(action), policy.entropy(), value\n",
        "        if self.discrete or self.multi:\n"
        "            return action, policy.log_prob(action), policy.entropy(), value\n",
    ),
    (
        "        if self.discrete:\n            return noise.exponential_()",
        "        if self.discrete or self.multi:\n            return noise.exponential_()",
    ),
    (
        "        space = self.action_space\n        if self.discrete:\n",
        "        space = self.action_space\n        if self.multi:\n            return action + space.start\n"
        "        if self.discrete:\n",
    ),
    (
        "        if isinstance(policy, Categorical):\n",
        "        if isinstance(policy, MultiCategorical):\n"
        "            parts = zip(policy.parts, noise.split(policy.nvec, -1))\n"
        "            return torch.stack([torch.argmax(part.logits + n, -1) for part, n in parts], -1)\n"
        "        if isinstance(policy, Categorical):\n",
    ),
    (
        "    action_shape = () if agent.discrete else (agent.action_size,)\n"
        "    action_dtype = np.int64 if agent.discrete else np.float32\n",
        "    action_shape = () if agent.discrete else (len(agent.action_space.nvec),) if agent.multi "
        "else (agent.action_size,)\n"
        "    action_dtype = np.int64 if agent.discrete or agent.multi else np.float32\n",
    ),
    (
        "    if agent.discrete:\n        return policy.log_prob(actions)\n",
        "    if agent.discrete or agent.multi:\n        return policy.log_prob(actions)\n",
    ),
)

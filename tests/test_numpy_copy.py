"""common/numpy_copy.py and numpy_cells.py: the NumPy copy of a policy function, recorded from one call of it, and
what it refuses."""

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributions import Categorical, Normal

from common import numpy_copy as numpy_copy_module
from common import rollout_checks
from common.errors import PolicyMismatch
from common.numpy_cells import numpy_cell
from common.numpy_copy import LAYERS, NoNumpyForm, numpy_copy, record_numpy_copy


def assert_copies(policy, network, *inputs, later=()):
    """The copy of `policy` recorded on `inputs` gives torch's outputs there and on `later` inputs of the same shapes,
    and takes in new weights at its next check."""
    copy = record_numpy_copy(policy, inputs, network)
    for arrays in (inputs, *later):
        with torch.no_grad():
            expected = policy(*map(torch.as_tensor, arrays))
        expected = expected if isinstance(expected, tuple) else (expected,)
        outputs = copy(*arrays)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        for a, b in zip(outputs, expected, strict=True):
            np.testing.assert_allclose(a, b.numpy(), rtol=1e-5, atol=1e-5)
    return copy


def test_every_known_layer_is_copied_as_torch_computes_it():
    torch.manual_seed(0)
    layers = {
        nn.Linear: nn.Linear(6, 6),
        nn.LayerNorm: nn.LayerNorm(6),
        nn.Tanh: nn.Tanh(),
        nn.ReLU: nn.ReLU(),
        nn.LeakyReLU: nn.LeakyReLU(0.1),
        nn.ELU: nn.ELU(0.5),
        nn.Sigmoid: nn.Sigmoid(),
        nn.SiLU: nn.SiLU(),
        nn.Identity: nn.Identity(),
        nn.Flatten: nn.Flatten(),
        nn.GELU: nn.GELU(),
        nn.Softmax: nn.Softmax(-1),
    }
    assert set(layers) == set(LAYERS)
    with torch.no_grad():
        layers[nn.LayerNorm].weight.normal_()
        layers[nn.LayerNorm].bias.normal_()
    batch_norm = nn.BatchNorm1d(6)  # as it acts in eval mode: by running statistics
    with torch.no_grad():
        for x in (batch_norm.running_mean, batch_norm.weight, batch_norm.bias):
            x.normal_()
        batch_norm.running_var.uniform_(0.5, 2.0)
    x = (torch.randn(64, 6) * 3).numpy()
    for layer in (*layers.values(), nn.GELU("tanh"), batch_norm.eval()):
        network = nn.Sequential(nn.Linear(6, 6), layer)
        assert_copies(network, network, x, later=[(x * 2,)])


@pytest.mark.parametrize("cell_type", [nn.LSTM, nn.GRU])
@pytest.mark.parametrize("layers, bias", [(1, True), (2, True), (2, False)])
def test_the_numpy_form_of_a_cell_steps_as_torch_does(cell_type, layers, bias):
    torch.manual_seed(0)
    rnn = cell_type(5, 7, layers, bias=bias)
    step = numpy_cell(rnn)
    x = torch.randn(6, 3, 5)
    state = torch.randn(layers, 3, 14 if cell_type is nn.LSTM else 7)
    torch_state = tuple(state.chunk(2, -1)) if cell_type is nn.LSTM else state
    numpy_state = tuple(x.numpy() for x in torch_state) if cell_type is nn.LSTM else state.numpy()
    with torch.no_grad():
        for t in range(len(x)):
            output, torch_state = rnn(x[t : t + 1], torch_state)
            numpy_output, numpy_state = step(x[t : t + 1].numpy(), numpy_state)
            np.testing.assert_allclose(numpy_output, output.numpy(), rtol=1e-5, atol=1e-5)
            for a, b in zip(np.atleast_3d(*numpy_state) if cell_type is nn.LSTM else [numpy_state],
                            torch_state if cell_type is nn.LSTM else [torch_state], strict=True):  # fmt: skip
                np.testing.assert_allclose(a, b.numpy(), rtol=1e-5, atol=1e-5)
        zero_state = step(x[:1].numpy(), None)[0]
        np.testing.assert_allclose(zero_state, rnn(x[:1])[0].numpy(), rtol=1e-5, atol=1e-5)
    for unusual in (dict(bidirectional=True), dict(batch_first=True), dict(proj_size=3)):
        if cell_type is nn.GRU and "proj_size" in unusual:
            continue
        with pytest.raises(NoNumpyForm):
            numpy_cell(cell_type(5, 7, **unusual))
    with pytest.raises(NoNumpyForm, match="one step"):
        step(x[:2].numpy(), None)


class ScaledLinear(nn.Linear):
    """A subclass computes what its forward says: the copy follows it in."""

    def forward(self, x):
        return 2 * super().forward(x)


class SharedTorso(nn.Module):
    """Ordinary edits of a script's network: a shared torso, a residual sum, a gate, a scale parameter, a layer after a
    recurrent core, and a policy distribution with a state-dependent std."""

    def __init__(self):
        super().__init__()
        self.torso = nn.Sequential(
            nn.Linear(4, 16), nn.LayerNorm(16), nn.GELU(), ScaledLinear(16, 16), nn.SiLU()
        )
        self.rnn = nn.LSTM(16, 8)
        self.after = nn.Sequential(nn.Linear(8, 8), nn.Tanh())
        self.actor = nn.Linear(8 + 16, 6)
        self.critic = nn.Linear(16, 1)
        self.scale = nn.Parameter(torch.tensor(1.5))

    def forward(self, x, state, starts):
        hidden = self.torso(x.float())
        hidden = hidden + F.relu(hidden) * torch.sigmoid(self.scale)
        state = state * ~starts[:, None]
        h, c = state.chunk(2, -1)
        out, (h, c) = self.rnn(hidden[None], (h[None].contiguous(), c[None].contiguous()))
        features = torch.cat([self.after(out[0]), hidden], -1)
        mean, log_std = self.actor(features).split(3, -1)
        return (
            mean,
            log_std.clamp(-5, 2),
            self.critic(hidden).squeeze(-1),
            torch.cat([h[0], c[0]], -1),
        )


def test_the_copy_follows_the_network_wherever_its_forward_leads():
    torch.manual_seed(0)
    network = SharedTorso()
    rng = np.random.default_rng(0)

    def policy(x, state, starts, noise):
        mean, log_std, _, next_state = network(x, state, starts)
        return Normal(
            mean, log_std.exp(), validate_args=False
        ).mean + log_std.exp() * noise, next_state

    def inputs():
        return (rng.normal(size=(5, 4)).astype(np.float32), rng.normal(size=(5, 16)).astype(np.float32),
                rng.random(5) < 0.5, rng.normal(size=(5, 3)).astype(np.float32))  # fmt: skip

    copy = assert_copies(policy, network, *inputs(), later=[inputs(), inputs()])
    assert "critic" not in copy.code and copy.code.count("\n") < 120  # what the outputs need, only
    first = inputs()
    copy = numpy_copy(policy, first, network)
    before = copy(*first)
    with torch.no_grad():
        for parameter in network.parameters():
            parameter.mul_(1.1)
    np.testing.assert_array_equal(copy(*first)[0], before[0])  # a snapshot, until its next check
    assert numpy_copy(policy, first, network) is copy  # the next rollout's: new weights, checked
    with torch.no_grad():
        expected = policy(*map(torch.as_tensor, first))[0].numpy()
    np.testing.assert_allclose(copy(*first)[0], expected, rtol=1e-5, atol=1e-5)
    assert np.abs(expected - before[0]).max() > 0.01


def test_a_categorical_draw_with_the_gumbel_max_trick_is_copied():
    torch.manual_seed(0)
    network = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 5))

    def policy(x, noise):
        return torch.argmax(Categorical(logits=network(x), validate_args=False).logits + noise, -1)

    x, noise = torch.randn(256, 3) * 3, -torch.log(torch.empty(256, 5).exponential_())
    copy = assert_copies(policy, network, x.numpy(), noise.numpy())
    assert len(np.unique(copy(x.numpy(), noise.numpy()))) == 5


class Branching(nn.Module):
    def __init__(self, edit):
        super().__init__()
        self.linear, self.edit = nn.Linear(3, 3), edit

    def forward(self, x):
        return self.edit(self.linear(x))


@pytest.mark.parametrize(
    "edit, named",
    [
        (
            nn.BatchNorm1d(3),
            "add_ changes a weight or buffer in BatchNorm1d at edit",
        ),  # its count of batches, in train mode
        (nn.Dropout(0.5).train(), "dropout in train mode draws at random in Dropout at edit"),
        (nn.Softshrink(0.1), "no NumPy form for torch's softshrink in Softshrink at edit"),
        (lambda x: x if x.sum() > 0 else -x, "__bool__"),
        (lambda x: (x[:, :2].mul_(2), x)[1], "in-place mul_"),  # x changes through its view
        (torch.asinh, "no NumPy form for torch's asinh in Branching"),
        (lambda x: x + torch.randn_like(x), "randn_like"),
        (lambda x: x * x.max().item(), "item"),
    ],
)
def test_what_the_copy_cannot_follow_it_names(edit, named):
    network = Branching(edit)
    with pytest.raises(NoNumpyForm, match=named):
        record_numpy_copy(network, (np.ones((4, 3), np.float32),), network)


def test_hooks_and_parametrizations_are_followed_into():
    torch.manual_seed(0)
    network = nn.Sequential(
        nn.Linear(3, 3), nn.Tanh(), nn.utils.parametrizations.weight_norm(nn.Linear(3, 2))
    )
    network[0].register_forward_hook(lambda module, inputs, output: 2 * output)
    x = np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32)
    assert_copies(network, network, x, later=[(x * 3,)])
    with torch.no_grad():
        network[2].parametrizations.weight.original1.mul_(
            2
        )  # a new weight through the parametrization
    refreshed = numpy_copy(network, (x,), network)
    with torch.no_grad():
        np.testing.assert_allclose(
            refreshed(x), network(torch.as_tensor(x)).numpy(), rtol=1e-5, atol=1e-5
        )


def test_what_it_cannot_follow_makes_torch_act_with_one_notice(capsys):
    network = nn.Sequential(nn.Linear(3, 3), nn.Softshrink(0.1))
    x = np.ones((4, 3), np.float32)
    assert numpy_copy(network, (x,), network) is None
    assert numpy_copy(network, (x,), network) is None  # once per network and policy
    err = capsys.readouterr().err
    assert err.count("notice: the rollout acts with the torch policy") == 1
    assert "softshrink in Softshrink at 1" in err


def test_a_copy_that_computes_otherwise_names_the_module_and_is_not_used(capsys, monkeypatch):
    network = nn.Sequential(nn.Linear(3, 3), nn.Tanh(), nn.Linear(3, 2))
    linear = numpy_copy_module.LAYERS[nn.Linear]
    monkeypatch.setitem(
        numpy_copy_module.LAYERS,
        nn.Linear,
        lambda layer: (lambda f: lambda x: f(x) + 1)(linear(layer)),
    )
    assert numpy_copy(network, (np.ones((4, 3), np.float32),), network) is None
    assert "computes otherwise than torch in Linear at 0" in capsys.readouterr().err


def test_a_copy_whose_python_state_changed_is_recorded_again():
    class Tempered(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear, self.temperature = nn.Linear(3, 3), 1.0

        def forward(self, x):
            return self.linear(x) / self.temperature  # a float, not a weight: recorded as it is

    torch.manual_seed(0)
    network, x = Tempered(), np.ones((4, 3), np.float32)
    first = numpy_copy(network, (x,), network)
    network.temperature = 2.0
    second = numpy_copy(network, (x,), network)
    assert second is not first
    with torch.no_grad():
        # float32 rounding, NumPy's against torch's; temperature 1 would be off by half
        np.testing.assert_allclose(second(x), network(torch.as_tensor(x)).numpy(), rtol=1e-5)


def test_a_network_that_trains_otherwise_is_told_without_touching_the_run():
    torch.manual_seed(0)
    x = np.zeros((8, 3), np.float32)  # a probe's observation: zeros would show no dropout at work
    plain = nn.Sequential(nn.Linear(3, 3), nn.Tanh())
    forward = lambda net, obs: net(torch.as_tensor(obs))  # noqa: E731
    assert not rollout_checks.acts_otherwise_in_training(plain, forward, x)
    normed = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))
    dropout = nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.5))
    state = torch.random.get_rng_state()
    assert rollout_checks.acts_otherwise_in_training(normed, forward, x)
    assert torch.equal(normed[1].running_mean, torch.zeros(3))  # its statistics are untouched
    with torch.no_grad():
        for layer in (normed[0], dropout[0]):
            layer.bias.zero_()  # as a new network's
    assert rollout_checks.acts_otherwise_in_training(dropout, forward, x)
    assert torch.equal(torch.random.get_rng_state(), state)  # and the run's draws
    assert dropout.training and normed.training


# What a review found the copy got wrong on inputs other than the recorded ones: each now copied right or refused.


def later_inputs(seed: int = 1, scale: float = 1.0) -> list[tuple[np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [((rng.normal(size=(8, 4)) * scale).astype(np.float32),) for _ in range(5)]


def test_in_place_results_are_what_later_lines_read():
    torch.manual_seed(0)
    network = nn.Sequential(nn.Linear(4, 4), nn.ReLU(inplace=True))

    def clipped(x):
        h = network[0](x)
        F.hardtanh(h, -0.1, 0.1, inplace=True)  # does nothing to small first inputs
        return h * 2

    def shared(x):
        h = x * 1.0
        return network[1](h) + h  # ReLU(inplace=True) changed h

    small = (np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32) * 0.01,)
    assert_copies(clipped, network, *small, later=later_inputs(scale=10))
    assert_copies(shared, network, *small, later=later_inputs())


def test_a_layer_of_the_network_on_a_constant_input_follows_its_weights():
    torch.manual_seed(0)
    network = nn.ModuleDict({"body": nn.Linear(4, 3), "bias": nn.Linear(1, 3)})

    def policy(x):
        return network["body"](x) + network["bias"](torch.ones(1, 1))

    x = later_inputs()[0]
    copy = numpy_copy(policy, x, network)
    with torch.no_grad():
        network["bias"].bias.add_(0.5)
    assert numpy_copy(policy, x, network) is copy
    with torch.no_grad():
        np.testing.assert_allclose(
            copy(*x), policy(torch.as_tensor(x[0])).numpy(), rtol=1e-5, atol=1e-5
        )


def test_casts_follow_torchs_dtypes_and_infinite_constants_are_written_out():
    network = nn.Linear(4, 4)

    def policy(x):
        counts = (x > 0).to(x) + (x > 1).to(x)  # floats: 2 where both hold, not a logical or
        return torch.where(counts > 1, network(x), float("-inf")).clamp(min=-1e6) * counts

    assert_copies(policy, network, *later_inputs(scale=0.3)[0], later=later_inputs(scale=3))


@pytest.mark.parametrize(
    "policy, named",
    [
        (lambda net, x: net(x) + torch.randn(8, 4), "draws from torch's generator"),
        (
            lambda net, x: Normal(net(x), 1.0, validate_args=False).rsample(),
            "draws from torch's generator",
        ),
        (lambda net, x: net(x)[:, : (x[0] > 0).sum()].sum(-1), "slice bounded by a tensor"),
        (
            lambda net, x: net(x)[x > 0].view(-1, 1).sum(0),
            "number of elements that depends on values",
        ),
        (lambda net, x: torch.clamp(net(x), -1, 1, out=torch.empty(8, 4)), "in-place clamp"),
    ],
)
def test_what_differs_at_later_inputs_is_refused(policy, named):
    network = nn.Linear(4, 4)
    with pytest.raises(NoNumpyForm, match=named):
        record_numpy_copy(lambda x: policy(network, x), later_inputs()[0], network)


def test_a_network_and_its_copies_are_freed_together():
    import gc
    import weakref

    network = nn.Linear(4, 4)
    assert numpy_copy(network, later_inputs()[0], network) is not None
    alive = weakref.ref(network)
    del network
    gc.collect()
    assert alive() is None


def test_ordinary_operations_a_review_found_refused_are_copied():
    torch.manual_seed(0)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(8, 8), nn.Linear(8, 8)
            self.norm, self.embed = nn.GroupNorm(2, 8), nn.Embedding(3, 8)
            self.unflatten = nn.Unflatten(-1, (2, 4))

        def forward(self, x):
            out = self.fc2(torch.tanh(self.fc1(x)))
            out += x  # in place, on a tensor nothing else views
            out = self.norm(out) + self.embed(torch.zeros(len(x), dtype=torch.long))
            out = torch.cat([out, F.normalize(out, dim=-1)], -1) * out.var(-1, keepdim=True)
            out = self.unflatten(out[:, :8]).flatten(1) + torch.zeros_like(out[:, 8:])
            masked = out.masked_fill(out > 1, 1.0)
            return torch.einsum("bi,bi->b", out, masked) + F.glu(out, -1).sum(-1)

    network = Block()
    x = np.random.default_rng(0).normal(size=(8, 8)).astype(np.float32)
    later = [
        (np.random.default_rng(seed).normal(size=(8, 8)).astype(np.float32),) for seed in (1, 2, 3)
    ]
    assert_copies(network, network, x, later=later)


def acting_on(steps=3, envs=2):
    """An `Acting` of a two-input policy as a rollout of `steps` steps calls it, and the loop's arrays."""
    obs = np.zeros((steps, envs, 2), np.float32)
    noise = np.random.default_rng(0).standard_normal((steps, envs)).astype(np.float32)

    def policy(o, n):
        return (o[:, 0] > n.mean()).astype(np.int64)

    names = ("obs[step]", "noise[step]")
    act = rollout_checks.Acting(
        policy, policy, True, nn.Linear(2, 2), None, names, (obs, noise), "p.md"
    )
    return act, obs, noise, np.zeros((steps, envs), np.int64)


def test_the_record_keeps_what_act_was_given_then_not_what_the_loop_wrote_after():
    act, obs, noise, actions = acting_on()
    for step in range(len(obs)):
        obs[step] = step
        actions[step] = act(obs[step], noise[step])
    act.check(act.network, torch.as_tensor(actions.reshape(-1)))  # as the loop stored it
    obs[1] += (
        0.5  # written after `act` read it: the update would train on what the policy never saw
    )
    with pytest.raises(
        PolicyMismatch, match=r"another obs\[step\] than it stored .*first at step 1, env 0"
    ):
        act.check(act.network, torch.as_tensor(actions.reshape(-1)))


def test_calls_that_do_not_fit_the_record_s_arrays_are_kept_and_checked_all_the_same():
    act, obs, noise, actions = acting_on()
    for step in range(len(obs)):
        given = (
            obs[step] if step != 1 else np.ones((3, 2), np.float32)
        )  # another shape: a third env
        actions[step] = act(given, noise[step])[:2]
    assert [x[0].shape for x in act.given] == [(2, 2), (3, 2), (2, 2)]
    with pytest.raises(PolicyMismatch, match=r"another obs\[step\] than it stored"):
        act.check(act.network, torch.as_tensor(actions.reshape(-1)))
    act, obs, noise, actions = acting_on()
    for step in range(len(obs)):
        actions[step] = act(obs[step], noise[step])
    act(obs[0], noise[0])  # a call past the rollout's length
    assert act.calls == len(act.given) == len(act.gave) == 4
    with pytest.raises(PolicyMismatch, match=r"called its policy `act` .* 4 times for 6 actions"):
        act.check(act.network, torch.as_tensor(actions.reshape(-1)))

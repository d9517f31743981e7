"""The faster stand-ins of --compile and --cuda-graphs (common.capture), on the CPU: what a CUDA graph
needs of them is checked on a GPU (docs/ppo_fc.md, "On a GPU")."""

import copy
import logging

import torch
import torch.nn as nn

from common.capture import _PROFILER_NOTICE_LOGGER, StandIn, _state_kept


def _step(network: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    optimizer.zero_grad(set_to_none=True)
    network(torch.arange(3.0)[None]).square().sum().backward()
    optimizer.step()


def test_the_warm_up_before_a_capture_leaves_the_network_and_its_optimizer_as_they_were():
    torch.manual_seed(0)
    network = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 1)).eval()
    optimizer = torch.optim.Adam(network.parameters(), lr=0.1, fused=True)
    _step(network, optimizer)  # the optimizer has state
    before = copy.deepcopy((network.state_dict(), optimizer.state_dict()))
    with _state_kept((network, optimizer)):
        _step(network, optimizer)
        _step(network, optimizer)
    after = (network.state_dict(), optimizer.state_dict())
    for was, now in zip(before[0].values(), after[0].values(), strict=True):
        assert torch.equal(was, now)
    for state, state_now in zip(
        before[1]["state"].values(), after[1]["state"].values(), strict=True
    ):
        assert all(torch.equal(state[key], state_now[key]) for key in state)


def test_state_a_warm_up_makes_starts_from_zero_as_a_fresh_optimizer_s():
    torch.manual_seed(0)
    network = nn.Linear(3, 1)
    fresh = copy.deepcopy(network)
    optimizer = torch.optim.Adam(network.parameters(), lr=0.1, fused=True)
    with _state_kept((network, optimizer)):
        _step(network, optimizer)
        _step(network, optimizer)
    _step(network, optimizer)  # its first step, as far as the optimizer can tell
    _step(fresh, torch.optim.Adam(fresh.parameters(), lr=0.1, fused=True))
    for kept, expected in zip(network.parameters(), fresh.parameters(), strict=True):
        torch.testing.assert_close(kept, expected)


def test_a_stand_in_without_its_flags_is_the_function_itself_and_with_compile_a_compiled_one():
    def function(x: torch.Tensor) -> torch.Tensor:
        return x.sin() * 2

    x = torch.linspace(0, 1, 5)
    plain = StandIn(False, False)
    assert torch.equal(plain(function, x), function(x))
    # each call's own function: an edit is never ignored
    assert torch.equal(plain(torch.cos, x), torch.cos(x))
    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters
    counters.clear()
    compiled = StandIn(True, False)
    torch.testing.assert_close(compiled(function, x), function(x))
    torch.testing.assert_close(compiled(function, x + 1), function(x + 1))
    assert counters["stats"]["unique_graphs"] == 1  # compiled once, for both calls


def test_with_compile_dynamo_s_line_about_the_optimizer_s_profiler_range_is_not_shown():
    # A compiled update step printed "Profiler record function ... will be ignored" beside the script's own lines.
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger(_PROFILER_NOTICE_LOGGER)
    logger.addHandler(handler)
    try:
        StandIn(True, False)(torch.sin, torch.zeros(2))
        logger.warning("Profiler record function %s will be ignored", "record_function")
        logger.warning("another warning")
    finally:
        logger.removeHandler(handler)
    assert [record.getMessage() for record in records] == ["another warning"]

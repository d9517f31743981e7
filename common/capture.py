"""Faster stand-ins for a script's action step and minibatch step: `torch.compile` (--compile) and
CUDA graphs (--cuda-graphs), LeanRL's pairing. Each stand-in is made from the script's own function
at its first call and replays it; the script still checks the rollout's actions against the torch
policy after every rollout, whichever acted.

A CUDA graph replays the kernels that one call launched, on the same memory: its inputs are copied
into buffers of the first call's shapes, the parameters and the optimizer's state are read where
they were, and the learning rate comes from a tensor. Code that syncs with the host (`.item()`, a
branch on a tensor's value) cannot be captured: the stand-in then ends the run with an error that
names the flag."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.nn as nn

from common.errors import UsageError

WARMUP_CALLS = 3
"""Calls before a CUDA graph is captured: the first ones compile (--compile), pick cuDNN's kernels
and make the optimizer's state. Their updates are undone."""


def check(cuda_graphs: bool, cuda: bool) -> None:
    """Bad input for --cuda-graphs (UsageError): it needs a CUDA GPU and one process."""
    if not cuda_graphs:
        return
    if not (cuda and torch.cuda.is_available()):
        raise UsageError(
            "--cuda-graphs needs a CUDA GPU (and --cuda): run without it on this machine"
        )
    if int(os.environ.get("WORLD_SIZE", 1)) > 1:
        raise UsageError("--cuda-graphs runs in one process: run without it under torchrun")


class StandIn:
    """One function of a script, compiled (`compile`), replayed as a CUDA graph (`cuda_graph`), or
    both: made from `function` at the first call (`__call__(function, *args)`), then called in its
    place (the `function` of later calls is not looked at: it must compute the same; without either
    flag, each call is `function(*args)`). `keep`: the modules and optimizers the function changes
    (an update), which the warm-up calls before a graph's capture leave as they were. Returns
    tensors of its own (a graph's output buffers are cloned)."""

    def __init__(
        self,
        compile: bool,
        cuda_graph: bool,
        keep: Sequence[nn.Module | torch.optim.Optimizer] = (),
    ):
        self.compile, self.cuda_graph, self.keep = compile, cuda_graph, keep
        self._call: Callable[..., Any] | None = None
        self._learning_rates: list[tuple[dict, torch.Tensor]] = []

    @property
    def enabled(self) -> bool:
        return self.compile or self.cuda_graph

    def __call__(self, function: Callable[..., Any], *args: Any) -> Any:
        if not self.enabled:
            return function(*args)
        if self._call is None:
            self._call = self._make(function, args)
        for group, learning_rate in self._learning_rates:
            learning_rate.fill_(group["lr"])  # the script sets the float; the graph reads this
        return self._call(*args)

    def _make(self, function: Callable[..., Any], args: tuple) -> Callable[..., Any]:
        if self.compile:
            # the optimizer's step is compiled too: its profiler range is dropped, which Dynamo says on stderr
            logging.getLogger(_PROFILER_NOTICE_LOGGER).addFilter(_no_profiler_notice)
            function = torch.compile(function)
        if not self.cuda_graph:
            return function
        for optimizer in self.keep:
            if isinstance(optimizer, torch.optim.Optimizer):
                for group in optimizer.param_groups:
                    learning_rate = torch.tensor(float(group["lr"]), device=_device(args))
                    self._learning_rates.append((group, learning_rate))
        try:
            return _graphed(function, args, self.keep, self._learning_rates)
        except RuntimeError as error:  # torch's errors of capture, and CUDA's
            first_line = str(error).strip().splitlines()[0]
            raise UsageError(
                f"--cuda-graphs: {getattr(function, '__name__', 'a step')} could not be captured as a CUDA graph "
                f"({first_line}): run without --cuda-graphs"
            ) from error


_PROFILER_NOTICE_LOGGER = "torch._dynamo.variables.ctx_manager"


def _no_profiler_notice(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith("Profiler record function")


def _graphed(
    function: Callable[..., Any],
    args: tuple,
    keep: Sequence[nn.Module | torch.optim.Optimizer],
    learning_rates: list[tuple[dict, torch.Tensor]],
) -> Callable[..., Any]:
    inputs = _map(torch.clone, args)
    with _state_kept(keep), _tensor_learning_rates(learning_rates):
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(WARMUP_CALLS):
                function(*inputs)
        torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with _tensor_learning_rates(learning_rates), torch.cuda.graph(graph):
        outputs = function(*inputs)

    def replay(*args: Any) -> Any:
        for buffer, value in zip(_leaves(inputs), _leaves(args), strict=True):
            buffer.copy_(value, non_blocking=True)
        graph.replay()
        return _map(torch.clone, outputs)

    return replay


@contextlib.contextmanager
def _tensor_learning_rates(learning_rates: list[tuple[dict, torch.Tensor]]) -> Iterator[None]:
    """Each optimizer group's learning rate as its tensor, and capturable (the step count stays on
    the GPU), while the step is captured; the group as it was after (the graph replays what was
    captured; a checkpoint keeps the float, and resumes on a CPU)."""
    before = [(group["lr"], group.get("capturable", False)) for group, _ in learning_rates]
    for group, learning_rate in learning_rates:
        group["lr"], group["capturable"] = learning_rate, True
    try:
        yield
    finally:
        for (group, _), (value, capturable) in zip(learning_rates, before, strict=True):
            group["lr"], group["capturable"] = value, capturable


@contextlib.contextmanager
def _state_kept(keep: Sequence[nn.Module | torch.optim.Optimizer]) -> Iterator[None]:
    """Put back, in place, the parameters, buffers and optimizer state of `keep` (state made inside
    the block starts from zero, as a fresh optimizer's)."""
    tensors = {}
    for thing in keep:
        if isinstance(thing, nn.Module):
            tensors.update({id(t): (t, t.detach().clone()) for t in thing.state_dict().values()})
    before = {
        id(t): t.clone() for thing in keep for t in _optimizer_state(thing)
    }  # fmt: skip
    try:
        yield
    finally:
        with torch.no_grad():
            for tensor, value in tensors.values():
                tensor.copy_(value)
            for thing in keep:
                for tensor in _optimizer_state(thing):
                    tensor.copy_(before[id(tensor)]) if id(tensor) in before else tensor.zero_()


def _optimizer_state(thing: Any) -> list[torch.Tensor]:
    if not isinstance(thing, torch.optim.Optimizer):
        return []
    return [t for state in thing.state.values() for t in state.values() if torch.is_tensor(t)]


def _leaves(value: Any) -> list[torch.Tensor]:
    if isinstance(value, dict):
        return [leaf for part in value.values() for leaf in _leaves(part)]
    if isinstance(value, (tuple, list)):
        return [leaf for part in value for leaf in _leaves(part)]
    return [value] if torch.is_tensor(value) else []


def _map(function: Callable[[torch.Tensor], torch.Tensor], value: Any) -> Any:
    """`function` of each tensor in `value` (tensors, and dicts, tuples and lists of them)."""
    if isinstance(value, dict):
        return type(value)({key: _map(function, part) for key, part in value.items()})
    if isinstance(value, (tuple, list)):
        return type(value)(_map(function, part) for part in value)
    return function(value) if torch.is_tensor(value) else value


def _device(args: tuple) -> torch.device:
    return _leaves(args)[0].device

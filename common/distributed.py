"""Data parallelism under torchrun: the process group, this process's rank, and the reductions the
PPO scripts call.

Started with plain `python` (no `WORLD_SIZE`, or 1) every function here is the single-process
identity and no process group exists. Under `torchrun`, `setup` joins the group; `RANK` is the
global rank (several machines), `LOCAL_RANK` picks the GPU. Rank 0 alone writes the run's folder,
logs and checkpoints (see docs/distributed.md).

Each collective here is called by every rank, in the same order: whatever decides whether to call
one must be the same on every rank (the parameters, after averaged gradients, are)."""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import sys
import time
from collections.abc import Iterable, Iterator
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from common.errors import UsageError

TIMEOUT = timedelta(minutes=10)
"""How long a collective waits for the other ranks before failing (a rank stuck in a long checkpoint
write or eval must not be cut off; a dead rank is noticed at once, by its closed connection)."""

collective_seconds = 0.0
"""Seconds this process spent in collectives since the last `take_collective_seconds` (logged as
`perf/collective_seconds`)."""


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def rank() -> int:
    """The global rank (0 to world size - 1, over all machines)."""
    return dist.get_rank() if dist.is_initialized() else 0


def is_main() -> bool:
    """Whether this process writes the run's files (rank 0, or the only process)."""
    return rank() == 0


def local_rank() -> int:
    """This process's index on its machine: it picks the GPU."""
    return int(os.environ.get("LOCAL_RANK", 0)) if dist.is_initialized() else 0


def launched_size() -> int:
    """The number of processes torchrun started (`WORLD_SIZE`; 1 without torchrun)."""
    try:
        return int(os.environ.get("WORLD_SIZE", 1))
    except ValueError:
        raise UsageError(
            f"WORLD_SIZE must be an integer, got {os.environ['WORLD_SIZE']!r}"
        ) from None


def setup(backend: str | None, cuda: bool) -> None:
    """Join torchrun's process group when it started more than one process: `backend`, or nccl when
    this process trains on a GPU and gloo otherwise. Does nothing for a single process, or if the
    group exists already."""
    if launched_size() <= 1 or dist.is_initialized():
        return
    missing = [
        name
        for name in ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
        if name not in os.environ
    ]
    if missing:
        raise UsageError(
            f"WORLD_SIZE is set but {', '.join(missing)} not: start the script with torchrun"
        )
    on_gpu = cuda and torch.cuda.is_available()
    backend = backend or ("nccl" if on_gpu else "gloo")
    if backend not in dist.Backend.backend_list:
        raise UsageError(
            f"--dist-backend {backend!r}: this torch knows {', '.join(dist.Backend.backend_list)}"
        )
    if backend == "nccl" and not on_gpu:
        raise UsageError(
            "--dist-backend nccl needs a GPU for each process (--cuda, and a GPU torch can see)"
        )
    if on_gpu:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    device_id = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else None
    # torchrun's restarts (--max-restarts) reuse its store: each attempt's keys apart, else a
    # restarted rank can read the address a killed one published and fail to connect to it
    store, rank, size = next(dist.rendezvous("env://", timeout=TIMEOUT))
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    store = dist.PrefixStore(f"onefile_rl_attempt_{attempt}/", store)
    dist.init_process_group(
        backend, store=store, rank=rank, world_size=size, timeout=TIMEOUT, device_id=device_id
    )


def leave(status: int) -> None:
    """At the end of a run that every rank ended alike (done, or stopped by Ctrl-C): wait for every
    rank, leave the group, and end the process with `status`, its exit handlers run but not the C++
    teardown after them. A two-rank gloo run left without destroying its group aborted at exit in 17
    of 40 runs here, and the scripts' runs still in 2 of 148 after destroying it; everything is
    written by then."""
    if not dist.is_initialized():
        return
    dist.barrier()
    dist.destroy_process_group()
    atexit._run_exitfuncs()  # what sys.exit would run (TensorBoard's writer, wandb)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def rank_seed(seed: int) -> int:
    """The seed of this rank's generators: `seed` itself on rank 0 (and for one process), and on
    rank r a seed drawn from (seed, r), so that rank 1 of --seed 1 does not repeat rank 0 of --seed
    2."""
    if rank() == 0:
        return seed
    return int(np.random.SeedSequence([seed, rank()]).generate_state(1)[0])


def single_process(what: str) -> None:
    """Refuse `what` (a script or a mode without data parallelism) under torchrun with more than one
    process."""
    if launched_size() > 1:
        raise UsageError(
            f"{what} runs in one process: start it with python, or torchrun --nproc-per-node 1"
        )


@contextlib.contextmanager
def _timed() -> Iterator[None]:
    """Adds the block's seconds to `collective_seconds`."""
    global collective_seconds
    start = time.perf_counter()
    yield
    collective_seconds += time.perf_counter() - start


def _timed_all_reduce(tensor: Tensor, op: dist.ReduceOp = dist.ReduceOp.SUM) -> Tensor:
    """`tensor` all-reduced in place (a CPU tensor goes through this rank's GPU under nccl, which
    takes no other)."""
    with _timed():
        on_backend = (
            tensor.cuda() if dist.get_backend() == "nccl" and not tensor.is_cuda else tensor
        )
        dist.all_reduce(on_backend, op=op)
        if on_backend is not tensor:
            tensor.copy_(on_backend)
    return tensor


def take_collective_seconds() -> float:
    """The seconds spent in collectives since the last call (0 for a single process)."""
    global collective_seconds
    seconds, collective_seconds = collective_seconds, 0.0
    return seconds


def average_gradients(parameters: Iterable[Tensor]) -> None:
    """Replace each gradient by its mean over the ranks, in one all-reduce of a flat buffer: each
    rank's loss is a mean over its share of the minibatch, so this is the gradient of the global
    minibatch's loss."""
    if world_size() == 1:
        return
    parameters = list(parameters)
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in parameters]
    flat = _timed_all_reduce(torch.cat([grad.reshape(-1) for grad in grads])).div_(world_size())
    for parameter, grad, averaged in zip(
        parameters, grads, flat.split([g.numel() for g in grads]), strict=True
    ):
        parameter.grad = averaged.view_as(grad)


def mean(values: Tensor) -> Tensor:
    """`values` averaged over the ranks (elementwise); each rank's values are means over equal
    shares."""
    if world_size() == 1:
        return values
    return _timed_all_reduce(values.detach().clone()).div_(world_size())


def max_over_ranks(*values: float) -> list[float]:
    """The largest of each of `values` over the ranks: decisions every rank then takes together
    (one all-reduce)."""
    if world_size() == 1:
        return list(values)
    return _timed_all_reduce(torch.tensor(values, dtype=torch.float64), dist.ReduceOp.MAX).tolist()


def _sums(x: Tensor, dim: int) -> tuple[Tensor, Tensor, Tensor]:
    """The count, sum and sum of squares of `x` along `dim`, in float64, over all ranks' `x` (one
    all-reduce)."""
    x = x.detach().to(torch.float64)
    counts = torch.full_like(x.sum(dim), x.shape[dim])
    count, total, squares = _timed_all_reduce(
        torch.stack([counts, x.sum(dim), x.square().sum(dim)])
    )
    return count, total, squares


def mean_std(x: Tensor) -> tuple[Tensor, Tensor]:
    """For each `x[i]` (one minibatch's values), the mean and (unbiased) std of its elements over
    all ranks' `x[i]` together: `x[i].mean()` and `x[i].std()` of the global minibatch, for every i
    in one all-reduce."""
    rows = x.detach().flatten(1)
    if world_size() == 1:
        return rows.mean(1), rows.std(1)
    count, total, squares = _sums(rows, dim=1)
    average = total / count
    variance = ((squares - count * average**2) / (count - 1).clamp(min=1)).clamp(min=0.0)
    return average.to(x.dtype), variance.sqrt().to(x.dtype)


def moments(batch: Tensor) -> tuple[Tensor, Tensor, int]:
    """Per column of `batch` (rows are samples), over all ranks' rows: the mean, the variance
    (biased) and the count."""
    batch = batch.reshape(-1, batch.shape[-1]).to(torch.float64)
    if world_size() == 1:
        return batch.mean(0), batch.var(0, unbiased=False), batch.shape[0]
    count, total, squares = _sums(batch, dim=0)
    average = total / count
    return average, (squares / count - average**2).clamp(min=0.0), int(count[0].item())


class CombinedReturnStats:
    """Keeps the running return statistics of gymnasium's NormalizeReward (None: none) the same on
    every rank. Each rank's rollout adds its own envs' returns; calling this after the rollout adds
    up what every rank added since the last call (counts, sums and sums of squares add exactly), so
    all ranks go on from the statistics of all envs. Within a rollout a rank scales by its own
    statistics (a step-by-step exchange would cost a collective per env step)."""

    def __init__(self, normalizer: Any):
        self.rms = normalizer.return_rms if normalizer is not None and world_size() > 1 else None
        self.start = self._sums() if self.rms is not None else None

    def _sums(self) -> np.ndarray:
        count, mean, var = (
            float(self.rms.count),
            np.asarray(self.rms.mean, np.float64),
            np.asarray(self.rms.var),
        )
        return np.stack([np.full_like(mean, count), count * mean, count * (var + mean**2)])

    def __call__(self) -> None:
        if self.rms is None:
            return
        added = torch.from_numpy(self._sums() - self.start)
        total = self.start + _timed_all_reduce(added).numpy()
        count = float(total[0].flat[0])
        mean = total[1] / count
        self.rms.count, self.rms.mean, self.rms.var = (
            count,
            mean,
            np.maximum(total[2] / count - mean**2, 0.0),
        )
        self.start = self._sums()


def broadcast_module(module: torch.nn.Module) -> None:
    """Rank 0's parameters and buffers, copied into every rank's `module`."""
    if world_size() == 1:
        return
    for tensor in [*module.parameters(), *module.buffers()]:
        dist.broadcast(tensor.data, src=0)


def broadcast_object(value: Any) -> Any:
    """Rank 0's `value` on every rank (a path, a name: small values, pickled between this run's
    processes only)."""
    if world_size() == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather_to_main(value: Any) -> list[Any] | None:
    """Every rank's `value`, in rank order, on rank 0 (None elsewhere; pickled between this run's
    processes only)."""
    if world_size() == 1:
        return [value]
    values: list[Any] | None = [None] * world_size() if is_main() else None
    dist.gather_object(value, values, dst=0)
    return values


def gather(value: Any) -> list[Any]:
    """Every rank's `value`, in rank order, on every rank (pickled between this run's processes
    only)."""
    if world_size() == 1:
        return [value]
    values: list[Any] = [None] * world_size()
    with _timed():
        dist.all_gather_object(values, value)
    return values


def collective_failed(exc: BaseException) -> bool:
    """Whether `exc` is a collective that failed: another rank is gone (its connection closed) or
    timed out."""
    return dist.is_initialized() and (
        isinstance(exc, dist.DistError)
        or (isinstance(exc, RuntimeError) and bool(re.search(r"gloo|NCCL", str(exc))))
    )

"""Seeding, and the states of the random-number generators that a checkpoint carries for an exact
resume."""

from __future__ import annotations

import os
import random

import numpy as np
import torch
from threadpoolctl import threadpool_limits

from common import distributed

ONEDNN_CACHE_CAPACITY = 64
"""kernels oneDNN keeps: a few shapes' kernels in each network, and a bound on a recurrent update's
"""


def seed_and_pick_device(
    seed: int, torch_deterministic: bool, torch_threads: int | None, cuda: bool
) -> torch.device:
    """Seed python, NumPy and torch, set the CPU threads of torch and of NumPy's BLAS (0 keeps their
    defaults; None leaves them to `threads_for`, once the network is built), and return the device:
    a GPU when `cuda` and one is available (under torchrun, the local rank's), else the CPU.

    NumPy's BLAS counts too: the rollouts' NumPy stand-ins multiply a few rows at a time, and
    OpenBLAS's own threads made an 8-row product 12 times slower (790 against 64 µs) when the cores
    were shared with other runs.

    It also bounds oneDNN's cache of CPU kernels (`ONEDNN_PRIMITIVE_CACHE_CAPACITY`, where neither
    it nor `DNNL_PRIMITIVE_CACHE_CAPACITY` is set; read when the process makes its first kernel, so
    it counts in a fresh process). Each shape gets kernels of its own, and ppo_lstm's update calls
    its cell on a new shape whenever the episode starts in a minibatch move: with the default of
    1,024 a Breakout run grew by 1.1 GB in 100k steps (docs/ppo_lstm.md, "Memory")."""
    if not {"ONEDNN_PRIMITIVE_CACHE_CAPACITY", "DNNL_PRIMITIVE_CACHE_CAPACITY"} & os.environ.keys():
        os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = str(ONEDNN_CACHE_CAPACITY)
    seed_generators(seed)
    torch.backends.cudnn.deterministic = torch_deterministic
    # float32, not TF32, in cuDNN's convolutions: the rollout's actions (a few frames a call) are
    # checked against one pass over all of them, and TF32's rounding (1e-3 in a log-probability)
    # fails that check once a policy sharpens.
    torch.backends.cudnn.allow_tf32 = False
    if torch_threads:
        _set_threads(torch_threads)
    return (
        torch.device("cuda", distributed.local_rank())
        if torch.cuda.is_available() and cuda
        else torch.device("cpu")
    )


LARGE_LAYER = 256
"""the width from which a linear layer counts as large for `threads_for`"""


def threads_for(torch_threads: int | None, *networks: torch.nn.Module) -> None:
    """The default of --torch-threads (None), chosen by the network: every core (OMP_NUM_THREADS,
    where set, as the harness sets it for its parallel jobs) for networks with a convolution or a
    linear layer of LARGE_LAYER units or more, whose products two threads made 1.3-1.6 times faster;
    one thread for the others, whose small products gain little or lose (docs/benchmark.md,
    "Threads"). A number given is kept."""
    if torch_threads is not None:
        return
    modules = [module for network in networks for module in network.modules()]
    large = any(
        isinstance(module, torch.nn.Conv2d)
        or (
            isinstance(module, torch.nn.Linear)
            and max(module.in_features, module.out_features) >= LARGE_LAYER
        )
        for module in modules
    )
    _set_threads(int(os.environ.get("OMP_NUM_THREADS") or available_cores()) if large else 1)


def available_cores() -> int:
    """The cores this process may run on (all of the machine's where the OS cannot say)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _set_threads(threads: int) -> None:
    torch.set_num_threads(threads)
    threadpool_limits(threads, user_api="blas")


def seed_generators(seed: int) -> None:
    """Seed python's, NumPy's and torch's global generators."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def rng_state() -> dict:
    """The states of python's, NumPy's and torch's global generators (CPU, and every CUDA device
    once CUDA is in use), as tensors and plain values that load with `weights_only=True`."""
    numpy_state = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "key": torch.from_numpy(numpy_state[1].astype(np.int64)),
            "rest": list(numpy_state[2:]),
        },
        "python": torch.tensor(random.getstate()[1]),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        # Training on a GPU draws its sampling noise and minibatch permutations there.
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict) -> None:
    """Put back the generator states of `rng_state`; the CUDA ones on as many devices as there are
    here."""
    torch.set_rng_state(state["torch"])
    np.random.set_state(
        ("MT19937", state["numpy"]["key"].numpy().astype(np.uint32), *state["numpy"]["rest"])
    )
    random.setstate((3, tuple(state["python"].tolist()), None))
    if "cuda" in state and torch.cuda.is_available():
        for device, device_state in enumerate(state["cuda"][: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(device_state, device)

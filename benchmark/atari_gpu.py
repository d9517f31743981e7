"""The Atari checks that need a GPU, in one run on a machine with CUDA (docs/ppo_fc.md, "On a GPU"):
``python -m benchmark.atari_gpu --cleanrl DIR [--steps N] [--repeats R] [--out DIR]``.

1. SPS on BreakoutNoFrameskip-v4 with CleanRL's Atari settings: ppo_fc.py and ppo_lstm.py with ``--cuda`` beside
   CleanRL's ppo_atari.py and ppo_atari_lstm.py with ``--cuda``, the runs alternating, each a process of its own, with
   our scripts' median rollout and update seconds per iteration; then ours once with ``--async-envs``.
2. ppo_transformer.py with ppo_atari_lstm's settings: its SPS.
3. A checkpoint each script wrote on the GPU, evaluated in a process that sees no GPU.
4. ppo_fc's update on one minibatch (forward, loss, backward, gradient clipping, Adam) and its rollout's action step
   (8 frames from NumPy to actions on the host): eager with float32 convolutions (as the scripts run them), eager with
   TF32 convolutions (PyTorch's default, which CleanRL keeps), ``torch.compile``, a CUDA graph (captured as LeanRL's
   CudaGraphModule does, with a capturable fused or foreach Adam), and the compiled step in a CUDA graph; each variant
   in a process of its own (``--variant``), the action step first.

5. EnvPool (``--sections envpool``): ppo_fc.py with ``--env-backend envpool --cuda``, eager, with ``--cuda-graphs``
   and with ``--compile --cuda-graphs``, beside LeanRL's ppo_atari_envpool.py (CleanRL's PPO on EnvPool) and
   ppo_atari_envpool_torchcompile.py with ``--compile --cudagraphs`` from ``--leanrl DIR``, the runs alternating;
   LeanRL's SPS is the median of the speeds its progress bar shows (every 10 iterations, after 3 of burn-in), the
   first left out.
   Then a check of the CUDA graphs: the same seed eager and with ``--cuda-graphs``, their games' returns and their
   checkpoints' weights set side by side, and the graph run's checkpoint evaluated in a process that sees no GPU.

Each section's results are printed as it ends and appended to OUT/atari_gpu.jsonl, so a run stopped early keeps what
it measured. CleanRL runs under ``--cleanrl-python`` with ``--cleanrl-pythonpath`` first on its path (gymnasium 0.29,
ale-py 0.9.1 and stable-baselines3 2.3.2, as CleanRL pins them)."""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

from benchmark.atari_speed import ENV_ID, OURS, cleanrl_sps, median_after_first, script_sessions
from benchmark.cnn_floor import rollout_floor_seconds
from benchmark.events import load_sessions, merged_scalars, steps_per_second
from benchmark.recurrent_floor import floor_agent, median_seconds
from benchmark.registry import REPO

ENVPOOL_VARIANTS = {
    "eager": (),
    "cuda_graphs": ("--cuda-graphs",),
    "compile_cuda_graphs": ("--compile", "--cuda-graphs"),
}
LEANRL = {
    "leanrl_eager": ("ppo_atari_envpool.py",),
    "leanrl_compile_cudagraphs": ("ppo_atari_envpool_torchcompile.py", "--compile", "--cudagraphs"),
}
TRANSFORMER = ("ppo_transformer.py", *OURS["ppo_lstm"][1:], "--norm-adv", "--target-kl", "None")
QUIET = ("--no-progress", "--eval-episodes", "0")


def report(out: Path, section: str, **results: object) -> None:
    """Print one section's results and append them to OUT/atari_gpu.jsonl."""
    line = json.dumps({"section": section, **results})
    print(line, flush=True)
    with open(out / "atari_gpu.jsonl", "a") as file:
        file.write(line + "\n")


def our_run(command: tuple[str, ...], steps: int, *flags: str) -> dict[str, float]:
    """SPS of one run of our script `command` (its file and flags) on the GPU, and its median
    rollout and update seconds per iteration (the first iteration left out)."""
    script, *settings = command
    sessions = script_sessions(
        script, ["--env-id", ENV_ID, "--total-timesteps", str(steps), *settings, "--cuda", *flags]
    )
    return {
        "sps": steps_per_second(sessions),
        "rollout_s": median_after_first(sessions, "perf/rollout_seconds"),
        "update_s": median_after_first(sessions, "perf/update_seconds"),
    }


def speed(options: argparse.Namespace) -> None:
    """Section 1: ours against CleanRL's, alternating, then ours with --async-envs."""
    for script in ("ppo_fc", "ppo_lstm"):
        ours, cleanrl = [], []
        for _ in range(options.repeats):
            ours.append(our_run(OURS[script], options.steps))
            if options.cleanrl:
                python, path = options.cleanrl_python, options.cleanrl_pythonpath
                cleanrl.append(
                    cleanrl_sps(options.cleanrl, script, options.steps, python, path, cuda=True)
                )
        ratio = (
            statistics.median(run["sps"] for run in ours) / statistics.median(cleanrl)
            if cleanrl
            else None
        )
        report(options.out, "speed", script=script, ours=ours, cleanrl=cleanrl, ratio=ratio)
    for script in ("ppo_fc", "ppo_lstm"):
        report(
            options.out,
            "async",
            script=script,
            ours=our_run(OURS[script], options.steps, "--async-envs"),
        )


def transformer(options: argparse.Namespace) -> None:
    """Section 2: ppo_transformer.py's SPS with ppo_atari_lstm's settings."""
    report(options.out, "transformer", ours=our_run(TRANSFORMER, options.steps))


def checkpoints_on_cpu(options: argparse.Namespace) -> None:
    """Section 3: each script trains two iterations on the GPU and saves; a process that sees no GPU
    evaluates it."""
    for command in (OURS["ppo_fc"], OURS["ppo_lstm"], TRANSFORMER):
        script, *settings = command
        with tempfile.TemporaryDirectory() as run_dir:
            subprocess.run(
                [sys.executable, script, "--env-id", ENV_ID, "--total-timesteps", "2048", *settings, "--cuda",
                 "--run-dir", run_dir, *QUIET],
                cwd=REPO, check=True, capture_output=True,
            )  # fmt: skip
            (checkpoint,) = Path(run_dir).glob("*/checkpoints/latest.pt")
            no_gpu = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
            evaluated = subprocess.run(
                [sys.executable, script, "--eval-checkpoint", str(checkpoint), "--eval-episodes", "1", "--no-progress"],
                cwd=REPO, capture_output=True, text=True, env=no_gpu,
            )  # fmt: skip
            lines = (evaluated.stdout + evaluated.stderr).splitlines()
            said = [line for line in lines if "return" in line or "error" in line]
            report(
                options.out,
                "checkpoint_on_cpu",
                script=script,
                status=evaluated.returncode,
                output=said,
            )


def leanrl_sps(options: argparse.Namespace, command: tuple[str, ...]) -> float:
    """SPS of one run of LeanRL's script `command` (its file and flags) on the GPU: the median of the
    speeds its progress bar shows, the first left out."""
    script, *flags = command
    done = subprocess.run(
        [options.leanrl_python, str(options.leanrl / script), "--env-id", "Breakout-v5",
         "--total-timesteps", str(options.steps), "--num-envs", "8", "--cuda", *flags],
        cwd=options.leanrl, check=True, capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": options.leanrl_pythonpath, "WANDB_MODE": "disabled"},
    )  # fmt: skip
    speeds = [float(value) for value in re.findall(r"speed:\s*([0-9.]+) sps", done.stderr)]
    # the bar shows each speed until the next: keep each value once
    speeds = [value for i, value in enumerate(speeds) if i == 0 or value != speeds[i - 1]]
    return statistics.median(speeds[1:] or speeds)


def envpool_speed(options: argparse.Namespace) -> None:
    """Section 5: ppo_fc on EnvPool, eager and captured, beside LeanRL's scripts; then the check of
    the CUDA graphs."""
    envpool = ("--env-backend", "envpool")
    runs = {
        name: partial(our_run, OURS["ppo_fc"], options.steps, *envpool, *flags)
        for name, flags in ENVPOOL_VARIANTS.items()
    }
    if options.leanrl:
        runs.update(
            {
                name: lambda command=command: {"sps": leanrl_sps(options, command)}
                for name, command in LEANRL.items()
            }
        )
    runs = {name: runs[name] for name in options.envpool_runs or runs if name in runs}
    for _ in range(options.repeats):
        for name, measure in runs.items():
            try:  # a run that fails is reported, and the others run
                report(options.out, "envpool", run=name, **measure())
            except Exception as error:
                stderr = str(getattr(error, "stderr", ""))[-1500:]
                report(options.out, "envpool", run=name, error=str(error)[:300], stderr=stderr)
    runs = {}
    for name, flags in (("eager", ()), ("cuda_graphs", ("--cuda-graphs",))):
        run_dir = Path(tempfile.mkdtemp())
        subprocess.run(
            [sys.executable, "ppo_fc.py", "--env-id", ENV_ID, "--total-timesteps", "8192", *OURS["ppo_fc"][1:],
             *envpool, "--cuda", "--run-dir", str(run_dir), *QUIET, *flags],
            cwd=REPO, check=True, capture_output=True,
        )  # fmt: skip
        (checkpoint,) = run_dir.glob("*/checkpoints/latest.pt")
        returns = [
            event.value
            for event in merged_scalars(load_sessions(checkpoint.parents[1]))[
                "charts/episodic_return"
            ]
        ]
        runs[name] = (checkpoint, returns, torch.load(checkpoint, weights_only=True)["model"])
    (_, eager_returns, eager_model), (graph_checkpoint, graph_returns, graph_model) = runs.values()
    no_gpu = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    evaluated = subprocess.run(
        [sys.executable, "ppo_fc.py", "--eval-checkpoint", str(graph_checkpoint), "--eval-episodes", "1",
         "--no-progress"],
        cwd=REPO, capture_output=True, text=True, env=no_gpu,
    )  # fmt: skip
    report(
        options.out, "cuda_graphs_check",
        same_returns=eager_returns == graph_returns, games=len(eager_returns),
        largest_weight_difference=max(
            (eager_model[key].float() - graph_model[key].float()).abs().max().item() for key in eager_model
        ),
        evaluated_on_cpu=evaluated.returncode,
        evaluation=[
            line for line in (evaluated.stdout + evaluated.stderr).splitlines() if "return" in line or "error" in line
        ],
    )  # fmt: skip


def envpool_floor(options: argparse.Namespace) -> None:
    """Section 6: what ppo_fc's EnvPool rollout cannot go below on this machine: EnvPool's games
    alone on random actions, and with the agent's forward on the GPU for each step
    (`benchmark.cnn_floor`), seconds per iteration of 1,024 steps."""
    flags = ["--env-id", ENV_ID, *OURS["ppo_fc"][1:], "--env-backend", "envpool"]
    games = rollout_floor_seconds("ppo_fc", flags, agent_acts=False)
    with_agent = rollout_floor_seconds("ppo_fc", flags, device="cuda")
    report(options.out, "envpool_floor", games_s=games, games_and_agent_s=with_agent)


def seconds_per_call(step: Callable[[], object], device: torch.device) -> float:
    """The median seconds of 50 calls of `step`, after 10 warm-up calls, the GPU synchronised around
    each."""
    synchronize = (
        (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    )
    return median_seconds(step, 50, warmup=10, synchronize=synchronize)


def in_cuda_graph(
    step: Callable[[], object], device: torch.device
) -> tuple[Callable[[], None], object]:
    """`step` captured once in a CUDA graph, after warm-up calls on a side stream (as torch's docs
    and LeanRL's CudaGraphModule do): the graph's replay, and the output of the captured call, which
    each replay overwrites. The inputs of `step` must stay at fixed addresses, and its optimizer be
    capturable."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        output = step()
    return graph.replay, output


UPDATE_VARIANTS = (
    "eager, float32 convolutions (the scripts)",
    "eager, TF32 convolutions (CleanRL)",
    "torch.compile",
    "CUDA graph, fused Adam",
    "CUDA graph, foreach Adam",
    "torch.compile in a CUDA graph",
)


def update_and_act(options: argparse.Namespace) -> None:
    """Section 4: each variant in a process of its own, since a CUDA error spoils the rest of a
    process."""
    for variant in UPDATE_VARIANTS:
        command = [
            sys.executable,
            "-m",
            "benchmark.atari_gpu",
            "--sections",
            "update",
            "--variant",
            variant,
        ]
        done = subprocess.run(
            [*command, "--device", options.device, "--out", str(options.out)],
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        if done.returncode:
            report(options.out, "update_and_act", variant=variant, error=done.stderr[-1500:])


def time_variant(options: argparse.Namespace) -> None:
    """One variant of section 4: ppo_fc's rollout action step, then its update on one minibatch."""
    device, variant = torch.device(options.device), options.variant
    _, args, agent = floor_agent("ppo_fc", [*OURS["ppo_fc"][1:], "--env-id", ENV_ID])
    agent.to(device)
    # as the scripts and CleanRL's set it
    torch.backends.cudnn.deterministic = args.torch_deterministic
    torch.backends.cudnn.allow_tf32 = "TF32" in variant
    minibatch = args.num_envs * args.num_steps // args.num_minibatches
    frames = torch.randint(0, 256, (minibatch, 4, 84, 84), dtype=torch.uint8, device=device)
    actions = torch.randint(0, agent.action_size, (minibatch,), device=device)
    host_frames = np.random.default_rng(0).integers(
        0, 256, (args.num_envs, 4, 84, 84), dtype=np.uint8
    )
    host_noise = (
        np.random.default_rng(1).gumbel(size=(args.num_envs, agent.action_size)).astype(np.float32)
    )
    compiled = variant.startswith("torch.compile")
    graphed = "CUDA graph" in variant

    @torch.no_grad()
    def policy_action(obs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        return agent.sample(agent.distribution(agent(obs)[0]), noise)

    policy = torch.compile(policy_action) if compiled else policy_action
    on_device = lambda array: torch.as_tensor(array, device=device)  # noqa: E731
    if graphed:
        static_frames, static_noise = on_device(host_frames), on_device(host_noise)
        replay, actions_out = in_cuda_graph(lambda: policy(static_frames, static_noise), device)

        def act() -> np.ndarray:
            static_frames.copy_(torch.from_numpy(host_frames))
            static_noise.copy_(torch.from_numpy(host_noise))
            replay()
            return actions_out.cpu().numpy()
    else:

        def act() -> np.ndarray:
            return policy(on_device(host_frames), on_device(host_noise)).cpu().numpy()

    start = time.perf_counter()
    report(
        options.out, "update_and_act", variant=variant, act_ms=seconds_per_call(act, device) * 1e3
    )
    optimizer = torch.optim.Adam(
        agent.parameters(),
        lr=args.learning_rate,
        eps=1e-5,
        fused="foreach" not in variant,
        capturable=graphed,
    )

    def update() -> None:
        """One minibatch's update as ppo_fc.py makes it, with a simpler loss of the same outputs."""
        _, logprob, entropy, value = agent.get_action_and_value(frames, actions)
        loss = (
            -logprob.mean() - args.ent_coef * entropy.mean() + args.vf_coef * value.square().mean()
        )
        # a CUDA graph keeps its gradients at fixed addresses
        optimizer.zero_grad(set_to_none=not graphed)
        loss.backward()
        nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm, foreach=True)
        optimizer.step()

    step = torch.compile(update) if compiled else update
    step = in_cuda_graph(step, device)[0] if graphed else step
    update_ms = seconds_per_call(step, device) * 1e3
    report(options.out, "update_and_act", variant=variant, update_ms=update_ms, minibatch=minibatch,
           seconds_to_build_and_time=time.perf_counter() - start)  # fmt: skip


SECTIONS = {
    "speed": speed,
    "transformer": transformer,
    "checkpoints": checkpoints_on_cpu,
    "update": update_and_act,
    "envpool": envpool_speed,
    "envpool_floor": envpool_floor,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=16384)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--cleanrl", type=Path, default=None, help="a folder with run.py and CleanRL's two scripts"
    )
    parser.add_argument("--cleanrl-python", default=sys.executable)
    parser.add_argument(
        "--leanrl", type=Path, default=None, help="a folder with LeanRL's two scripts"
    )
    parser.add_argument("--leanrl-python", default=sys.executable)
    parser.add_argument("--leanrl-pythonpath", default="")
    parser.add_argument(
        "--envpool-runs", nargs="+", choices=[*ENVPOOL_VARIANTS, *LEANRL], help="section 5's runs"
    )
    parser.add_argument("--cleanrl-pythonpath", default="")
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument(
        "--device", default="cuda", help="section 4's device (cpu only to try this file out)"
    )
    parser.add_argument("--sections", nargs="+", default=list(SECTIONS), choices=list(SECTIONS))
    parser.add_argument(
        "--variant", choices=UPDATE_VARIANTS, help="time this variant of section 4 in this process"
    )
    options = parser.parse_args()
    options.out.mkdir(parents=True, exist_ok=True)
    if options.variant:
        return time_variant(options)
    # its runs start in folders of their own
    options.cleanrl = options.cleanrl and options.cleanrl.resolve()
    options.leanrl = options.leanrl and options.leanrl.resolve()
    print(
        f"torch {torch.__version__}, {torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU'}"
    )
    for section in options.sections:
        start = time.perf_counter()
        try:
            SECTIONS[section](options)
        except Exception as error:  # a failed section is reported, and the next one runs
            detail = getattr(error, "stderr", b"") or b""
            tail = (
                detail.decode(errors="replace")[-1500:]
                if isinstance(detail, bytes)
                else str(detail)[-1500:]
            )
            report(
                options.out, section, error=f"{type(error).__name__}: {error}"[:500], stderr=tail
            )
        print(f"[{section}: {time.perf_counter() - start:.0f} s]", flush=True)


if __name__ == "__main__":
    main()

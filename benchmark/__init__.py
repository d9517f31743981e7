"""Benchmarks of the single-file scripts: learning results, speed, and baselines to compare them with.

Run them from the repository root, e.g. ``python -m benchmark.ppo_fc_bench``; results go to ``benchmark/results/``.
"""

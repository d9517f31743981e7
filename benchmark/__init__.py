"""The benchmark harness: learning curves, a results table and a speed comparison for every script.

``python -m benchmark run --suite full --baselines`` runs the standard cases of benchmark/cases.py;
``python -m benchmark plot RUN_DIR ...`` draws the same figures for any runs. Results go to
``benchmark/results/``."""

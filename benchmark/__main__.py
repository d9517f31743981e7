"""The command line of the benchmark harness: ``python -m benchmark run|report|plot|tune|tune-report ...``,
each subcommand's flags parsed by tyro and handed to its function."""

from __future__ import annotations

import sys

import tyro

from benchmark.jobs import Run
from benchmark.report import Plot, plot
from benchmark.run_report import run
from benchmark.slurm import Report, report
from benchmark.tune import Tune, TuneReport, tune, tune_report


def main() -> int:
    commands = {
        "run": (Run, run),
        "report": (Report, report),
        "plot": (Plot, plot),
        "tune": (Tune, tune),
        "tune-report": (TuneReport, tune_report),
    }
    command = tyro.extras.subcommand_cli_from_dict(
        {name: kind for name, (kind, _) in commands.items()}
    )
    function = next(function for kind, function in commands.values() if isinstance(command, kind))
    try:
        return function(command)
    except (
        KeyboardInterrupt
    ) as exc:  # a stop signal (`benchmark.processes.passing_stop_signals_on`)
        return getattr(exc, "exit_status", 130)


if __name__ == "__main__":
    sys.exit(main())

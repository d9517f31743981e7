"""Child processes of the harness: the end of what a failed one printed, and runs that can be
stopped whole."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from common.interrupt import STOP_SIGNALS, Interrupted, stop_signals_raise

STDERR_TAIL_LINES = 12
STOP_GRACE_SECONDS = 10.0
"""seconds a stopped run has to end after SIGTERM, before its process group is killed"""


def stderr_tail(stderr: str) -> str:
    """The last `STDERR_TAIL_LINES` lines of what a process wrote to stderr."""
    return "\n".join(stderr.strip().splitlines()[-STDERR_TAIL_LINES:]) or "(no stderr)"


PR_SET_PDEATHSIG = 1
_prctl = ctypes.CDLL(None).prctl if sys.platform == "linux" else None
"""looked up here, in the parent: a child forked from a threaded process must not load libraries
before exec"""


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the thread that started it ends (a killed harness
    leaves no run)."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def start_stoppable(
    command: list[str], cwd: Path, log_stem: Path, environment: dict[str, str]
) -> subprocess.Popen:
    """Start `command` in a process group of its own, its output to `log_stem`.stdout and .stderr: a
    terminal's Ctrl-C does not reach it (the harness stops it, see `stop`), and on Linux it is sent
    SIGTERM if the harness dies."""
    with open(f"{log_stem}.stdout", "w") as stdout, open(f"{log_stem}.stderr", "w") as stderr:
        return subprocess.Popen(
            command,
            cwd=cwd,
            stdout=stdout,
            stderr=stderr,
            env=environment,
            start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )


def stop(processes: list[subprocess.Popen]) -> None:
    """End `processes` and every process they started (env workers): SIGTERM to each one's group,
    then SIGKILL to what is left of them after `STOP_GRACE_SECONDS`. They are waited for, so none is
    left behind."""
    for process in processes:
        signal_group(process, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    for process in processes:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for process in processes:  # what is left: a leader, or workers it left behind
        signal_group(process, signal.SIGKILL)
        process.wait()


def signal_group(process: subprocess.Popen, sent: signal.Signals) -> None:
    try:
        os.killpg(process.pid, sent)
    except ProcessLookupError:  # the whole group has ended
        pass


class PassedOn:
    """The harness's runs, which a stop signal to the harness reaches too (`passing_stop_signals_on`)."""

    def __init__(self) -> None:
        self.signum: int | None = None  # the stop signal, once one came
        self._processes: set[subprocess.Popen] = set()
        self._lock = threading.Lock()

    def run(self, command: list[str], **popen: Any) -> subprocess.CompletedProcess:
        """`subprocess.run(command, capture_output=True, text=True, **popen)`, its process reached by
        a stop signal to the harness; one started after the signal is sent it at once."""
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen
        )
        with self._lock:
            self._processes.add(process)
            if self.signum is not None:
                process.send_signal(self.signum)
        try:
            stdout, stderr = process.communicate()
        finally:
            with self._lock:
                self._processes.discard(process)
        return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)

    def pass_on(self, signum: int) -> None:
        with self._lock:
            self.signum = self.signum or signum
            for process in self._processes:
                process.send_signal(signum)


@contextmanager
def passing_stop_signals_on(runs: PassedOn) -> Iterator[None]:
    """Inside it, a stop signal to the harness (Ctrl-C, SIGTERM, SIGUSR1, SIGHUP) reaches each of
    `runs` (which stops after its iteration with a checkpoint, and ignores the same signal again
    when it reached it directly too, as a terminal's Ctrl-C does), and no new run should start
    (`runs.signum` is set). Leaving the block after one raises `Interrupted`: the harness's exit
    status is 128 + the signal's number."""

    def pass_on(signum: int, frame: Any) -> None:
        if runs.signum is None:
            name = signal.Signals(signum).name
            print(f"\nbenchmark: {name}: stopping every running run", file=sys.stderr, flush=True)
        runs.pass_on(signum)

    if threading.current_thread() is not threading.main_thread():  # no handler runs there
        yield
        return
    with stop_signals_raise():
        previous = {signum: signal.signal(signum, pass_on) for signum in STOP_SIGNALS}
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        if runs.signum is not None:
            raise Interrupted(runs.signum)

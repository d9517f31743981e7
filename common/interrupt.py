"""Stopping a run cleanly: Ctrl-C, and the signals schedulers send before they end a job (SIGTERM
from SLURM at a time limit or preemption, Kubernetes, `docker stop` and torchrun's agent; SIGUSR1
from SLURM's `--signal`; SIGHUP from a closed terminal). The first one lets the current iteration
finish (so that a checkpoint holds a consistent state), a second one stops at once. Env worker
processes ignore them: only the training process decides when to stop."""

from __future__ import annotations

import _thread
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP)

SAME_REQUEST_SECONDS = 2.0
"""The same signal again within this many seconds of the first is the same request: under SLURM
both slurmstepd and torchrun's agent send a worker SIGTERM, and a harness passes on what reached
its runs already."""

LOST_REQUEST_SECONDS = 5.0
"""Outside the training loop, a stop signal raises `Interrupted`; if the run has not left
`stop_signals_raise` this many seconds later, the exception was lost (a handler that runs inside a
finalizer, a `__del__` or a generator's clean-up, has its exception printed and dropped), and the
signal is delivered again: a second request. More than `SAME_REQUEST_SECONDS`."""


class Interrupted(KeyboardInterrupt):
    """A run stopped by the signal `signum`; its exit status is the shell's, 128 + signum (130 for
    Ctrl-C, 143 for SIGTERM, 138 for SIGUSR1, 129 for SIGHUP)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_status(self) -> int:
        return 128 + self.signum


class _Request:
    """The process's stop request: the first signal, and when it came."""

    signum: int | None = None
    time = 0.0
    left = threading.Event()  # set when the run has left `stop_signals_raise`

    @classmethod
    def make(cls, signum: int) -> bool:
        """Record `signum`; whether it is a new request (False: the first one's signal again within
        `SAME_REQUEST_SECONDS`). A second request raises `Interrupted`, with the first's status."""
        now = time.monotonic()
        if cls.signum is not None:
            if signum == cls.signum and now - cls.time < SAME_REQUEST_SECONDS:
                return False
            raise Interrupted(cls.signum)
        cls.signum, cls.time = signum, now
        return True

    @classmethod
    def clear(cls) -> None:
        cls.signum = None


def _raise_interrupted(signum: int, frame: object) -> None:
    if _Request.make(signum):
        _Request.left.clear()
        threading.Thread(
            target=_until_the_request_ends_the_run, args=(signum,), daemon=True
        ).start()
        raise Interrupted(signum)


def _until_the_request_ends_the_run(signum: int) -> None:
    """Deliver `signum` to the main thread again each `LOST_REQUEST_SECONDS` until the run leaves
    `stop_signals_raise` (see LOST_REQUEST_SECONDS)."""
    while not _Request.left.wait(LOST_REQUEST_SECONDS):
        _thread.interrupt_main(signum)


def _after_the_request(signum: int, frame: object) -> None:
    """While the process ends after a stop request: the same signal again at once is ignored, any
    other ends it as if no handler were set."""
    try:
        _Request.make(signum)
    except Interrupted:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


@contextlib.contextmanager
def stop_signals_raise() -> Iterator[None]:
    """Inside it, each of `STOP_SIGNALS` raises `Interrupted`, as Python's own Ctrl-C raises
    KeyboardInterrupt: a run stopped outside its training loop (setting up, evaluating) still runs
    its exit handlers (TensorBoard's writer, the rows waiting for wandb). After a stop request, its
    duplicates are ignored until the process ends. Nothing outside the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _Request.clear()
    previous = {signum: signal.signal(signum, _raise_interrupted) for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        _Request.left.set()
        stopping = _Request.signum is not None
        for signum, handler in previous.items():
            signal.signal(signum, _after_the_request if stopping else handler)


class GracefulInterrupt:
    """A context manager: inside it, the first of `STOP_SIGNALS` sets `requested` (and `signum`) and
    prints one line, and a second raises `Interrupted` at once (the same signal within
    `SAME_REQUEST_SECONDS` counts once). A block left normally after a first signal raises
    `Interrupted` at its end, so the caller can finish its iteration and write a checkpoint inside
    the block. Outside the main thread (where signals cannot be handled) it does nothing."""

    def __init__(self) -> None:
        self.requested = False
        self.signum = 0  # the request's signal (under torchrun, maybe another rank's)
        self._previous: dict[int, object] = {}

    def _handle(self, signum: int, frame: object) -> None:
        if not _Request.make(signum):
            return
        self.requested, self.signum = True, signum
        name = signal.Signals(signum).name
        print(
            f"\ninterrupt: {name}: stopping after this iteration, with a checkpoint (a second signal stops now)",
            file=sys.stderr,
            flush=True,
        )

    def __enter__(self) -> GracefulInterrupt:
        if threading.current_thread() is threading.main_thread():
            _Request.clear()
            self._previous = {
                signum: signal.signal(signum, self._handle) for signum in STOP_SIGNALS
            }
        return self

    def __exit__(self, exc_type, exc_value, traceback) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        if self.requested and exc_type is None:
            print("interrupted: stopped after the iteration", file=sys.stderr, flush=True)
            raise Interrupted(self.signum)


@contextlib.contextmanager
def stop_signals_held() -> Iterator[None]:
    """Inside it, `STOP_SIGNALS` wait (blocked, none lost), and the threads and processes started
    here inherit that. Env workers, which call `ignore_stop_signals` first thing: a terminal's
    Ctrl-C or a scheduler's SIGTERM reaches every process of the job, and AsyncVectorEnv's workers
    would die of it before the training process could finish its iteration and write its
    checkpoint. A torchrun process group's network threads, which keep them blocked: the main
    thread takes the signal."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def ignore_stop_signals() -> None:
    """In an env worker started in `stop_signals_held`: ignore every stop signal,
    but SIGTERM from the parent (gymnasium's `close(terminate=True)`, multiprocessing's clean-up at
    exit), which ends the worker as before. A thread waits for SIGTERM to learn who sent it."""
    for signum in STOP_SIGNALS:
        if signum != signal.SIGTERM:
            signal.signal(signum, signal.SIG_IGN)  # a blocked signal that is pending goes too
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # for the waiting thread alone
    # Default, not ignored: an ignored signal is discarded on arrival, before the thread can see it.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, set(STOP_SIGNALS) - {signal.SIGTERM})
    parent = os.getppid()

    def wait_for_the_parent_s_sigterm() -> None:
        while True:
            sender = signal.sigwaitinfo({signal.SIGTERM}).si_pid
            if sender == parent or os.getppid() != parent:  # or the parent is gone
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
                os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=wait_for_the_parent_s_sigterm, daemon=True).start()


def end_as_terminated_if_the_pipe_broke() -> None:
    """In an env worker (`ignore_stop_signals`), while its env closes: if the training process
    closed its end of the pipe (the exception being handled says so), end now by SIGTERM. gymnasium's
    `close(terminate=True)` sends SIGTERM and closes the pipes at once, and a worker whose waiting
    thread had not yet run saw the closed pipe first and died of a BrokenPipeError traceback."""
    if isinstance(sys.exc_info()[1], (EOFError, BrokenPipeError, ConnectionResetError)):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        os.kill(os.getpid(), signal.SIGTERM)

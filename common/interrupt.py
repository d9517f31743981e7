"""Graceful Ctrl-C: the first one lets the current iteration finish (so a checkpoint holds a
consistent state), a second one stops at once. Env worker processes ignore it: only the training
process decides when to stop."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator


class GracefulInterrupt:
    """A context manager: inside it, the first SIGINT sets `requested` and prints one line, and the
    second raises KeyboardInterrupt at once. A block left normally after a first SIGINT raises
    KeyboardInterrupt at its end, so the caller can finish its iteration and write a checkpoint
    inside the block. Outside the main thread (where signals cannot be handled) it does nothing."""

    def __init__(self) -> None:
        self.requested = False
        self._previous = None

    def _handle(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        print(
            "\ninterrupt: stopping after this iteration (Ctrl-C again to stop now)", file=sys.stderr
        )

    def __enter__(self) -> GracefulInterrupt:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, exc_type, exc_value, traceback) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
        if self.requested and exc_type is None:
            print("interrupted: stopped after the iteration", file=sys.stderr)
            raise KeyboardInterrupt


@contextlib.contextmanager
def sigint_ignored_by_new_processes() -> Iterator[None]:
    """Processes started inside this block ignore SIGINT. A terminal's Ctrl-C reaches its whole
    process group, and AsyncVectorEnv's workers would die of it before the training process could
    write its checkpoint. The ignored disposition is inherited through fork and kept across exec,
    and python does not replace it at start-up."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)

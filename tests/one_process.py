"""Run several `python ...` command lines in turn in this one process, each as `python` would run it
(`helpers.run_in_one_process`): `python tests/one_process.py CALLS.json RESULTS.json`.

Each call is `[SCRIPT, FLAGS...]` or `["-m", MODULE, FLAGS...]`, run as `__main__` with its own
`sys.argv`; its exit status is that of its SystemExit (0 when it returns, 1 and the traceback on
stderr for an uncaught exception, as the interpreter does). Its stdout and stderr are file
descriptors 1 and 2 sent to files, so what a C library prints is its own too, and each call's
Python warnings are shown afresh. Meant for calls that end before a run starts (bad input,
--help): a run's atexit work would come at the end of the process, not of its call."""

import json
import os
import runpy
import sys
import tempfile
import traceback
import warnings
from pathlib import Path


def run(call: list[str]) -> tuple[int, str, str]:
    """`call`'s exit status, stdout and stderr."""
    outputs = [tempfile.TemporaryFile(), tempfile.TemporaryFile()]
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    for output, fd in zip(outputs, (1, 2), strict=True):
        os.dup2(output.fileno(), fd)
    try:
        with warnings.catch_warnings():  # the warnings shown once by an earlier call, shown again
            if call[0] == "-m":
                sys.argv, sys.path[0] = [call[1], *call[2:]], os.getcwd()
                runpy.run_module(call[1], run_name="__main__", alter_sys=True)
            else:
                sys.argv, sys.path[0] = list(call), str(Path(call[0]).resolve().parent)
                runpy.run_path(call[0], run_name="__main__")
        status = 0
    except SystemExit as stop:
        status = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
        if isinstance(stop.code, str):
            print(stop.code, file=sys.stderr)
    except BaseException:  # as the interpreter: the traceback, status 1
        traceback.print_exc()
        status = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, copy in zip((1, 2), saved, strict=True):
            os.dup2(copy, fd)
            os.close(copy)
    texts = []
    for output in outputs:
        output.seek(0)
        texts.append(output.read().decode(errors="replace"))
        output.close()
    return status, *texts


if __name__ == "__main__":
    calls = json.loads(Path(sys.argv[1]).read_text())
    Path(sys.argv[2]).write_text(json.dumps([run(call) for call in calls]))

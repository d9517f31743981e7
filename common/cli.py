"""The command line every script shares: tyro parsing with one-line errors, notices, and exit
statuses."""

from __future__ import annotations

import contextlib
import io
import multiprocessing
import re
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import tyro
from tqdm import tqdm

from common import distributed
from common.errors import RunStopped, UsageError
from common.interrupt import stop_signals_raise
from common.resume_check import check_resume

Config = TypeVar("Config")

# Box-drawing characters, which frame tyro's messages, and terminal colour codes.
_FRAME = re.compile(r"[\u2500-\u257f]")
_COLOUR = re.compile(r"\x1b\[[0-9;]*m")
_printed_notices: set[str] = set()


def one_line(message: str) -> str:
    """A framed, multi-line message as one line, relying on no layout, only on the text: frames are removed, rules
    ("----") separate sections, whose lines are joined with spaces (the message may be wrapped at any width), and the
    sections are joined with '; '. The title is dropped when the next section repeats it, and so is the help footer.

    >>> one_line("╭─ Bad value ─╮\\n│ Bad value: x │\\n│ ──── │\\n│ Perhaps you meant: │\\n│  --y │\\n╰───╯")
    'Bad value: x; Perhaps you meant: --y'
    >>> one_line(" Error\\n ---\\n  Argument --n: bad\\n  literal\\n  ---\\n  For full helptext, run\\n  x.py --help")
    'Error; Argument --n: bad literal'
    """
    sections: list[list[str]] = [[]]
    for raw in _COLOUR.sub("", message).splitlines():
        line = " ".join(_FRAME.sub(" ", raw).split())
        if line.strip("-"):
            sections[-1].append(line)
        elif raw.strip():  # a rule or a border starts a new section
            sections.append([])
    if sections[0]:  # the first line is a title of its own
        sections[0:1] = [sections[0][:1], sections[0][1:]]
    texts = [re.sub(r" ([,.;)])", r"\1", " ".join(section)) for section in sections if section]
    texts = [text for text in texts if not text.lower().startswith("for full helptext")]
    if len(texts) > 1 and texts[1].startswith(texts[0]):
        texts = texts[1:]
    return "; ".join(texts)


def parse_args(config: type[Config], argv: Sequence[str] | None = None) -> Config:
    """Parse `argv` (default: the command line) into `config` with tyro; a parse error is a
    UsageError whose message is tyro's own, hints included, on one line. `--help` prints tyro's help
    and exits as usual."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        return tyro.cli(config, args=argv)
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured), contextlib.redirect_stdout(captured):
            return tyro.cli(config, args=argv)
    except SystemExit as exc:
        if exc.code in (0, None):
            raise
        raise UsageError(
            f"{one_line(captured.getvalue()) or 'invalid arguments'} (see --help)"
        ) from None


def check_ranges(
    args: object,
    positive: Iterable[str] = (),
    non_negative: Iterable[str] = (),
    unit_interval: Iterable[str] = (),
) -> None:
    """Raise a UsageError naming the first field of `args` (a dataclass of flags) outside its range; None is unset.

    >>> from types import SimpleNamespace
    >>> check_ranges(SimpleNamespace(num_envs=0), positive=["num_envs"])
    Traceback (most recent call last):
    common.errors.UsageError: --num-envs must be positive, got 0
    """
    rules = (
        (positive, lambda value: value > 0, "be positive"),
        (non_negative, lambda value: value >= 0, "be zero or more"),
        (unit_interval, lambda value: 0 <= value <= 1, "lie in [0, 1]"),
    )
    for names, holds, rule in rules:
        for name in names:
            value = getattr(args, name)
            if value is not None and not holds(value):
                raise UsageError(f"--{name.replace('_', '-')} must {rule}, got {value}")


def notice(message: str, every_rank: bool = False) -> None:
    """Print `notice: message` on stderr once per process, and only in the main process (not in env
    workers); under torchrun only on rank 0, unless the notice is about this rank's own state
    (`every_rank`)."""
    if message in _printed_notices or multiprocessing.parent_process() is not None:
        return
    if distributed.rank() and not every_rank:
        return
    _printed_notices.add(message)
    # tqdm's write: on a line of its own above a progress bar, not after it
    tqdm.write(
        f"notice: {f'rank {distributed.rank()}: ' * (distributed.world_size() > 1)}{message}",
        file=sys.stderr,
    )


def exit_status(run: Callable[[], object]) -> int:
    """Call `run` and turn the project's errors into one `error:` line and an exit status: 2 for bad
    input, 1 for a run stopped by a check, 128 + the signal's number for a run stopped by Ctrl-C
    (130), SIGTERM (143), SIGUSR1 (138) or SIGHUP (129), 0 otherwise."""
    try:
        with stop_signals_raise():
            run()
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except RunStopped as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:
        status = getattr(exc, "exit_status", 130)
        distributed.leave(status)  # under torchrun every rank stopped after the same iteration
        return status
    except Exception as exc:
        if not distributed.collective_failed(exc):
            raised = raised_in_common(exc)
            if raised is None:
                raise
            print(f"error: {raised}", file=sys.stderr)
            return 1
        failed = f"rank {distributed.rank()}: a collective failed"
        failed += ", most likely because another process of the run stopped"
        print(f"error: {failed} ({type(exc).__name__}: {one_line(str(exc))})", file=sys.stderr)
        return 1
    distributed.leave(0)
    return 0


def raised_in_common(exc: BaseException) -> str | None:
    """Where `exc` was raised inside common/ (or in a library it called) while it ran a script's
    code, what to say of it on one line: the exception, where in common/, the script's function
    that called in (an edit there, or in what it hands common/, is the likely cause) and its docs
    page's section; the whole traceback goes to a file the line names. None where it was raised in
    the script itself (a user's own line: its traceback says it best) or outside any script."""
    frames = [(frame, line) for frame, line in traceback.walk_tb(exc.__traceback__)]
    common_folder = Path(__file__).resolve().parent
    project = [
        (frame, line)
        for frame, line in frames
        if Path(frame.f_code.co_filename).resolve().parent == common_folder
        or "PAGE" in frame.f_globals
    ]
    if not project or "PAGE" in project[-1][0].f_globals:
        return None
    scripts = [(frame, line) for frame, line in project if "PAGE" in frame.f_globals]
    if not scripts:
        return None
    inner, inner_line = project[-1]
    script, script_line = scripts[-1]
    with tempfile.NamedTemporaryFile(
        "w", prefix="onefile-rl-traceback-", suffix=".txt", delete=False
    ) as saved:
        traceback.print_exception(exc, file=saved)
    raiser = frames[-1][0].f_code
    parts = Path(raiser.co_filename).parts
    library = parts[parts.index("site-packages") + 1] if "site-packages" in parts else None
    by = (
        f", raised by {library}'s {raiser.co_qualname}"
        if library and raiser is not inner.f_code
        else ""
    )
    return (
        f"{type(exc).__name__} in common/{Path(inner.f_code.co_filename).name}:{inner_line} "
        f"({inner.f_code.co_name}){by}: {one_line(str(exc)) or 'no message'}; it ran "
        f"{Path(script.f_code.co_filename).name}'s {script.f_code.co_qualname} (line {script_line}), so the cause "
        f'is most likely an edit there or in what it hands common/ ({script.f_globals["PAGE"]}, "When a check '
        f'stops a run"); the traceback: {saved.name}'
    )


def main(
    config: type[Config],
    train: Callable[[Config], Any],
    evaluate_checkpoint: Callable[[Config], object],
    argv: Sequence[str] | None = None,
) -> int:
    """A script's command line: its flags parsed into `config`, then `check_resume` with
    --check-resume, `evaluate_checkpoint(args)` with --eval-checkpoint, else `train(args)`, whose
    result's summary is printed; the exit status (see `exit_status`)."""

    def run() -> None:
        args = parse_args(config, argv)
        if getattr(args, "check_resume", False):
            script = sys.modules[config.__module__].__file__
            check_resume(script, list(sys.argv[1:] if argv is None else argv), args)
        elif args.eval_checkpoint:
            evaluate_checkpoint(args)
        else:
            train(args).print_summary()

    return exit_status(run)

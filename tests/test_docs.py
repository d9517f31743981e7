"""README.md and docs/: every relative link resolves, and every command line uses flags that exist.

Commands are read from README.md (fenced blocks and inline code) and from the fenced blocks of the pages directly
under docs/ (their quick starts). Inline commands on docs pages are records of how a measurement was made and are
left as they were written. A command's flags are checked against its own `--help` (run once per command, in
parallel), so the test follows the scripts as they change.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote

import pytest
from helpers import run_in_one_process

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
MARKDOWN_FILES = [README, *sorted((REPO / "docs").rglob("*.md"))]
COMMAND_FILES = [README, *sorted((REPO / "docs").glob("*.md"))]

FENCE = re.compile(r"^(```|~~~)[^\n]*\n(.*?)^\1[ \t]*$", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"(`+)(?!`)((?:(?!\n\s*\n).)+?)(?<!`)\1(?!`)", re.DOTALL)
INLINE_LINK = re.compile(
    r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+[\"'(][^)]*)?\s*\)"
)
REFERENCE_LINK = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)", re.MULTILINE)
HTML_LINK = re.compile(r"<(?:img|a)\b[^>]*?\b(?:src|href)=[\"']([^\"']+)[\"']", re.IGNORECASE)
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
SEPARATORS = {"&&", "||", ";", "|", "&"}


def without_code(text: str) -> str:
    """The Markdown text with fenced blocks and inline code removed: links inside code are not links."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def link_targets(text: str) -> list[str]:
    prose = without_code(text)
    targets = [
        *INLINE_LINK.findall(prose),
        *REFERENCE_LINK.findall(prose),
        *HTML_LINK.findall(prose),
    ]
    return [target.strip("<>") for target in targets]


def unresolved_links(path: Path) -> list[str]:
    missing = []
    for target in link_targets(path.read_text(encoding="utf-8")):
        # an anchor on the page, or http(s), mailto, ...
        if target.startswith("#") or SCHEME.match(target):
            continue
        relative = unquote(target.split("#", 1)[0].split("?", 1)[0])
        resolved = (
            (REPO / relative.lstrip("/")) if relative.startswith("/") else (path.parent / relative)
        )
        resolved = resolved.resolve()
        if not resolved.is_relative_to(REPO):
            missing.append(f"{target} (outside the repository)")
        elif not resolved.exists():
            missing.append(target)
    return missing


@pytest.mark.parametrize("path", MARKDOWN_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_and_images_resolve(path):
    assert unresolved_links(path) == [], (
        f"{path.relative_to(REPO)}: links to files that do not exist"
    )


def command_lines(text: str, inline: bool) -> list[str]:
    """Lines of shell from fenced blocks (joined where a line ends in a backslash) and, with `inline`, inline code."""
    lines = []
    for block in FENCE.finditer(text):
        lines += block.group(2).replace("\\\n", " ").splitlines()
    if inline:
        lines += [" ".join(code.split()) for _, code in INLINE_CODE.findall(FENCE.sub("", text))]
    return lines


def tokens(line: str) -> list[str]:
    try:
        return shlex.split(line, comments=True)
    # an unbalanced quote in prose-like code: whitespace is good enough to find flags
    except ValueError:
        return line.split("#", 1)[0].split()


def commands(line: str) -> list[tuple[tuple[str, ...], list[str]]]:
    """(program, flags) of every `python SCRIPT.py ...`, `torchrun ... SCRIPT.py ...` and `python -m benchmark
    SUBCOMMAND ...` in a shell line.
    The program is what its `--help` is asked of; the flags are the `--name` parts of the options it is given."""
    found = []
    words = tokens(line)
    for start, word in enumerate(words):
        if Path(word).name not in ("python", "python3", "torchrun") or start + 1 >= len(words):
            continue
        rest = words[start + 1 :]
        if word == "torchrun":  # torchrun's own options, then the script and its flags
            rest = next((rest[i:] for i, part in enumerate(rest) if part.endswith(".py")), [""])
        if rest[0].endswith(".py"):
            program, arguments = (rest[0],), rest[1:]
        elif rest[:2] == ["-m", "benchmark"] and len(rest) > 2 and not rest[2].startswith("-"):
            program, arguments = ("-m", "benchmark", rest[2]), rest[3:]
        else:
            continue
        flags = []
        for argument in arguments:
            if argument in SEPARATORS:
                break
            if argument.startswith("--") and len(argument) > 2:
                flags.append(argument.split("=", 1)[0])
        found.append((program, flags))
    return found


def documented_commands() -> dict[tuple[str, ...], dict[str, set[str]]]:
    """For every program a command names: each flag it is given, with the files that give it."""
    programs: dict[tuple[str, ...], dict[str, set[str]]] = {}
    for path in COMMAND_FILES:
        for line in command_lines(path.read_text(encoding="utf-8"), inline=path == README):
            for program, flags in commands(line):
                uses = programs.setdefault(program, {})
                for flag in flags:
                    uses.setdefault(flag, set()).add(str(path.relative_to(REPO)))
    return programs


def help_flags(help_text: str) -> set[str]:
    """The options a tyro `--help` lists: the first column of each option's line (`--x, --no-x`, then a metavar)."""
    flags = {"--help"}
    for line in help_text.splitlines():
        entry = line.strip("│╭╮╰╯─ \t")
        if entry.startswith("-"):
            flags.update(re.findall(r"--[A-Za-z0-9][\w-]*", re.split(r"\s{2,}", entry)[0]))
    return flags


@pytest.fixture(scope="module")
def programs_and_their_help():
    programs = documented_commands()
    env = {**os.environ, "COLUMNS": "1000", "NO_COLOR": "1", "TERM": "dumb"}
    # those with a flag to check, but a missing script (which the test reports)
    asked = [
        program
        for program, uses in programs.items()
        if uses and (not program[0].endswith(".py") or (REPO / program[0]).is_file())
    ]
    helps = {}
    for program, done in zip(
        asked, run_in_one_process([[*p, "--help"] for p in asked], env), strict=True
    ):
        output = done.stdout + done.stderr
        assert done.returncode == 0, f"python {' '.join(program)} --help failed:\n{output}"
        helps[program] = help_flags(output)
    return programs, helps


def test_the_commands_are_found():
    # A parser that finds nothing would make the next test pass on anything.
    programs = documented_commands()
    assert {"--env-id"} <= set(programs[("ppo_lstm.py",)])
    assert {"--env-id", "--num-envs"} <= set(programs[("ppo_fc.py",)])
    assert {"--suite", "--baselines"} <= set(programs[("-m", "benchmark", "run")])
    continued = "python ppo_fc.py --env-id X --num-envs 1 \\\n    --learning-rate 3e-4 --norm-obs  # a comment --no\n"
    assert commands(command_lines(f"```bash\n{continued}```\n", inline=False)[0]) == [
        (("ppo_fc.py",), ["--env-id", "--num-envs", "--learning-rate", "--norm-obs"])
    ]
    assert commands("torchrun --standalone --nproc-per-node 2 ppo_fc.py --env-id X") == [
        (("ppo_fc.py",), ["--env-id"])
    ]
    assert commands(
        "pip install -e . && python ppo_lstm.py --env-id=CartPole-v1 && python -m pytest -n 2"
    ) == [(("ppo_lstm.py",), ["--env-id"])]


def test_every_flag_in_a_command_exists(programs_and_their_help):
    programs, helps = programs_and_their_help
    problems = []
    for program, uses in sorted(programs.items()):
        name = f"python {' '.join(program)}"
        if program[0].endswith(".py") and not (REPO / program[0]).is_file():
            problems.append(f"{name}: no such script")
            continue
        if not uses:
            continue
        assert len(helps[program]) > 1, f"{name} --help: no options found in its output"
        problems += [
            f"{name} {flag}: not in its --help ({', '.join(sorted(files))})"
            for flag, files in sorted(uses.items())
            if flag not in helps[program]
        ]
    assert problems == [], "\n".join(problems)


COMMIT_NAMED = re.compile(r"\bgit ([0-9a-f]{7,40}(?: \(uncommitted changes\))?)")
BENCHMARK_PAGE = REPO / "docs" / "benchmark.md"
FIGURE_SOURCES = "Where each figure comes from"  # docs/benchmark.md's table of the README's figures


def section(text: str, heading: str) -> str:
    """The text under a `## heading` of a Markdown page, up to the next heading of its level or above."""
    found = re.search(
        rf"^## {re.escape(heading)}[ \t]*\n(.*?)(?=^#{{1,2}} |\Z)", text, re.MULTILINE | re.DOTALL
    )
    assert found, f"no section '## {heading}'"
    return found.group(1)


def figure_results_links() -> list[tuple[str, Path]]:
    """Each results file or folder (under docs/benchmark/, figures aside) that docs/benchmark.md's table of the
    README's figures links to, with the table's line that links to it."""
    links = []
    for line in section(BENCHMARK_PAGE.read_text(encoding="utf-8"), FIGURE_SOURCES).splitlines():
        for target in link_targets(line):
            if target.startswith("benchmark/") and not target.endswith(".png"):
                links.append((line, BENCHMARK_PAGE.parent / target.split("#", 1)[0]))
    return links


def test_each_results_file_the_figure_table_links_names_the_commit_it_gives():
    # the README sends its reader to the table for where its figures come from
    assert "(docs/benchmark.md#where-each-figure-comes-from)" in README.read_text(encoding="utf-8")
    links = figure_results_links()
    assert len(links) >= 10
    for line, path in links:
        if path.is_dir():  # a stored run per file, each made at its own commit
            made = [json.loads(run.read_text())["made"]["git"] for run in path.glob("*.json")]
            assert made and all(COMMIT_NAMED.fullmatch(f"git {git}") for git in made), path
            continue
        named = COMMIT_NAMED.search(path.read_text(encoding="utf-8"))
        assert named, f"{path.relative_to(REPO)} names no commit"
        # as the file gives it, "(uncommitted changes)" too
        assert named.group(1) in line, (
            f"the figure table cites {path.name} without {named.group(1)!r}"
        )


def shell_commands(lines: list[str]) -> list[str]:
    """Each command of shell lines, split at `&&`, as its words (quotes and comments gone, and pip's --quiet)."""
    commands: list[str] = []
    for line in lines:
        words = [word for word in tokens(line) if word != "--quiet"]
        for command in " ".join(words).split(" && "):
            if command.strip():
                commands.append(command.strip())
    return commands


def test_ci_runs_the_readme_test_commands():
    readme = README.read_text(encoding="utf-8")
    # the README's Development section gives CI's commands, all of them and in CI's order
    development = shell_commands(command_lines(section(readme, "Development"), inline=False))
    ci = [
        command
        for command in shell_commands(
            (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
        )
        if command.split()[0] in ("pip", "ruff", "python")
    ]
    quick, full = "python -m pytest -n 2 -m quick", "python -m pytest -n 2"
    assert {"pip install torch==2.13.0", quick, full} <= set(ci)
    assert development == ci
    assert "`bash .ci/run`" in section(readme, "Development")
    # and the test commands of its set-up are CI's
    set_up = shell_commands(command_lines(section(readme, "Set-up"), inline=False))
    assert [command for command in set_up if "pytest" in command] == [quick, full]


# A pytest session in another process that collects the suite as the README's commands do and prints how many
# tests it holds and how many of them the quick tier takes.
COUNT_TESTS = """
import sys, pytest
class Count:
    def pytest_collection_finish(self, session):
        quick = sum(1 for item in session.items if item.get_closest_marker("quick"))
        print(f"collected {len(session.items)} {quick}")
sys.exit(pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider"], plugins=[Count()]))
"""


def test_the_readme_gives_the_number_of_tests_pytest_collects():
    readme = README.read_text(encoding="utf-8")
    given = [
        int(re.search(rf"the {tier}[:,] (\d+) tests", readme).group(1))
        for tier in ("full suite", "quick tier")
    ]
    done = subprocess.run(
        [sys.executable, "-c", COUNT_TESTS], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    (counts,) = re.findall(r"^collected (\d+) (\d+)$", done.stdout, re.MULTILINE)
    assert given == [int(count) for count in counts], "the README's test counts are not pytest's"


MAX_LINES, MAX_LINE, MAX_CELL = 150, 120, 200


def front_page_excess(text: str) -> list[str]:
    """Where a front page is over its limits: more lines than MAX_LINES, a line over MAX_LINE characters outside a
    table, a table cell (between `|`s) over MAX_CELL."""
    lines = text.splitlines()
    excess = [f"{len(lines)} lines, more than {MAX_LINES}"] if len(lines) > MAX_LINES else []
    for number, line in enumerate(lines, 1):
        if line.startswith("|"):
            cells = [cell.strip() for cell in line.strip("|").split("|")]
            excess += [
                f"line {number}: a cell of {len(c)} characters" for c in cells if len(c) > MAX_CELL
            ]
        elif len(line) > MAX_LINE:
            excess.append(f"line {number}: {len(line)} characters: {line[:50]}...")
    return excess


def test_the_readme_is_a_front_page():
    assert front_page_excess(README.read_text(encoding="utf-8")) == []
    # each limit is found, a table row's by its cells
    assert front_page_excess("line\n" * (MAX_LINES - 1) + "| " + "x" * MAX_CELL + " | y |") == []
    assert front_page_excess("line\n" * (MAX_LINES + 1)) == [
        f"{MAX_LINES + 1} lines, more than {MAX_LINES}"
    ]
    assert len(front_page_excess("x" * (MAX_LINE + 1))) == 1
    assert len(front_page_excess("| " + "x" * (MAX_CELL + 1) + " | y |")) == 1


def documented_modules() -> list[str]:
    """Every module of this repository that a page runs with `python -m` (its first part is a folder here)."""
    modules = set()
    for path in COMMAND_FILES:
        for line in command_lines(path.read_text(encoding="utf-8"), inline=True):
            words = tokens(line)
            for i, word in enumerate(words[:-2]):
                if Path(word).name in ("python", "python3") and words[i + 1] == "-m":
                    if (REPO / words[i + 2].split(".")[0]).is_dir():
                        modules.add(words[i + 2])
    return sorted(modules)


def test_the_documented_modules_are_found():
    assert {"benchmark", "benchmark.readability", "common.trajectories"} <= set(
        documented_modules()
    )


@pytest.fixture(scope="module")
def helps() -> dict[str, subprocess.CompletedProcess]:
    modules = documented_modules()
    done = run_in_one_process([["-m", module, "--help"] for module in modules])
    return dict(zip(modules, done, strict=True))


@pytest.mark.parametrize("module", documented_modules())
def test_every_documented_module_answers_help(helps, module):
    # `python -m benchmark.readability --help` once read "--help" as a script's name and ended in a traceback.
    done = helps[module]
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage" in (done.stdout + done.stderr).lower()

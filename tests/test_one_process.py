"""tests/one_process.py: command lines run in one process give what each gives in a process of its own."""

import sys

from helpers import assert_one_error_line, run_in_one_process, run_script

WARNER = """
import warnings
def warn():
    warnings.warn("once per process by default")
"""

WARNS_AND_FAILS = """
import os, sys
import warner  # a module's warning: shown once per process, by default
warner.warn()
os.write(2, b"written by C\\n")
print("argv", sys.argv[1:])
if sys.argv[1:] == ["fail"]:
    raise RuntimeError("uncaught")
sys.exit(int(sys.argv[1]))
"""


def test_each_call_has_the_status_and_output_of_its_own_process(tmp_path):
    script = tmp_path / "warns_and_fails.py"
    script.write_text(WARNS_AND_FAILS)
    (tmp_path / "warner.py").write_text(WARNER)
    calls = [
        [str(script), "fail"],
        [str(script), "3"],
        [str(script), "0"],
        ["ppo_fc.py", "--num-envs", "-2", "--run-dir", str(tmp_path / "runs")],
        ["ppo_fc.py", "--help"],
    ]
    together = run_in_one_process(calls)
    for call, completed in zip(calls, together, strict=True):
        alone = run_script(*call)
        assert completed.returncode == alone.returncode, call
        assert completed.stdout == alone.stdout, call
        if call[0] == str(script):  # the same lines but the traceback's file names
            assert completed.stderr.splitlines()[:3] == alone.stderr.splitlines()[:3], call
            assert completed.stderr.splitlines()[-1] == alone.stderr.splitlines()[-1], call
        else:
            assert completed.stderr == alone.stderr, call
    assert together[0].returncode == 1 and "RuntimeError: uncaught" in together[0].stderr
    assert [c.stderr.count("UserWarning: once per process") for c in together[:3]] == [1, 1, 1]
    assert [c.stderr.count("written by C") for c in together[:3]] == [1, 1, 1]


def test_a_module_runs_as_python_m_runs_it(tmp_path):
    (module,) = run_in_one_process(
        [["-m", "benchmark", "run", "--seeds", "1", "1", "--out", str(tmp_path)]]
    )
    assert_one_error_line(module, "distinct")
    assert module.args == [
        sys.executable,
        "-m",
        "benchmark",
        "run",
        "--seeds",
        "1",
        "1",
        "--out",
        str(tmp_path),
    ]

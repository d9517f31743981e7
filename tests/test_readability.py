"""benchmark/readability.py: the numbers issue 40's goals are measured by."""

from __future__ import annotations

from pathlib import Path

from benchmark.readability import REPO, SCRIPTS, read, table


def test_the_numbers_of_a_small_script(tmp_path: Path) -> None:
    path = tmp_path / "toy.py"
    path.write_text(
        'class Args:\n    seed: int = 1\n    env_id: str = "x"\n\n\ndef train():\n    a = 1\n    return "'
        + "x" * 100
        + '"\n'
    )
    reading = read(path)
    assert reading.characters == len(path.read_text())
    assert (reading.lines, reading.long_lines) == (8, 1)
    assert (reading.train_lines, reading.train_start) == (3, 6)
    assert (reading.args_fields, reading.env_id_position) == (2, 2)


def test_every_script_has_a_train_function_and_args_with_env_id() -> None:
    readings = [read(REPO / f"{name}.py") for name in SCRIPTS]
    assert all(r.train_lines and r.env_id_position for r in readings)
    assert len(table(readings)) == 2 + len(SCRIPTS)

"""The search spaces of sweeps (benchmark/tune_space.py): parsed, checked against the script, suggested by Optuna."""

from __future__ import annotations

import optuna
import pytest

from benchmark.registry import load_script, resolve_args
from benchmark.tune_space import DEFAULT_SPACES, build_space, space_lines
from common.errors import UsageError


@pytest.mark.parametrize("script", sorted(DEFAULT_SPACES))
def test_default_space_gives_settings_the_script_accepts(script):
    params = build_space(script, [], [])
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(5):
        trial = study.ask()
        flags = [flag for param in params for flag in param.flags(param.suggest(trial))]
        args = resolve_args(script, flags)
        load_script(script).check_args(args)
        for param in params:
            value = getattr(args, param.field)
            if param.kind in ("float", "log", "int"):
                assert param.low <= value <= param.high
            else:
                assert str(value) in param.choices
        study.tell(trial, 0.0)


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("learning-rat=log:1e-5:1e-2", "the script has no flag --learning-rat"),
        ("learning-rate=log:1e-2:1e-5", "an empty range"),
        ("clip-coef=float:0.2:0.2", "an empty range"),
        ("ent-coef=log:0:0.1", "a log range starts above 0"),
        ("update-epochs=int:1.5:4", "an int range's ends are integers"),
        ("num-minibatches=choice:", "no values to choose from"),
        ("learning-rate=uniform:1:2", "write FLAG=float:LOW:HIGH"),
        ("learning-rate=float:1", "a range is LOW:HIGH"),
        ("num-envs=int:0:4", "ppo_fc.py refuses --num-envs 0"),
        ("gae-lambda=float:0.9:1.5", "ppo_fc.py refuses --gae-lambda 1.5"),
        ("hidden-size=choice:64,big", "ppo_fc.py refuses --hidden-size big"),
    ],
)
def test_bad_space_is_a_usage_error_before_any_trial(line, says):
    with pytest.raises(UsageError, match=says.replace(".", r"\.").replace("-", r"\-")):
        build_space("ppo_fc", [line], [])


def test_the_same_flag_twice_is_a_usage_error():
    with pytest.raises(UsageError, match="given twice"):
        build_space("ppo_fc", ["learning-rate=log:1e-5:1e-3", "learning_rate=float:1e-4:1e-3"], [])


def test_toggles_and_optional_values_become_the_flags_the_script_takes():
    norm_adv, target_kl = build_space(
        "ppo_lstm", ["norm-adv=choice:true,false", "target-kl=choice:None,0.02"], []
    )
    assert norm_adv.flags("true") == ["--norm-adv"] and norm_adv.flags("false") == ["--no-norm-adv"]
    args = resolve_args("ppo_lstm", [*norm_adv.flags("false"), *target_kl.flags("None")])
    assert args.norm_adv is False and args.target_kl is None


def test_base_flags_are_part_of_the_check():
    # 512 steps an iteration (4 envs x 128) split into 3 minibatches is refused only with the base flags given
    with pytest.raises(UsageError, match="refuses --num-minibatches 3"):
        build_space(
            "ppo_fc", ["num-minibatches=choice:2,3"], ["--num-envs", "4", "--num-steps", "128"]
        )


def test_a_space_file_takes_comments_and_joins_the_command_line(tmp_path):
    path = tmp_path / "space.txt"
    path.write_text(
        "# the lstm's memory\nrnn-hidden-size=choice:64,128  # two sizes\n\nbptt-len=choice:0,32\n"
    )
    lines = space_lines(["learning-rate=log:1e-4:1e-3"], [path])
    assert lines == [
        "rnn-hidden-size=choice:64,128",
        "bptt-len=choice:0,32",
        "learning-rate=log:1e-4:1e-3",
    ]
    assert [param.field for param in build_space("ppo_lstm", lines, [])] == [
        "rnn_hidden_size",
        "bptt_len",
        "learning_rate",
    ]
    with pytest.raises(UsageError, match="cannot read search space file"):
        space_lines([], [tmp_path / "missing.txt"])

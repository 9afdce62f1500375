"""Options declared once: the parser, the checks and the roles all come from a config's field metadata."""

import argparse
from dataclasses import dataclass

import pytest

from revnmt.data import DataConfig
from revnmt.model import ExecutionConfig, ModelConfig
from revnmt.options import (
    CHANGEABLE,
    RUN_DEFINING,
    RUN_TIME,
    add_options,
    check_options,
    from_arguments,
    option,
    options_with_role,
    positive,
)
from revnmt.training import CHANGEABLE_ON_RESUME, RUN_DEFINING_OPTIONS, TrainingConfig


@dataclass(frozen=True)
class Toy:
    steps: int = option(3, check=positive, role=RUN_DEFINING, help="steps")
    kind: str = option("a", choices=("a", "b"), role=CHANGEABLE, help="kind", group="other")
    limit: int | None = option(None, type=int, role=RUN_TIME, unset_default=True, help="limit (default: steps)")
    fast: bool = option(False, flag="store_true", role=RUN_TIME, help="fast")
    not_an_option: int = 0

    def __post_init__(self) -> None:
        check_options(self)


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_options(parser, Toy, "toy")
    return parser.parse_args(argv)


def test_the_parser_is_generated_from_the_fields():
    parser = argparse.ArgumentParser()
    add_options(parser, Toy, "toy")
    actions = {action.dest: action for action in parser._actions}
    assert "not_an_option" not in actions
    assert (actions["steps"].default, actions["kind"].choices, actions["limit"].default) == (3, ("a", "b"), None)
    assert {group.title for group in parser._action_groups} >= {"toy", "other"}
    assert from_arguments(Toy, parse("--steps", "5", "--kind", "b", "--fast")) == Toy(5, "b", None, True)


def test_an_unset_option_takes_the_fields_default_but_a_given_none_is_kept():
    assert from_arguments(Toy, parse()) == Toy()
    assert from_arguments(ModelConfig, _model_args("--max-forget-bits", "none"),
                          src_vocab=5, tgt_vocab=5).max_forget_bits is None


def _model_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_options(parser, ModelConfig, "model")
    return parser.parse_args(argv)


def test_the_config_refuses_bad_values_whoever_builds_it():
    with pytest.raises(ValueError, match=r"^--steps must be a positive integer, got 0$"):
        Toy(steps=0)
    with pytest.raises(ValueError, match=r"^--kind must be one of a, b, got 'c'$"):
        Toy(kind="c")
    with pytest.raises(ValueError, match="--epochs must be a positive integer"):
        TrainingConfig(save_dir="x", epochs=0)
    with pytest.raises(ValueError, match="--max-len must be a positive integer"):
        DataConfig(max_len=0)


def test_roles_come_from_the_declarations():
    assert options_with_role(RUN_DEFINING, Toy) == ("steps",)
    assert options_with_role(CHANGEABLE, Toy) == ("kind",)
    assert {"seed", "rnn", "max_forget_bits", "buffer_lanes", "subword", "batch_size"} <= set(RUN_DEFINING_OPTIONS)
    assert {"lr", "epochs", "patience", "keep_checkpoints", "max_nonfinite", "tensorboard"} <= set(CHANGEABLE_ON_RESUME)
    run_time = set(options_with_role(RUN_TIME, DataConfig, ModelConfig, ExecutionConfig, TrainingConfig))
    assert {"device", "hogwild", "buffer_backend", "train", "prepared"} <= run_time
    assert not run_time & set(RUN_DEFINING_OPTIONS) and not run_time & set(CHANGEABLE_ON_RESUME)


def test_defaults_that_depend_on_other_options_are_resolved_by_the_config():
    assert (TrainingConfig(save_dir="x").lr, TrainingConfig(save_dir="x", optimizer="sgd").lr) == (1e-3, 1.0)
    assert TrainingConfig(save_dir="x").batch_size == 64
    assert TrainingConfig(save_dir="x", batch_tokens=2000).batch_size is None
    with pytest.raises(ValueError, match="--memory-budget chooses the batch"):
        TrainingConfig(save_dir="x", memory_budget=2**30, batch_size=8)
    # --batch-tokens with a budget is the effective batch, which the budget reaches with the --update-freq it chooses
    assert TrainingConfig(save_dir="x", memory_budget=2**30, batch_tokens=4096).batch_tokens == 4096
    with pytest.raises(ValueError, match="chooses the --update-freq"):
        TrainingConfig(save_dir="x", memory_budget=2**30, batch_tokens=4096, update_freq=2)

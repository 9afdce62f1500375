"""Options declared once: each option of the commands is a field of a typed config, and its metadata says
everything else about it.

A field declared with :func:`option` carries its help, how the command line converts it, what values it takes
(its check) and its :class:`Role` in a resumed run. From that one declaration come the command-line options
(:func:`add_options`, fairseq's ``gen_parser_from_dataclass`` written for this project), the configs' own
checks (:func:`check_options`, called by each config's ``__post_init__``: the one place a value is refused),
and the lists of run-defining and changeable options that resuming compares (:func:`options_with_role`).

The configs that declare options: :class:`revnmt.data.DataConfig`, :class:`revnmt.model.ModelConfig`,
:class:`revnmt.model.ExecutionConfig` and :class:`revnmt.training.TrainingConfig`.
"""

from __future__ import annotations

import argparse
import enum
from collections.abc import Callable, Iterator
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any


class Role(enum.Enum):
    """What an option is to a run that resumes."""

    #: Fixes what a run trains, on what data, in which order, with which update rule: resuming with another
    #: value would silently continue a different run, so resuming refuses it.
    RUN_DEFINING = "run-defining"
    #: May change when a run resumes: applied from the resumed step on, and logged.
    CHANGEABLE = "changeable on resume"
    #: Where and how one command runs (devices, parallelism, the buffer's backend, the corpora's paths,
    #: whose contents the data fingerprint checks): each command's own, neither compared nor logged.
    RUN_TIME = "run-time"


RUN_DEFINING, CHANGEABLE, RUN_TIME = Role.RUN_DEFINING, Role.CHANGEABLE, Role.RUN_TIME

#: A check: None for a good value, else what the value must be ("a positive integer"), for the message
#: "--name must be a positive integer, got 0".
Check = Callable[[Any], "str | None"]


@dataclass(frozen=True)
class OptionSpec:
    """The metadata of one option (see :func:`option`)."""

    help: str
    role: Role
    type: Callable[[str], Any] | None
    check: Check | None
    choices: tuple | None
    metavar: str | None
    nargs: str | None
    flag: str | None
    unset_default: bool
    group: str | None


def option(default: Any = MISSING, *, help: str, role: Role, type: Callable[[str], Any] | None = None,
           check: Check | None = None, choices: tuple | None = None, metavar: str | None = None,
           nargs: str | None = None, flag: str | None = None, unset_default: bool = False,
           group: str | None = None) -> Any:
    """A config field that is also a command-line option ``--field-name``.

    ``type`` converts the command line's text (default: ``int``, ``float`` or ``str`` as the default's type;
    booleans are flags); ``check`` and ``choices`` say which values are valid, and are checked by the config
    itself, whoever builds it. ``flag`` is a switch's kind: ``"store_true"`` or ``"optional"``
    (``--x``/``--no-x``). ``unset_default``: the command line leaves the option None when it is not given, and
    the config or the command fills in a default that depends on other options (its help says which).
    ``group``: the title of the ``--help`` section it is listed in (default: its config's).
    """
    spec = OptionSpec(help=help, role=role, type=type, check=check, choices=choices, metavar=metavar, nargs=nargs,
                      flag=flag, unset_default=unset_default, group=group)
    return field(default=default, metadata={"option": spec})


def declared(config: type) -> Iterator[tuple[Field, OptionSpec]]:
    """The fields of ``config`` declared with :func:`option`, with their metadata."""
    for f in fields(config):
        if "option" in f.metadata:
            yield f, f.metadata["option"]


def flag_of(name: str) -> str:
    """The command-line flag of the option ``name``: ``--max-len`` for ``max_len``."""
    return "--" + name.replace("_", "-")


def options_with_role(role: Role, *configs: type) -> tuple[str, ...]:
    """The names of the options of ``configs`` that have ``role``, in declaration order."""
    return tuple(f.name for config in configs for f, spec in declared(config) if spec.role is role)


def check_options(config: Any) -> None:
    """Raise ValueError, naming the option, for the first field of ``config`` outside its choices or failing
    its check; None values are options not set, and not checked."""
    for f, spec in declared(type(config)):
        value = getattr(config, f.name)
        if value is None:
            continue
        if spec.choices is not None and value not in spec.choices:
            raise ValueError(f"{flag_of(f.name)} must be one of {', '.join(map(str, spec.choices))}, got {value!r}")
        if spec.check is not None and (needed := spec.check(value)) is not None:
            raise ValueError(f"{flag_of(f.name)} must be {needed}, got {value}")


def add_options(parser: argparse.ArgumentParser, config: type, title: str, skip: tuple[str, ...] = ()) -> None:
    """Add the options ``config`` declares, less ``skip``, to ``parser``, in the ``--help`` section of each
    option's group (default: ``title``). Defaults are the fields' own, so ``--help`` shows what a config built
    without the option holds; values are checked when the config is built (:func:`from_arguments`)."""
    for f, spec in declared(config):
        if f.name in skip:
            continue
        group = _group(parser, spec.group or title)
        kwargs: dict[str, Any] = {"dest": f.name, "help": spec.help}
        default = None if spec.unset_default or f.default is MISSING else f.default
        if spec.flag == "store_true":
            kwargs.update(action="store_true")
        elif spec.flag == "optional":
            kwargs.update(action=argparse.BooleanOptionalAction, default=default)
        else:
            kwargs.update(type=spec.type or _converter(f.default), default=default)
            for name in ("choices", "metavar", "nargs"):
                if getattr(spec, name) is not None:
                    kwargs[name] = getattr(spec, name)
        if f.default is MISSING and not spec.unset_default:
            kwargs["required"] = True
        group.add_argument(flag_of(f.name), **kwargs)


def from_arguments(config: type, args: argparse.Namespace, **given: Any) -> Any:
    """``config`` built from the parsed ``args`` that carry its options (one declared ``unset_default`` and left
    unset, None, takes the field's default) and from ``given``, which override them."""
    values = {f.name: getattr(args, f.name) for f, spec in declared(config) if hasattr(args, f.name)
              and not (spec.unset_default and getattr(args, f.name) is None)}
    return config(**{**values, **given})


def _group(parser: argparse.ArgumentParser, title: str) -> argparse._ArgumentGroup:
    """The ``--help`` section ``title`` of ``parser``, made on first use."""
    for group in parser._action_groups:
        if group.title == title:
            return group
    return parser.add_argument_group(title)


def _converter(default: Any) -> Callable[[str], Any]:
    """argparse's type for an option whose default is ``default``."""
    return type(default) if isinstance(default, (int, float)) and not isinstance(default, bool) else str


# Checks shared by the configs: each returns what a value must be, or None when it is.

def positive(value: Any) -> str | None:
    """Checks an integer >= 1."""
    return None if value >= 1 else "a positive integer"


def non_negative(value: Any) -> str | None:
    """Checks an integer >= 0."""
    return None if value >= 0 else "0 or more"


def positive_number(value: Any) -> str | None:
    """Checks a finite number > 0."""
    return None if 0 < value < float("inf") else "positive"


def non_negative_number(value: Any) -> str | None:
    """Checks a finite number >= 0."""
    return None if 0 <= value < float("inf") else ">= 0"


def share(value: Any) -> str | None:
    """Checks a fraction in [0, 1]."""
    return None if 0 <= value <= 1 else "between 0 and 1"


def probability_below_one(value: Any) -> str | None:
    """Checks a number in [0, 1)."""
    return None if 0 <= value < 1 else "in [0, 1)"


def strictly_between_0_and_1(value: Any) -> str | None:
    """Checks a number in (0, 1)."""
    return None if 0 < value < 1 else "in (0, 1)"

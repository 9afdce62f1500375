"""Every command's options, with their defaults, choices and arities, against the snapshot kept beside this test:
a change to how options are declared (one home per option, parsers generated from the configs) must leave what
users type and get the same. After a deliberate change of an option, write the snapshot again:

    python tests/revnmt/cli/test_options_snapshot.py --write
"""

import argparse
import json
import sys
from pathlib import Path
from unittest import mock

import pytest

from revnmt.arguments import default_device
from revnmt.cli import average, memory, prepare, train, translate

SNAPSHOT = Path(__file__).with_name("options_snapshot.json")
COMMANDS = {"revnmt-train": train.main, "revnmt-translate": translate.main, "revnmt-memory": memory.main,
            "revnmt-prepare": prepare.main, "revnmt-average": average.main}


class _Parsed(Exception):
    """Raised instead of parsing: the command's parser is built, nothing else has run."""


def _options(main) -> dict[str, dict]:
    """The options of the parser ``main`` builds, by their first flag (positionals by name)."""
    parsers: list[argparse.ArgumentParser] = []

    def capture(parser, *args, **kwargs):
        parsers.append(parser)
        raise _Parsed

    with mock.patch.object(argparse.ArgumentParser, "parse_args", capture):
        try:
            main([])
        except _Parsed:
            pass
    options = {}
    for action in parsers[0]._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        # the machine's: cuda where a GPU is present
        default = "DEVICE" if action.dest == "device" and action.default == default_device() else action.default
        options[(action.option_strings or [action.dest])[0]] = {
            "flags": action.option_strings, "dest": action.dest, "default": _plain(default),
            "choices": _plain(list(action.choices)) if action.choices is not None else None,
            "nargs": action.nargs, "required": action.required, "const": _plain(action.const),
            "kind": type(action).__name__}
    return options


def _plain(value):
    """``value`` as JSON holds it (tuples as lists)."""
    return json.loads(json.dumps(value, default=str))


def snapshot() -> dict[str, dict]:
    return {command: _options(main) for command, main in COMMANDS.items()}


@pytest.mark.parametrize("command", COMMANDS)
def test_the_options_are_those_of_the_snapshot(command):
    assert _options(COMMANDS[command]) == json.loads(SNAPSHOT.read_text())[command]


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:  # one line per option, so that a diff shows each change
    SNAPSHOT.write_text("{\n" + ",\n".join(
        f"{json.dumps(command)}: {{\n" + ",\n".join(f"  {json.dumps(flag)}: {json.dumps(option, sort_keys=True)}"
                                                   for flag, option in sorted(options.items())) + "\n}"
        for command, options in snapshot().items()) + "\n}\n")

"""``capd completion SHELL``: a completion script generated from the argument parser.

shtab writes the script from the parser itself, so every subcommand and option
(the operator table's rows included) completes without a list kept by hand.
Options whose value is a path complete file or folder names.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

SHELLS = ("bash", "zsh", "fish")

# Options by dest whose value is a path, completed as such by the shell.
_FILE_OPTIONS = frozenset({"config", "profile", "socket"})
_FOLDER_OPTIONS = frozenset({"dest"})


def _actions(parser: argparse.ArgumentParser) -> Iterator[argparse.Action]:
    for action in parser._actions:
        yield action
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _actions(sub)


def completion_script(parser: argparse.ArgumentParser, shell: str) -> str:
    """Return the completion script of ``parser`` for ``shell`` (one of :data:`SHELLS`)."""
    import shtab  # only this command needs it

    for action in _actions(parser):
        if action.dest in _FILE_OPTIONS:
            action.complete = shtab.FILE  # type: ignore[attr-defined]  # shtab reads it
        elif action.dest in _FOLDER_OPTIONS:
            action.complete = shtab.DIRECTORY  # type: ignore[attr-defined]  # shtab reads it
    script: str = shtab.complete(parser, shell)
    return script

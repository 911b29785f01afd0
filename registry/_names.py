"""What capability names and aliases look like, and how ``@`` marks one where it is looked up.

- A **name** is dot-namespaced and lower case: ``notes.append``, ``git_mcp.log``
  (:data:`NAME_PATTERN`).
- An **alias** is written the way seed packs write them: ``security-auditor``,
  ``code_review``, ``v2.tool``, ``notes.add`` — 1 to 64 characters of lower-case
  letters, digits, ``.``, ``_`` and ``-``, the first a letter or a digit
  (:data:`ALIAS_PATTERN`). Starting with a letter or a digit keeps an alias from
  being a path dot-segment (``.``, ``..``), a command-line option (``-x``) or a
  marked reference (``@x``).
- A **reference** is what a caller writes to name a capability: a name or an
  alias, optionally after :data:`ALIAS_MARK` (``@security-auditor``,
  ``@notes.append``); :func:`without_mark` takes the mark off. The mark is never
  part of a declared name or alias.

Whether an alias clashes with another capability is not a question of form: the
build answers it (``_build.py``), and :class:`Registry` refuses a clash too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

NAME_PATTERN = r"^[a-z][a-z0-9_-]*(\.[a-z][a-z0-9_-]*)+$"
ALIAS_MAX_LENGTH = 64
ALIAS_PATTERN = rf"^[a-z0-9][a-z0-9._-]{{0,{ALIAS_MAX_LENGTH - 1}}}$"
# Written before a name or an alias where one is looked up: ``@security-auditor``.
ALIAS_MARK = "@"

_NAME_RE = re.compile(NAME_PATTERN)
_ALIAS_RE = re.compile(ALIAS_PATTERN)
_ALIAS_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789._-")
_ALIAS_RULE = (f"an alias is 1 to {ALIAS_MAX_LENGTH} characters of lower-case letters, digits, "
               "'.', '_' and '-', starting with a letter or a digit (e.g. security-auditor)")


def is_valid_name(name: str) -> bool:
    """Whether ``name`` is a well-formed dot-namespaced capability name."""
    return _NAME_RE.fullmatch(name) is not None


def is_valid_alias(alias: str) -> bool:
    """Whether ``alias`` is a well-formed alias (:data:`ALIAS_PATTERN`)."""
    return _ALIAS_RE.fullmatch(alias) is not None


def alias_problem(alias: str) -> str | None:
    """What is wrong with ``alias``, one sentence naming it and the rule; None when well-formed."""
    if is_valid_alias(alias):
        return None
    if not alias:
        why = "is empty"
    elif len(alias) > ALIAS_MAX_LENGTH:
        why = f"is {len(alias)} characters long"
    elif alias.startswith(ALIAS_MARK):
        why = (f"starts with {ALIAS_MARK!r}, which only marks an alias where one is looked "
               f"up: declare it as {without_mark(alias)!r}")
    elif set(alias) <= _ALIAS_CHARS:  # then only the first character can be wrong
        why = f"starts with {alias[0]!r}"
    else:
        bad = sorted({c for c in alias if c not in _ALIAS_CHARS})
        why = f"holds {', '.join(repr(c) for c in bad)}"
    return f"alias {alias!r} {why}; {_ALIAS_RULE}"


def without_mark(reference: str) -> str:
    """``reference`` without its leading :data:`ALIAS_MARK`: ``@code_review`` → ``code_review``.

    Anything else comes back as it is; only one mark is taken off.
    """
    return reference[len(ALIAS_MARK):] if reference.startswith(ALIAS_MARK) else reference


def is_valid_reference(reference: str) -> bool:
    """Whether ``reference`` may name a capability: a name or an alias, with or without ``@``."""
    bare = without_mark(reference)
    return is_valid_alias(bare) or is_valid_name(bare)


def close_hint(name: str, known: Iterable[str], cutoff: float = 0.6) -> str:
    """`` (did you mean 'x'?)`` for the known name closest to ``name``, if any is close."""
    import difflib  # only when a name was not found

    close = difflib.get_close_matches(name, list(known), n=1, cutoff=cutoff)
    return f" (did you mean {close[0]!r}?)" if close else ""

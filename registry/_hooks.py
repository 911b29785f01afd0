"""Hook markers: functions that run before or after the calls of matching capabilities.

``@before_call("notes.*")`` and ``@after_call()`` only *mark* a function, the
way ``@op`` does: they attach a frozen :class:`HookSpec` to it and register
nothing. A build scans the plugin modules for marked functions
(:meth:`OpTable.add_module`) and hands them to the :class:`Registry` it
builds, keyed by :attr:`HookSpec.name`; a reload imports the modules again, so
every build has its own hooks.

The dispatcher calls a before-hook as ``hook(capability, params, caller)`` and
an after-hook as ``hook(capability, params, caller, result)``; either may be a
coroutine function or a plain one. This module only marks and describes them.
"""

from __future__ import annotations

import fnmatch
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

HookKind = Literal["before", "after"]

HOOKS_ATTR = "__capd_hooks__"

# The arguments each kind is called with, for the signature check and its message.
_ARGUMENTS: dict[HookKind, tuple[str, ...]] = {
    "before": ("capability", "params", "caller"),
    "after": ("capability", "params", "caller", "result"),
}


@dataclass(frozen=True)
class HookSpec:
    """A function marked to run before or after the calls of the capabilities it matches.

    ``name`` is its key in :attr:`Registry.hooks`: the ``name=`` given to the
    marker, else ``"<module>:<qualified function name>"``. ``pattern`` is a
    glob (:mod:`fnmatch`, case-sensitive) matched against canonical capability
    names; ``"*"`` matches every capability.

    Raises :class:`ValueError` when ``name`` or ``pattern`` is empty or
    ``kind`` is neither ``"before"`` nor ``"after"``.
    """

    name: str
    kind: HookKind
    pattern: str
    func: Callable[..., Any]

    def __post_init__(self) -> None:
        if self.kind not in _ARGUMENTS:
            raise ValueError(f"hook kind must be 'before' or 'after', not {self.kind!r}")
        _check("name", self.name, f"{self.kind}_call")
        _check("pattern", self.pattern, f"{self.kind}_call")

    def matches(self, capability_name: str) -> bool:
        """Whether this hook applies to the capability called ``capability_name``."""
        return fnmatch.fnmatchcase(capability_name, self.pattern)

    @property
    def source(self) -> str:
        """Where the function is defined, as ``module:qualified_name``."""
        return where(self.func)


def before_call(pattern: str = "*", *, name: str | None = None) -> Callable[[F], F]:
    """Mark a function to run before every call of a capability matching ``pattern``.

    It is called as ``hook(capability, params, caller)`` and may be async.
    Raises :class:`ValueError` at once for an empty ``pattern`` or ``name``,
    and :class:`TypeError` when the marked function cannot take those three
    arguments or the marker is used without parentheses.
    """
    return _marker("before", pattern, name)


def after_call(pattern: str = "*", *, name: str | None = None) -> Callable[[F], F]:
    """Mark a function to run after every call of a capability matching ``pattern``.

    It is called as ``hook(capability, params, caller, result)`` and may be
    async. Raises like :func:`before_call`.
    """
    return _marker("after", pattern, name)


def hooks_of(value: object) -> tuple[HookSpec, ...]:
    """Return the hook specs marked on ``value`` (none for anything unmarked)."""
    specs = getattr(value, HOOKS_ATTR, ())
    if not isinstance(specs, tuple):
        return ()
    return tuple(s for s in specs if isinstance(s, HookSpec))


def where(func: Callable[..., Any]) -> str:
    """Return ``module:qualified_name`` of ``func``, the label errors and default keys use."""
    return f"{getattr(func, '__module__', '?')}:{getattr(func, '__qualname__', '?')}"


def _marker(kind: HookKind, pattern: str, name: str | None) -> Callable[[F], F]:
    marker = f"{kind}_call"
    if callable(pattern) and not isinstance(pattern, str):
        raise TypeError(f"use @{marker}() or @{marker}('<pattern>'), with parentheses")
    _check("pattern", pattern, marker)
    if name is not None:
        _check("name", name, marker)

    def mark(func: F) -> F:
        _check_signature(func, kind)
        spec = HookSpec(name if name is not None else where(func), kind, pattern, func)
        # Markers stack (one function may be a before- and an after-hook): keep them all.
        setattr(func, HOOKS_ATTR, (*hooks_of(func), spec))
        return func

    return mark


_EMPTY = {"pattern": "must be a non-empty glob over capability names, such as 'notes.*' or "
          "'*' for every capability",
          "name": "must not be empty; leave it out to use module:function"}


def _check(what: Literal["pattern", "name"], value: object, marker: str) -> None:
    """Raise TypeError unless ``value`` (the marker's ``what``) is a string, ValueError if
    it is blank."""
    if not isinstance(value, str):
        raise TypeError(f"{marker}: {what} must be a string, not {type(value).__name__}")
    if not value.strip():
        raise ValueError(f"{marker}: {what} {_EMPTY[what]}")


def _check_signature(func: Callable[..., Any], kind: HookKind) -> None:
    arguments = _ARGUMENTS[kind]
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):  # a builtin without a signature: let the call decide
        return
    try:
        signature.bind(*arguments)
    except TypeError as exc:
        raise TypeError(
            f"{kind}_call hook {where(func)} must accept ({', '.join(arguments)}) "
            f"as positional arguments: {exc}"
        ) from exc

"""Error routes: which capabilities to try when a call fails with a given error type.

A capability declares them as ``[[capability.on_error]]`` tables::

    [[capability.on_error]]
    error_type = "timeout"     # the ToolResult's error_type, or "*" for any
    try = ["web.fetch_alt", "web.snippet", "@web-cache"]   # names or aliases, "@" or not

What one capability's routes must satisfy on their own (a non-empty chain, no
name twice, not the capability itself, one route per error type) is checked
by the model; whether every name is a capability can only be told once every
declaration is loaded, by :func:`resolve_routes` during the build. The build
then keeps in each chain only the capabilities it offers
(:func:`offered_routes`), so every name in a built registry's routes can be
looked up in it.
"""

from __future__ import annotations

import re
from collections.abc import Container, Iterable, Mapping

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ._names import close_hint, without_mark

ANY_ERROR = "*"
# An error type as a ToolResult carries it: ``timeout``, ``capability_disabled``,
# ``ToolUnavailable``, an exception class name (dotted or not), or ``*`` for any.
ERROR_TYPE_PATTERN = r"^(\*|[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*)$"
_ERROR_TYPE_RE = re.compile(ERROR_TYPE_PATTERN)


class ErrorRoute(BaseModel):
    """The capabilities to try, in order, when a call fails with ``error_type``.

    ``try_`` is spelt ``try`` in TOML and in dumps; Python code may use either.
    """

    model_config = ConfigDict(
        frozen=True, extra="forbid", validate_by_alias=True, validate_by_name=True,
        serialize_by_alias=True,
    )

    error_type: str = Field(description="The error_type this route answers, or '*' for any.")
    try_: tuple[str, ...] = Field(
        alias="try", description="Capabilities (names or aliases) to try, in order."
    )

    @field_validator("error_type")
    @classmethod
    def _an_error_type(cls, value: str) -> str:
        if not _ERROR_TYPE_RE.match(value):
            raise ValueError(f"{value!r} is not an error type: use '*' for any error, or a "
                             "name such as 'timeout', 'capability_disabled' or 'ConnectionError'")
        return value

    @field_validator("try_")
    @classmethod
    def _a_chain(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise ValueError("must name at least one capability to try")
        twice = sorted({name for name in value if value.count(name) > 1})
        if twice:
            raise ValueError(f"names {', '.join(repr(n) for n in twice)} twice")
        return value


def check_routes(routes: Iterable[ErrorRoute], own_names: Iterable[str]) -> None:
    """Raise :class:`ValueError` when ``routes`` name one of ``own_names`` or repeat an error type.

    ``own_names`` are the capability's name and aliases: a capability is no
    fallback of itself, whether a route writes it with ``@`` or not.
    """
    own = set(own_names)
    seen: set[str] = set()
    for route in routes:
        itself = [name for name in route.try_ if without_mark(name) in own]
        if itself:
            raise ValueError(f"the route for error_type {route.error_type!r} names the "
                             f"capability itself ({', '.join(repr(n) for n in itself)}); a "
                             "fallback must be another capability")
        if route.error_type in seen:
            raise ValueError(f"error_type {route.error_type!r} has more than one route; merge "
                             "their 'try' lists")
        seen.add(route.error_type)


def resolve_routes(
    name: str, routes: tuple[ErrorRoute, ...], known: Mapping[str, str]
) -> tuple[tuple[ErrorRoute, ...], list[str]]:
    """Resolve every name in ``routes`` of capability ``name`` through ``known``.

    ``known`` maps every declared capability name and alias to its canonical
    name; a route may write either with a leading ``@``. Returns the routes
    with canonical names, and what is wrong with them, one phrase each (with a
    suggestion when a close name exists); the routes are only meaningful when
    that list is empty.
    """
    problems: list[str] = []
    resolved: list[ErrorRoute] = []
    for route in routes:
        chain: dict[str, str] = {}  # canonical -> as written
        for target in route.try_:
            canonical = known.get(without_mark(target))
            where = f"{target!r} (error_type {route.error_type!r})"
            if canonical is None:
                hint = close_hint(without_mark(target), known)
                problems.append(f"{where} is not a capability{hint}")
            elif canonical == name:
                problems.append(f"{where} names the capability itself")
            elif canonical in chain:
                problems.append(f"{where} and {chain[canonical]!r} both name {canonical!r}")
            else:
                chain[canonical] = target
        resolved.append(route.model_copy(update={"try_": tuple(chain)}))
    return tuple(resolved), problems


def offered_routes(
    routes: tuple[ErrorRoute, ...], offered: Container[str]
) -> tuple[ErrorRoute, ...]:
    """Return ``routes`` with every name not in ``offered`` left out of its chain.

    A chain may end up empty (every capability it names is missing on this
    host, or was refused): the route stays, so that its error type answers
    "nothing to try" rather than falling through to the ``"*"`` route.
    """
    kept: list[ErrorRoute] = []
    for route in routes:
        chain = tuple(name for name in route.try_ if name in offered)
        kept.append(route if chain == route.try_ else route.model_copy(update={"try_": chain}))
    return tuple(kept)

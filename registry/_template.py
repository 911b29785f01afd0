"""Safe ``{name}`` templates for tool specs and effect specs.

Only plain identifiers may stand between braces: no attribute access, no
indexing, no conversions, no format specs. ``{{`` and ``}}`` are literal braces.
"""

from __future__ import annotations

import string
from collections.abc import Iterable, Mapping
from typing import Any

_FORMATTER = string.Formatter()


class TemplateError(ValueError):
    """A template is malformed or names an unsafe placeholder."""


def placeholders(template: str) -> list[str]:
    """Return the placeholder names in ``template``, in order.

    Raises :class:`TemplateError` for malformed braces or unsafe placeholders.
    """
    try:
        parsed = list(_FORMATTER.parse(template))
    except ValueError as exc:
        raise TemplateError(f"malformed template {template!r}: {exc}") from exc
    names: list[str] = []
    for _literal, field, spec, conversion in parsed:
        if field is None:
            continue
        if not field.isidentifier() or spec or conversion:
            raise TemplateError(
                f"placeholder {{{field}}} in {template!r} is not a plain name; "
                "use {name} with letters, digits and underscores only"
            )
        names.append(field)
    return names


def render(template: str, values: Mapping[str, Any]) -> str:
    """Substitute ``values`` into ``template``; a missing name raises :class:`TemplateError`."""
    out: list[str] = []
    for literal, field, _spec, _conversion in _FORMATTER.parse(template):
        out.append(literal)
        if field is None:
            continue
        if field not in values:
            raise TemplateError(f"no value for placeholder {{{field}}} in {template!r}")
        out.append(str(values[field]))
    return "".join(out)


def check_known(template: str, known: Iterable[str]) -> list[str]:
    """Return the placeholders of ``template`` that are not in ``known``."""
    allowed = set(known)
    return [name for name in placeholders(template) if name not in allowed]

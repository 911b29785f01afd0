"""Resource templates are matched as RFC 6570 templates, the most specific first."""

from __future__ import annotations

import pytest

from capd.sidecar.server._offer_handlers import _specificity, _template_pattern


@pytest.mark.parametrize(("template", "uri", "matches"), [
    ("memo://notes/{name}", "memo://notes/a", True),
    ("memo://notes/{name}", "memo://notes/private/payroll", False),  # one segment
    ("memo://notes/{name}", "memo://notes/a?x=1", False),
    ("memo://notes/{+path}", "memo://notes/private/payroll", True),
    ("file:///{+path}", "file:///etc/passwd", True),
    ("memo://notes{/a,b}", "memo://notes/x/y", True),
    ("memo://search{?q,lang}", "memo://search?q=x&lang=en", True),
    ("memo://search{?q}", "memo://searchers", False),
    ("memo://n.{x}", "memo://nax", False),  # literal text is literal, not a regex
    ("memo://static", "memo://static", True),
    ("x://{a}-{b}-{c}", "x://2024-01-05", True),
    ("x://{a}-{b}", "x://x-y-z", True),  # the last value may hold the separator
    ("x://{a}-end", "x://x-y-end", False),  # a middle one may not: fails closed (hidden)
    ("x://{/a}{/b}{/c}", "x://" + "/a" * 505, True),  # adjacent repeats: one way to split
])
def test_a_template_makes_the_uris_its_expressions_allow(template: str, uri: str,
                                                          matches: bool) -> None:
    """Each operator expands to what RFC 6570 lets it hold; literals match themselves."""
    assert bool(_template_pattern(template).fullmatch(uri)) is matches


def test_a_template_with_more_literal_text_is_more_specific() -> None:
    """memo://notes/private/{name} is more specific than memo://notes/{+path}."""
    assert _specificity("memo://notes/private/{name}") > _specificity("memo://notes/{+path}")
    assert _specificity("a/{x}") > _specificity("a/{x}{y}")

"""Error routes: per-error-type fallback chains and auto_fallback, declared and checked at load."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError

from capd.registry import (
    BuildConfig,
    Capability,
    ErrorRoute,
    Registry,
    build,
)

PLUGIN = '''
from pydantic import BaseModel
from capd.registry import capability, op

class Fetch(BaseModel):
    url: str = "http://example.invalid/"

@op("web.get")
async def get(params: Fetch) -> str:
    return params.url

@capability("web.cached", summary="Fetch from the cache.", auto_fallback=True,
            on_error=[{"error_type": "*", "try": ["web.fetch"]}])
async def cached(params: Fetch) -> str:
    return params.url
'''

FETCH = """
[[capability]]
name = "web.fetch"
op = "web.get"
summary = "Fetch a page."
aliases = ["web.download"]
auto_fallback = true

[[capability.on_error]]
error_type = "timeout"
try = ["web.fetch_alt", "web.snippet"]

[[capability.on_error]]
error_type = "*"
try = ["web.snippet"]
"""

OTHERS = """
[[capability]]
name = "web.fetch_alt"
op = "web.get"
summary = "Fetch a page another way."
aliases = ["web.mirror"]

[[capability]]
name = "web.snippet"
op = "web.get"
summary = "A search engine's snippet of a page."
"""


async def build_decls(
    tmp_path: Path, plugin_dir: Callable[[str, str], Path], module: str, **files: str
) -> Registry:
    """Build ``module`` and the declaration files ``files`` (name → TOML) the normal way."""
    plugin_dir(module, PLUGIN)
    folder = tmp_path / "capabilities"
    folder.mkdir()
    for name, text in files.items():
        (folder / f"{name}.toml").write_text(textwrap.dedent(text), encoding="utf-8")
    return await build(BuildConfig(plugins=(module,), declarations=(folder,),
                                   entry_points=False, label_root=folder))


def errors(registry: Registry) -> list[str]:
    return [str(e) for e in registry.snapshot().errors]


def fetch_with(routes: str, *, extra: str = "") -> str:
    """The web.fetch declaration with its routes replaced by ``routes``."""
    head = FETCH.split("[[capability.on_error]]")[0]
    return head + extra + routes


# ------------------------------------------------------------------ parsing


async def test_routes_and_auto_fallback_are_read_from_toml(
    tmp_path: Path, plugin_dir: Callable[[str, str], Path]
) -> None:
    """[[capability.on_error]] tables become ErrorRoutes in order; auto_fallback is kept."""
    registry = await build_decls(tmp_path, plugin_dir, "routes_plugin_a", fetch=FETCH,
                                 others=OTHERS)
    assert errors(registry) == []
    cap = registry.get("web.fetch")
    assert cap.auto_fallback is True
    assert cap.on_error == (
        ErrorRoute(error_type="timeout", try_=("web.fetch_alt", "web.snippet")),
        ErrorRoute(error_type="*", try_=("web.snippet",)),
    )
    assert registry.get("web.snippet").on_error == ()
    assert registry.get("web.snippet").auto_fallback is False


async def test_a_code_capability_declares_routes_through_its_marker(
    tmp_path: Path, plugin_dir: Callable[[str, str], Path]
) -> None:
    """@capability(on_error=..., auto_fallback=...) is checked and resolved like TOML."""
    registry = await build_decls(tmp_path, plugin_dir, "routes_plugin_b", fetch=FETCH,
                                 others=OTHERS)
    cap = registry.get("web.cached")
    assert cap.auto_fallback is True
    assert cap.fallbacks_for("anything") == ("web.fetch",)


def test_an_error_route_is_spelt_try_in_toml_and_dumps() -> None:
    """The alias 'try' validates and serialises; Python code may say try_."""
    route = ErrorRoute.model_validate({"error_type": "timeout", "try": ["a.b"]})
    assert route == ErrorRoute(error_type="timeout", try_=("a.b",))
    assert route.model_dump() == {"error_type": "timeout", "try": ("a.b",)}
    with pytest.raises(ValidationError, match="tries"):
        ErrorRoute.model_validate({"error_type": "timeout", "try": ["a.b"], "tries": 1})


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"error_type": "timeout", "try": []}, "must name at least one capability to try"),
        ({"error_type": "timeout", "try": ["a.b", "a.b"]}, "names 'a.b' twice"),
        ({"error_type": "time out", "try": ["a.b"]}, "'time out' is not an error type"),
        ({"error_type": "", "try": ["a.b"]}, "'' is not an error type"),
        ({"error_type": "timeout"}, "try\n  Field required"),
    ],
)
def test_a_malformed_route_is_refused(raw: dict[str, object], expected: str) -> None:
    """An empty or repeating chain and an error type that is no name are validation errors."""
    with pytest.raises(ValidationError, match=expected):
        ErrorRoute.model_validate(raw)


# ------------------------------------------------------------ fallbacks_for


def make_capability(*routes: ErrorRoute) -> Capability:
    class Params(BaseModel):
        pass

    async def run(params: Params) -> None:
        return None

    return Capability(name="web.fetch", summary="Fetch.", parameters=Params, func=run,
                      on_error=routes)


def test_fallbacks_for_prefers_the_exact_error_type_then_star() -> None:
    """The route for exactly the error type wins, even when '*' is declared first."""
    cap = make_capability(
        ErrorRoute(error_type="*", try_=("web.any",)),
        ErrorRoute(error_type="timeout", try_=("web.alt", "web.snippet")),
        ErrorRoute(error_type="ConnectionError", try_=("web.mirror",)),
    )
    assert cap.fallbacks_for("timeout") == ("web.alt", "web.snippet")
    assert cap.fallbacks_for("ConnectionError") == ("web.mirror",)
    assert cap.fallbacks_for("capability_disabled") == ("web.any",)
    assert cap.fallbacks_for("Timeout") == ("web.any",)


def test_fallbacks_for_is_empty_without_a_matching_route() -> None:
    """No route for the error type and no '*' route: nothing to try."""
    cap = make_capability(ErrorRoute(error_type="timeout", try_=("web.alt",)))
    assert cap.fallbacks_for("ToolUnavailable") == ()
    assert make_capability().fallbacks_for("timeout") == ()


# ------------------------------------------------------------ load-time rules


async def test_auto_fallback_on_a_mutating_capability_is_an_error(
    tmp_path: Path, plugin_dir: Callable[[str, str], Path]
) -> None:
    """A capability that writes may not fall back unasked; it is left out, the rest loads."""
    registry = await build_decls(
        tmp_path, plugin_dir, "routes_plugin_c", others=OTHERS,
        fetch=fetch_with("", extra="mutates_state = true\n"))
    assert errors(registry) == [
        "fetch.toml: web.fetch: auto_fallback: Value error, auto_fallback = true is only for a "
        "capability that does not mutate state (a write must never be retried elsewhere "
        "unasked); set auto_fallback = false"
    ]
    assert "web.fetch" not in registry
    assert "web.snippet" in registry
    # web.cached falls back to the refused web.fetch: no second error, an empty chain.
    assert registry.get("web.cached").fallbacks_for("timeout") == ()


async def test_a_mutating_capability_may_declare_routes_without_auto_fallback(
    tmp_path: Path, plugin_dir: Callable[[str, str], Path]
) -> None:
    """Routes on a writing capability only suggest alternatives; that is allowed."""
    fetch = FETCH.replace("auto_fallback = true\n", "mutates_state = true\n")
    registry = await build_decls(tmp_path, plugin_dir, "routes_plugin_d", fetch=fetch,
                                 others=OTHERS)
    assert errors(registry) == []
    assert registry.get("web.fetch").fallbacks_for("timeout") == ("web.fetch_alt", "web.snippet")


async def test_an_unknown_name_in_a_chain_is_an_error_with_a_suggestion(
    tmp_path: Path, plugin_dir: Callable[[str, str], Path]
) -> None:
    """A misspelt fallback names the capability, the error type and the close name."""
    fetch = FETCH.replace('try = ["web.fetch_alt", "web.snippet"]',
                          'try = ["web.fetch_atl", "web.snippet", "zzz.nothing"]')
    registry = await build_decls(tmp_path, plugin_dir, "routes_plugin_e", fetch=fetch,
                                 others=OTHERS)
    assert errors(registry) == [
        "fetch.toml: web.fetch: on_error: 'web.fetch_atl' (error_type 'timeout') is not a "
        "capability (did you mean 'web.fetch_alt'?); 'zzz.nothing' (error_type 'timeout') is "
        "not a capability"
    ]
    assert "web.fetch" not in registry
    assert "web.fetch_alt" in registry
    assert "web.cached" in registry


async def test_names_are_checked_after_every_file_is_loaded(
    tmp_path: Path, plugin_dir: Callable[[str, str], Path]
) -> None:
    """A chain may name a capability declared in a later file, or in code."""
    registry = await build_decls(tmp_path, plugin_dir, "routes_plugin_f", a_fetch=FETCH,
                                 z_others=OTHERS)
    assert errors(registry) == []
    assert registry.get("web.fetch").fallbacks_for("timeout") == ("web.fetch_alt", "web.snippet")


async def test_an_alias_in_a_chain_counts_and_resolves_to_its_capability(
    tmp_path: Path, plugin_dir: Callable[[str, str], Path]
) -> None:
    """try may use an alias; the built chain holds the canonical name."""
    fetch = FETCH.replace('try = ["web.fetch_alt", "web.snippet"]',
                          'try = ["web.mirror", "web.snippet"]')
    registry = await build_decls(tmp_path, plugin_dir, "routes_plugin_g", fetch=fetch,
                                 others=OTHERS)
    assert errors(registry) == []
    assert registry.get("web.fetch").fallbacks_for("timeout") == ("web.fetch_alt", "web.snippet")


async def test_an_alias_and_its_capability_in_one_chain_is_an_error(
    tmp_path: Path, plugin_dir: Callable[[str, str], Path]
) -> None:
    """Two names of one capability in a chain would try it twice."""
    fetch = FETCH.replace('try = ["web.fetch_alt", "web.snippet"]',
                          'try = ["web.fetch_alt", "web.mirror"]')
    registry = await build_decls(tmp_path, plugin_dir, "routes_plugin_h", fetch=fetch,
                                 others=OTHERS)
    assert errors(registry) == [
        "fetch.toml: web.fetch: on_error: 'web.mirror' (error_type 'timeout') and "
        "'web.fetch_alt' both name 'web.fetch_alt'"
    ]
    assert "web.fetch" not in registry


@pytest.mark.parametrize("itself", ["web.fetch", "web.download"])
async def test_a_chain_naming_the_capability_itself_is_an_error(
    tmp_path: Path, plugin_dir: Callable[[str, str], Path], itself: str
) -> None:
    """Neither the capability's name nor one of its aliases may be its own fallback."""
    fetch = FETCH.replace('try = ["web.snippet"]', f'try = ["web.snippet", "{itself}"]')
    registry = await build_decls(tmp_path, plugin_dir, "routes_plugin_i", fetch=fetch,
                                 others=OTHERS)
    assert errors(registry) == [
        "fetch.toml: web.fetch: on_error: Value error, the route for error_type '*' names the "
        f"capability itself ('{itself}'); a fallback must be another capability"
    ]
    assert "web.fetch" not in registry
    assert "web.snippet" in registry


async def test_two_routes_for_one_error_type_are_an_error(
    tmp_path: Path, plugin_dir: Callable[[str, str], Path]
) -> None:
    """Duplicate error_type routes in one capability are refused, naming the error type."""
    fetch = FETCH.replace('error_type = "*"', 'error_type = "timeout"')
    registry = await build_decls(tmp_path, plugin_dir, "routes_plugin_j", fetch=fetch,
                                 others=OTHERS)
    assert errors(registry) == [
        "fetch.toml: web.fetch: on_error: Value error, error_type 'timeout' has more than one "
        "route; merge their 'try' lists"
    ]
    assert "web.fetch" not in registry


@pytest.mark.parametrize(
    ("routes", "expected"),
    [
        ('[[capability.on_error]]\nerror_type = "timeout"\ntry = []\n',
         "on_error.0.try: Value error, must name at least one capability to try"),
        ('[[capability.on_error]]\nerror_type = "timeout"\n', "on_error.0.try: Field required"),
        ('[[capability.on_error]]\nerror_type = "timeout"\ntry = ["web.snippet"]\nwhen = 1\n',
         "on_error.0.when: unknown field"),
        ('on_error = { error_type = "timeout", try = ["web.snippet"] }\n',
         "on_error: Input should be a valid tuple"),
    ],
)
async def test_a_malformed_route_in_toml_names_the_file_capability_and_field(
    tmp_path: Path, plugin_dir: Callable[[str, str], Path], routes: str, expected: str
) -> None:
    """A route the model refuses is one declaration error; the other capabilities load."""
    registry = await build_decls(tmp_path, plugin_dir, "routes_plugin_k",
                                 fetch=fetch_with(routes), others=OTHERS)
    (error,) = errors(registry)
    assert error.startswith("fetch.toml: web.fetch: ")
    assert expected in error
    assert "web.snippet" in registry


async def test_a_chain_keeps_only_what_this_build_offers(
    tmp_path: Path, plugin_dir: Callable[[str, str], Path]
) -> None:
    """A declared fallback left out here (another OS) is dropped from chains, not an error."""
    others = OTHERS.replace('summary = "Fetch a page another way."',
                            'summary = "Fetch a page another way."\nhost = { os = ["plan9"] }')
    fetch = FETCH.replace('try = ["web.snippet"]', 'try = ["web.fetch_alt"]')
    registry = await build_decls(tmp_path, plugin_dir, "routes_plugin_l", fetch=fetch,
                                 others=others)
    assert errors(registry) == []
    assert "web.fetch_alt" in registry.not_on_host
    cap = registry.get("web.fetch")
    assert cap.fallbacks_for("timeout") == ("web.snippet",)
    # The '*' route named only the missing one: nothing to try, rather than another route.
    assert cap.fallbacks_for("ToolUnavailable") == ()

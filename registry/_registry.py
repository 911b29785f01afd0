"""The Registry: live and disabled capabilities, owned by whoever built it.

There is no module-level registry. A build returns a :class:`Registry`; the
daemon holds one and swaps it whole on reload. Between reloads, the recovery
layer moves capabilities between live and disabled *in place* through
:meth:`Registry.record_probe` and :meth:`Registry.mark_tool_down`.

Every lookup by name also takes one of the capability's ``aliases``, and either
written with a leading ``@`` (``@security-auditor``, ``@notes.append``); what it
returns is the capability itself, so results and logs carry the canonical name.

:attr:`Registry.hooks` holds the before- and after-call hooks of the same
build: they are swapped with it on reload, never shared between builds.
"""

from __future__ import annotations

import difflib
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING

from ._errors import DeclarationError, UnknownCapability
from ._hooks import HookSpec
from ._model import Capability, ProbeResult, ToolSpec
from ._names import ALIAS_MARK, without_mark
from ._ops import OpTable

if TYPE_CHECKING:  # the search stack (numpy, the embedding model) loads at first use
    from ._search import SearchIndex


@dataclass(frozen=True)
class DisabledEntry:
    """A capability kept whole, with the tools it misses and why."""

    capability: Capability
    missing: tuple[str, ...]
    errors: Mapping[str, str]
    since: float


@dataclass(frozen=True)
class RegistrySnapshot:
    """An immutable view of a registry at one moment."""

    live: Mapping[str, Capability]
    disabled: Mapping[str, DisabledEntry]
    tools: Mapping[str, ToolSpec]
    probes: Mapping[str, ProbeResult]
    errors: tuple[DeclarationError, ...]
    built_at: float

    @property
    def counts(self) -> dict[str, int]:
        """Live, disabled and declaration-error counts."""
        return {"live": len(self.live), "disabled": len(self.disabled), "errors": len(self.errors)}


class Registry:
    """Capabilities partitioned into live and disabled by their tools' probe results.

    Lookups are O(1). Not thread-safe: it belongs to one event loop.
    """

    def __init__(
        self, capabilities: Iterable[Capability], tools: Mapping[str, ToolSpec],
        probes: Mapping[str, ProbeResult], *, errors: Iterable[DeclarationError] = (),
        ops: OpTable | None = None, hooks: Mapping[str, HookSpec] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """Place ``capabilities`` by ``probes``; ``hooks`` default to those ``ops`` collected.

        Raises :class:`ValueError` for a duplicate name or a clashing alias
        (a build reports those as declaration errors before they get here).
        """
        self._clock = clock
        self._all: dict[str, Capability] = {}
        # alias -> canonical name; a build refuses clashing aliases before they get here.
        self._aliases: dict[str, str] = {}
        self._live: dict[str, Capability] = {}
        self._disabled: dict[str, DisabledEntry] = {}
        self._tools = dict(tools)
        self._probes = dict(probes)
        self._errors = tuple(errors)
        self._by_tool: dict[str, set[str]] = {}
        self.ops = ops or OpTable()
        # Hooks by key (HookSpec.name), in the order the plugin scan found them.
        self.hooks: Mapping[str, HookSpec] = MappingProxyType(
            dict(self.ops.hooks if hooks is None else hooks))
        self.built_at = clock()
        self._index: SearchIndex | None = None
        self._search_cache: Path | None = None
        # Capabilities left out because this host lacks what they need: name -> why.
        self.not_on_host: dict[str, str] = {}
        # Which of those an upstream left out, by source (replaced with its capabilities).
        self._left_out_by: dict[str, frozenset[str]] = {}
        for cap in capabilities:
            if cap.name in self._all:
                raise ValueError(f"duplicate capability {cap.name!r}")
            self._all[cap.name] = cap
            for alias in cap.aliases:
                if alias in self._aliases and self._aliases[alias] != cap.name:
                    raise ValueError(f"alias {alias!r} of {cap.name!r} is already an alias of "
                                     f"{self._aliases[alias]!r}")
                self._aliases[alias] = cap.name
            for tool in cap.requires:
                self._by_tool.setdefault(tool, set()).add(cap.name)
            self._place(cap)
        for alias, owner in self._aliases.items():
            if alias in self._all and alias != owner:
                raise ValueError(f"alias {alias!r} of {owner!r} is the name of another capability")

    # ----------------------------------------------------------------- lookups

    def resolve(self, name: str) -> str:
        """Return the canonical name of ``name`` (itself, or the capability it is an alias of).

        ``@name`` and ``@alias`` resolve as ``name`` and ``alias`` do. Raises
        :class:`UnknownCapability` naming what was asked, with close names and
        aliases (unmarked) as suggestions.
        """
        if name in self._all:  # what dispatch passes almost every time: no second call
            return name
        canonical = self._canonical(name)
        if canonical is not None:
            return canonical
        known = [*self._all, *self._aliases]
        raise UnknownCapability(name, difflib.get_close_matches(without_mark(name), known, n=3,
                                                                cutoff=0.6))

    def suggest(self, name: str, allowed: Callable[[Capability], bool]) -> list[str]:
        """Names and aliases close to ``name`` among the capabilities ``allowed`` takes in
        (what a caller that may see only those is told it might have meant)."""
        known = [n for n, cap in self._all.items() if allowed(cap)]
        known += [a for a, owner in self._aliases.items() if allowed(self._all[owner])]
        return difflib.get_close_matches(without_mark(name), known, n=3, cutoff=0.6)

    def _canonical(self, name: str) -> str | None:
        """The canonical name ``name`` stands for (name, alias, ``@`` or not), or None."""
        if name in self._all:
            return name
        canonical = self._aliases.get(name)
        if canonical is None and name.startswith(ALIAS_MARK):
            bare = without_mark(name)
            canonical = bare if bare in self._all else self._aliases.get(bare)
        return canonical

    def get(self, name: str) -> Capability:
        """Return the capability ``name`` (or aliased ``name``, ``@`` or not), live or disabled.

        Raises :class:`UnknownCapability`.
        """
        return self._all[self.resolve(name)]

    def is_live(self, name: str) -> bool:
        """Whether ``name`` (or the capability it aliases) is live; False for disabled.

        Raises :class:`UnknownCapability`.
        """
        return self.resolve(name) in self._live

    def disabled_entry(self, name: str) -> DisabledEntry | None:
        """Return the disabled entry of ``name`` (or the capability it aliases); None when live.

        Raises :class:`UnknownCapability`.
        """
        return self._disabled.get(self.resolve(name))

    def tool_spec(self, tool: str) -> ToolSpec:
        """Return the spec of ``tool``; raise KeyError when it is not declared."""
        return self._tools[tool]

    def live_view(self) -> Mapping[str, Capability]:
        """A read-only view of the live map that follows later changes (no copy)."""
        return MappingProxyType(self._live)

    def tool_ids(self) -> frozenset[str]:
        """Every declared tool."""
        return frozenset(self._tools)

    def has_tool(self, tool: str) -> bool:
        """Whether ``tool`` is declared in this registry."""
        return tool in self._tools

    def probe_result(self, tool: str) -> ProbeResult | None:
        """Return the last probe result of ``tool``, if it was ever probed."""
        return self._probes.get(tool)

    def disabled_tools(self) -> frozenset[str]:
        """Return every tool some disabled capability misses."""
        return frozenset(t for entry in self._disabled.values() for t in entry.missing)

    def __contains__(self, name: object) -> bool:
        """Whether ``name`` is a capability's name or one of its aliases (``@`` or not)."""
        return isinstance(name, str) and self._canonical(name) is not None

    def __len__(self) -> int:
        return len(self._all)

    def search_index(self) -> SearchIndex:
        """The search index over every capability, built on first use (see prepare_search)."""
        if self._index is None:
            from ._search import SearchIndex

            self._index = SearchIndex(self._all.values(), cache_dir=self._search_cache)
        return self._index

    @property
    def search_prepared(self) -> bool:
        """Whether the search index exists (``search_index()`` will not build it)."""
        return self._index is not None

    def prepare_search(self, cache_dir: Path | None = None) -> SearchIndex:
        """Build the search index now, its capsule vectors cached in ``cache_dir``.

        Building embeds every capsule not in the cache (seconds for thousands): the
        daemon calls this in a worker thread before it swaps the registry in, so no
        search ever builds the index on the event loop.
        """
        self._search_cache = cache_dir
        self._index = None
        return self.search_index()

    def counts(self) -> dict[str, int]:
        """Live, disabled and declaration-error counts, without copying anything."""
        return {"live": len(self._live), "disabled": len(self._disabled),
                "errors": len(self._errors)}

    def snapshot(self) -> RegistrySnapshot:
        """Return an immutable view of the registry now."""
        return RegistrySnapshot(
            MappingProxyType(dict(self._live)), MappingProxyType(dict(self._disabled)),
            MappingProxyType(dict(self._tools)), MappingProxyType(dict(self._probes)),
            self._errors, self.built_at)

    def with_source(self, source: str, capabilities: Iterable[Capability],
                    not_on_host: Mapping[str, str]) -> Registry:
        """A new registry in which the capabilities from ``source`` (and those it left
        out) are ``capabilities`` (and ``not_on_host``); everything else as here: the
        tools, the probe results, the errors, the ops and hooks. Raises
        :class:`ValueError` when a new name clashes with another source's."""
        previous = {c.name for c in self._all.values() if c.source == source}
        kept = [c for c in self._all.values() if c.source != source]
        registry = Registry([*kept, *capabilities], self._tools, self._probes,
                            errors=self._errors, ops=self.ops, hooks=self.hooks,
                            clock=self._clock)
        registry.not_on_host = {
            **{n: why for n, why in self.not_on_host.items()
               if n not in previous and n not in self._left_out_by.get(source, ())},
            **not_on_host}
        registry._left_out_by = dict(self._left_out_by)
        registry.left_out_from(source, not_on_host)
        return registry

    def left_out_from(self, source: str, names: Iterable[str]) -> None:
        """Note which of :attr:`not_on_host` ``source`` left out (:meth:`with_source`
        replaces them with what it leaves out next)."""
        self._left_out_by[source] = frozenset(names)

    # ---------------------------------------------------------------- changes

    def record_probe(self, result: ProbeResult) -> tuple[list[str], list[str]]:
        """Store ``result`` and re-place every capability that requires its tool.

        Returns ``(restored, disabled)``: the names that became live and the
        names that became disabled because of it.
        """
        self._probes[result.tool] = result
        moved: dict[bool, list[str]] = {True: [], False: []}  # now live: restored, else disabled
        for name in sorted(self._by_tool.get(result.tool, ())):
            was_live = name in self._live
            self._place(self._all[name])
            if (name in self._live) != was_live:
                moved[not was_live].append(name)
        return moved[True], moved[False]

    def mark_tool_down(self, tool: str, error: str) -> list[str]:
        """Passive health: record ``tool`` as failed without a probe; return newly disabled."""
        previous = self._probes.get(tool)
        latency = previous.latency_s if previous else 0.0
        result = ProbeResult(tool=tool, ok=False, latency_s=latency, error=error,
                             checked_at=self._clock())
        return self.record_probe(result)[1]

    def _place(self, cap: Capability) -> None:
        missing = tuple(t for t in cap.requires if not self._tool_ok(t))
        if not missing:
            self._disabled.pop(cap.name, None)
            self._live[cap.name] = cap
            return
        self._live.pop(cap.name, None)
        previous = self._disabled.get(cap.name)
        errors = {t: self._tool_error(t) for t in missing}
        self._disabled[cap.name] = DisabledEntry(
            capability=cap, missing=missing, errors=MappingProxyType(errors),
            since=previous.since if previous else self._clock())

    def _tool_ok(self, tool: str) -> bool:
        result = self._probes.get(tool)
        return result is not None and result.ok

    def _tool_error(self, tool: str) -> str:
        result = self._probes.get(tool)
        if result is None:
            return "never probed" if tool in self._tools else "tool is not declared"
        return result.error or "probe failed"

"""Ops and code-defined capabilities: markers, and a scan that collects them.

``@op("notes.append")`` and ``@capability(...)`` only *mark* a function by
attaching a frozen spec to it; nothing is registered anywhere. A build imports
the plugin modules and scans them (:func:`load_plugins`), producing a fresh
:class:`OpTable` each time, so two builds never share state. The same scan
collects the hooks ``@before_call`` and ``@after_call`` mark (``_hooks``).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import sys
import traceback
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType, ModuleType
from typing import Any, TypeVar

from pydantic import BaseModel

from ._errors import DeclarationError, PluginError
from ._hooks import HookSpec, hooks_of
from ._hooks import where as _where
from ._names import close_hint
from ._outcomes import USER_CODE_FAILURES

F = TypeVar("F", bound=Callable[..., Any])

OP_ATTR = "__capd_op__"
CAPABILITY_ATTR = "__capd_capability__"
ENTRY_POINT_GROUP = "capd.plugins"


@dataclass(frozen=True)
class OpSpec:
    """A callable registered under an op id, with its parameter model."""

    id: str
    func: Callable[..., Any]
    parameters: type[BaseModel] | None
    source: str


@dataclass(frozen=True)
class CapabilitySpec:
    """The metadata ``@capability`` attached to a function."""

    name: str
    func: Callable[..., Any]
    parameters: type[BaseModel] | None
    meta: Mapping[str, Any]
    source: str


def op(op_id: str, *, params: type[BaseModel] | None = None) -> Callable[[F], F]:
    """Mark ``func`` as the op ``op_id``. ``params`` defaults to the first argument's annotation."""

    def mark(func: F) -> F:
        setattr(func, OP_ATTR, OpSpec(op_id, func, params, _where(func)))
        return func

    return mark


def capability(
    name: str, *, summary: str, params: type[BaseModel] | None = None, **meta: Any
) -> Callable[[F], F]:
    """Mark ``func`` as a code-defined capability; ``meta`` takes any :class:`Capability` field."""

    def mark(func: F) -> F:
        setattr(func, CAPABILITY_ATTR, CapabilitySpec(
            name, func, params, MappingProxyType({"summary": summary, **meta}), _where(func)))
        return func

    return mark


def infer_parameters(func: Callable[..., Any]) -> type[BaseModel] | None:
    """Return the pydantic model annotating ``func``'s first parameter, if any."""
    try:
        hints = typing.get_type_hints(func)
        first = next(iter(inspect.signature(func).parameters.values()), None)
    except (NameError, TypeError, ValueError):
        return None
    if first is None:
        return None
    hint = hints.get(first.name)
    if isinstance(hint, type) and issubclass(hint, BaseModel):
        return hint
    return None


@dataclass
class OpTable:
    """The ops, code capabilities and hooks found by one scan of the plugin modules.

    ``hooks`` is keyed by :attr:`HookSpec.name`, in the order the scan met them
    (modules in configured order, functions in definition order).
    """

    ops: dict[str, OpSpec] = field(default_factory=dict)
    capabilities: list[CapabilitySpec] = field(default_factory=list)
    errors: list[DeclarationError] = field(default_factory=list)
    modules: list[str] = field(default_factory=list)
    hooks: dict[str, HookSpec] = field(default_factory=dict)

    def add_module(self, module: ModuleType) -> None:
        """Collect every marked function in ``module``'s namespace."""
        self.modules.append(module.__name__)
        seen_caps = {id(c.func) for c in self.capabilities}
        for value in list(vars(module).values()):
            spec = getattr(value, OP_ATTR, None)
            if isinstance(spec, OpSpec):
                existing = self.ops.get(spec.id)
                if existing is not None and existing.func is not spec.func:
                    self.errors.append(DeclarationError(
                        spec.source, f"op id {spec.id!r} is already registered by "
                        f"{existing.source}", field="op"))
                else:
                    self.ops[spec.id] = spec
            cap = getattr(value, CAPABILITY_ATTR, None)
            if isinstance(cap, CapabilitySpec) and id(cap.func) not in seen_caps:
                self.capabilities.append(cap)
                seen_caps.add(id(cap.func))
            for hook in hooks_of(value):
                self._add_hook(hook)

    def _add_hook(self, hook: HookSpec) -> None:
        # The same function met twice (re-exported, or under a second name) is one hook.
        existing = self.hooks.get(hook.name)
        if existing is None:
            self.hooks[hook.name] = hook
        elif existing is not hook:
            self.errors.append(DeclarationError(
                hook.source, f"hook name {hook.name!r} is already taken by the "
                f"{existing.kind}-hook {existing.source}; pass name= to tell them apart",
                field="name"))


def _import_fresh(name: str) -> ModuleType:
    for loaded in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[loaded]
    importlib.invalidate_caches()
    return importlib.import_module(name)


def entry_point_modules() -> list[str]:
    """Return the module names advertised under the ``capd.plugins`` entry-point group."""
    points = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    return [ep.value.partition(":")[0] for ep in points]


def load_plugins(
    modules: Iterable[str], *, paths: Iterable[Path] = (), fresh: bool = True
) -> OpTable:
    """Import ``modules`` (afresh when ``fresh``) and scan them for ops and capabilities.

    ``paths`` are put on ``sys.path`` first. Raises :class:`PluginError` when a
    module cannot be imported: a broken plugin is a configuration error, and a
    reload that meets one must keep the old registry.
    """
    for path in paths:
        text = str(path)
        if text not in sys.path:
            sys.path.insert(0, text)
    table = OpTable()
    for name in dict.fromkeys(modules):
        try:
            module = _import_fresh(name) if fresh else importlib.import_module(name)
        except USER_CODE_FAILURES as exc:  # SystemExit at import fails the reload only
            last = _plugin_frame(exc)
            where = f" ({last.filename}:{last.lineno})" if last else ""
            if isinstance(exc, SyntaxError) and exc.filename:
                where = f" ({exc.filename}:{exc.lineno})"
            if isinstance(exc, ModuleNotFoundError) and exc.name == name:
                where += _module_hint(name)
            raise PluginError(name, f"{type(exc).__name__}: {exc}{where}") from exc
        table.add_module(module)
    return table


def _plugin_frame(exc: BaseException) -> traceback.FrameSummary | None:
    """Return the innermost frame of ``exc`` outside this package, else the innermost one.

    A marker that refuses its arguments raises inside the registry; the line
    to fix is the plugin's.
    """
    frames = list(traceback.extract_tb(exc.__traceback__)) if exc.__traceback__ else []
    here = Path(__file__).parent
    outside = [f for f in frames if Path(f.filename).parent != here]
    chosen = outside or frames
    return chosen[-1] if chosen else None


def _module_hint(name: str) -> str:
    """`` (did you mean 'x'?)`` naming the importable top-level module closest to ``name``
    (those on ``sys.path``, ``plugin_paths`` included)."""
    import pkgutil

    return close_hint(name, sorted({m.name for m in pkgutil.iter_modules()}), cutoff=0.75)

"""The shape of the imports: no circle in the sidecar, no private name across packages.

Read from the source with ``ast`` (type-only imports count: a circle through
``if TYPE_CHECKING`` is still a circle to a reader).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("registry", "recovery", "sidecar")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return "capd." + ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Every capd module ``path`` imports (relative imports resolved)."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("capd."))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("capd."):
                continue
            found.add(target)
            # `from . import _handlers`: the names may be modules themselves
            found.update(f"{target}.{a.name}" for a in node.names)
    return found


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    return {name: {m for m in _imports(path) if m in modules and m != name}
            for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_the_sidecar_has_no_import_circle() -> None:
    """Handlers, API and metrics read the daemon through Services; nothing imports back."""
    graph = _graph()
    sidecar = {m: {n for n in deps if n.startswith("capd.sidecar.")}
               for m, deps in graph.items() if m.startswith("capd.sidecar.")}
    # a package's __init__ re-exporting its modules is not a circle worth the name
    without_inits = {m: {n for n in deps if not ROOT.joinpath(*n.split(".")[1:], "__init__.py")
                         .exists()}
                     for m, deps in sidecar.items()}
    assert _cycles(without_inits) == []


def test_services_names_the_parts_but_never_the_daemon_or_a_handler() -> None:
    """The seam names the parts a handler uses by their own types (no mirror of each),
    never the daemon that wires them nor a handler; ``Caller`` lives with the grant,
    which imports nothing of the sidecar, so every part can import it."""
    deps = _imports(ROOT / "sidecar" / "server" / "_services.py")
    assert not {d for d in deps if d.startswith(("capd.sidecar.server._daemon",
                                                 "capd.sidecar.server._handlers",
                                                 "capd.sidecar.server._api"))}
    assert {d for d in _imports(ROOT / "sidecar" / "server" / "_grant.py")
            if d.startswith("capd.sidecar")} == set()


def test_handlers_and_metrics_never_import_the_daemon() -> None:
    for name in ("_handlers", "_metrics", "_api"):
        deps = _imports(ROOT / "sidecar" / "server" / f"{name}.py")
        assert "capd.sidecar.server._daemon" not in deps, name


def test_no_private_name_is_imported_across_packages() -> None:
    """registry/, recovery/ and sidecar/ use each other's public API only."""
    offenders = []
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            for dep in _imports(path):
                parts = dep.split(".")
                if parts[1] != pkg and any(p.startswith("_") for p in parts[2:]):
                    offenders.append(f"{path.relative_to(ROOT)} imports {dep}")
    assert offenders == []

"""Fakes at the edge of the world: a probe that flips on command, a clock you move."""

from __future__ import annotations

import asyncio
from collections import Counter

from pydantic import BaseModel

from capd.registry import Capability, CommandProbe, ProbeResult, Registry, ToolSpec


class FlipProbe:
    """A probe whose answer per tool is set by the test; counts calls; can be held."""

    def __init__(self, **up: bool) -> None:
        self.up = dict(up)
        self.calls: Counter[str] = Counter()
        self.release = asyncio.Event()
        self.release.set()

    async def __call__(self, tool: str, spec: ToolSpec) -> ProbeResult:
        self.calls[tool] += 1
        await self.release.wait()
        ok = self.up.get(tool, False)
        return ProbeResult(tool=tool, ok=ok, latency_s=0.0,
                           error=None if ok else f"{tool} is down", checked_at=0.0)


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Params(BaseModel):
    text: str = "x"


def make_registry(caps: dict[str, tuple[str, ...]], up: dict[str, bool],
                  funcs: dict[str, object] | None = None,
                  **extra: dict[str, object]) -> Registry:
    """A registry of capabilities named in ``caps`` (name → required tools)."""

    async def default(params: Params) -> str:
        return params.text

    tools = {t for req in caps.values() for t in req}
    capabilities = []
    for name, requires in caps.items():
        fields: dict[str, object] = {
            "name": name, "summary": name, "parameters": Params,
            "func": (funcs or {}).get(name, default), "requires": requires,
        }
        fields.update(extra.get(name, {}))
        capabilities.append(Capability(**fields))  # type: ignore[arg-type]
    probes = {t: ProbeResult(tool=t, ok=up.get(t, False), latency_s=0.0,
                             error=None if up.get(t, False) else f"{t} is down", checked_at=0.0)
              for t in tools}
    specs: dict[str, ToolSpec] = {t: CommandProbe(which="sh") for t in tools}
    return Registry(capabilities, specs, probes)

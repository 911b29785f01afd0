"""Hosts: where a capability may be offered, and what a caller's host offers.

:class:`HostRequirements` is checked on the daemon's own host at build time (a
capability this host cannot run is left out); :class:`HostCaps` against what a
caller says its host has (:class:`CallerHost`) when it searches or lists.
"""

from __future__ import annotations

import os

from pydantic import BaseModel, ConfigDict, Field

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class HostRequirements(BaseModel):
    """Where a capability may be offered: an OS, programs on PATH, environment variables."""

    model_config = _FROZEN
    os: tuple[str, ...] = Field((), description="sys.platform prefixes, e.g. linux, darwin.")
    binaries: tuple[str, ...] = ()
    env: tuple[str, ...] = ()

    def unmet(self) -> list[str]:
        """What this host lacks (empty when every requirement holds)."""
        import shutil
        import sys

        missing: list[str] = []
        if self.os and not any(sys.platform.startswith(o) for o in self.os):
            missing.append(f"os is {sys.platform}, needs {' or '.join(self.os)}")
        missing += [f"{b!r} not on PATH" for b in self.binaries if shutil.which(b) is None]
        missing += [f"${e} not set" for e in self.env if not os.environ.get(e)]
        return missing


class HostCaps(BaseModel):
    """What a caller's host must offer for a capability to be of use to it (the caller says
    what its host has when it searches): an OS, a screen, tokens, a source-control tool."""

    model_config = _FROZEN
    os: tuple[str, ...] = Field((), description="OS names it runs for (linux, darwin...).")
    gui: bool = Field(False, description="Whether it needs a graphical session.")
    tokens: tuple[str, ...] = Field((), description="Credentials it needs (GITHUB_TOKEN...).")
    scm: tuple[str, ...] = Field((), description="Source-control tools, one of which it "
                                 "needs (git, hg...).")

    def unmet(self, host: CallerHost) -> str | None:
        """Why a caller with ``host`` cannot use it; None when it can."""
        if self.os and host.os is not None and host.os not in self.os:
            return f"runs on {' or '.join(self.os)}, the caller's host is {host.os}"
        if self.gui and host.gui is False:
            return "needs a graphical session, the caller's host has none"
        missing = [t for t in self.tokens if t not in host.tokens]
        if missing and host.tokens_known:
            return f"needs {', '.join(missing)}, which the caller's host lacks"
        if self.scm and host.scm is not None and not set(self.scm) & set(host.scm):
            return f"needs {' or '.join(self.scm)}, the caller's host has none of them"
        return None


class CallerHost(BaseModel):
    """What a caller says its host has (``host_os``, ``host_gui``, ``host_tokens``,
    ``host_scm`` on search and list); what it leaves out is not judged."""

    model_config = _FROZEN
    os: str | None = None
    gui: bool | None = None
    tokens: frozenset[str] = frozenset()
    tokens_known: bool = False
    scm: tuple[str, ...] | None = None

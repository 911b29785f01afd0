"""The error tree of capd's registry layer.

::

    CapdError
    └── RegistryError
        ├── DeclarationError      a capability declaration (TOML or code) is invalid
        ├── PluginError           a plugin module could not be imported
        ├── ConfigError           the build configuration is unusable
        ├── UnknownCapability     a lookup named a capability that does not exist
        ├── UnknownTopology       a lookup named a topology that is not declared
        └── InvalidTopology       a topology fails validation (every problem listed)

Other packages hang their own subtrees off :class:`CapdError`; the package
docstring draws every exception of the registry, these and the others.
"""

from __future__ import annotations


class CapdError(Exception):
    """Root of every error capd raises on purpose."""


class RegistryError(CapdError):
    """Root of the registry layer's errors."""


class ConfigError(RegistryError):
    """The configuration cannot be used; the message names the key and what to do."""


class PluginError(RegistryError):
    """A plugin module could not be imported (syntax error, missing dependency)."""

    def __init__(self, module: str, reason: str) -> None:
        self.module = module
        self.reason = reason
        super().__init__(f"plugin {module!r} failed to import: {reason}")


class DeclarationError(RegistryError):
    """A capability declaration is invalid.

    ``source`` is the file (or ``module:function`` for code), ``capability`` the
    capability's name when known, ``field`` the offending field when known.
    ``whole_file`` says the file did not load at all (not valid TOML, unreadable, or
    gone): nothing it declares is known, so a reload meeting one keeps the old registry.
    """

    def __init__(
        self,
        source: str,
        message: str,
        *,
        capability: str | None = None,
        field: str | None = None,
        whole_file: bool = False,
    ) -> None:
        self.source = source
        self.capability = capability
        self.field = field
        self.whole_file = whole_file
        self.message = message
        parts = [source]
        if capability:
            parts.append(capability)
        text = ": ".join(parts)
        where = f" (field '{field}')" if field and field not in message else ""
        super().__init__(f"{text}: {message}{where}")

    def as_dict(self) -> dict[str, str | bool | None]:
        """Return the error as a JSON-ready mapping."""
        return {
            "source": self.source,
            "capability": self.capability,
            "field": self.field,
            "message": str(self),
            "whole_file": self.whole_file,
        }


class UnknownCapability(RegistryError, LookupError):
    """No capability by that name is live or disabled."""

    def __init__(self, name: str, suggestions: list[str] | None = None) -> None:
        self.name = name
        self.suggestions = suggestions or []
        names = ", ".join(repr(s) for s in self.suggestions)
        hint = f" (did you mean {names}?)" if names else ""
        super().__init__(f"unknown capability {name!r}{hint}")


class UnknownTopology(RegistryError, LookupError):
    """No topology by that id is declared."""

    def __init__(self, topology_id: str, suggestions: list[str] | None = None,
                 known: list[str] | None = None) -> None:
        self.topology_id = topology_id
        self.suggestions = suggestions or []
        if self.suggestions:
            hint = f" (did you mean {', '.join(repr(s) for s in self.suggestions)}?)"
        elif known:
            hint = f" (topologies: {', '.join(known)})"
        else:
            hint = " (no topology is declared; add [[topology]] to a declarations file)"
        super().__init__(f"unknown topology {topology_id!r}{hint}")


class InvalidTopology(RegistryError):
    """A topology fails validation; ``problems`` holds one sentence per problem."""

    def __init__(self, topology_id: str, problems: list[str]) -> None:
        self.topology_id = topology_id
        self.problems = problems
        super().__init__(f"topology {topology_id!r} is invalid: {'; '.join(problems)}")

"""Topologies: how several agents work together, declared as data, checked and expanded.

A declarations file may hold ``[[topology]]`` tables beside its capabilities::

    [[topology]]
    id = "review"
    title = "Parallel code review"
    summary = "Reviewers split the diff; a lead merges their findings."
    required_evidence = ["every file of the diff has a reviewer's note"]

    [[topology.roles]]
    id = "reviewer"
    title = "Reviewer"
    responsibilities = ["read one share of the diff", "write findings"]
    agent = "reviewer"          # an [agents.*] name in capd.toml
    count = 5                   # instances: reviewer-1 ... reviewer-5 (default 1)

    [[topology.groups]]
    id = "readers"
    roles = ["reviewer"]

    [[topology.phases]]
    id = "review"
    roles = ["reviewer", "lead"]
    fanout = ["reviewer"]       # these roles' instances share the phase's work, in parallel
    fanin = ["lead"]            # these roles gather every instance's result

**fanout and fanin.** ``fanout`` names the roles of a phase whose instances each take
a share of the phase's work, all at once; ``fanin`` names the roles that gather the
results of the phase's instances when they are done. Either is a list of role ids,
``true`` (every role of the phase) or ``false`` (none; the default). A role named in
``fanout`` or ``fanin`` must be one of the phase's ``roles``. An expansion turns both
into lists of instance ids.

Loading (``_declarations.py``) checks the shape of each table, and a broken one is a
:class:`DeclarationError` naming the file, as for capabilities. Validation
(:func:`validate_topology`) checks what refers to what — roles in groups and phases,
agents, counts — and lists every problem; :func:`expand_topology` refuses a topology
with any (fail closed) and materialises ``role-1 … role-N`` for a role whose count is
above 1. This module knows agents by name only: what an agent resolves to is the
sidecar's business.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

from ._errors import DeclarationError, InvalidTopology, UnknownTopology
from ._names import close_hint

ID_PATTERN = r"^[a-z][a-z0-9_-]*$"
# `GET /topologies/validate` is a route of its own: a topology by that id could never be shown.
RESERVED_IDS = frozenset({"validate"})

_FROZEN = ConfigDict(frozen=True, extra="forbid")
Id = Annotated[str, Field(pattern=ID_PATTERN)]
Fan = StrictBool | tuple[str, ...]


class TopologyRole(BaseModel):
    """One role: what it is responsible for, the agent that plays it, how many instances."""

    model_config = _FROZEN
    id: Id
    title: str = ""
    responsibilities: tuple[str, ...] = ()
    agent: str = Field(min_length=1, description="An [agents.*] name in capd.toml.")
    # Checked by validate_topology, not here: a count below 1 is a problem to report
    # with the others, not a reason to drop the whole topology.
    count: StrictInt = 1
    required_evidence: tuple[str, ...] = Field(
        (), description="Evidence each instance must produce (it counts as produced).")
    expected_artifacts: tuple[str, ...] = Field(
        (), description="What each instance hands on (it counts as produced).")
    fanin_obligations: tuple[str, ...] = Field(
        (), description="What it owes when it gathers the fanned-out results.")


class TopologyGroup(BaseModel):
    """Roles that belong together (a team, a review board)."""

    model_config = _FROZEN
    id: Id
    roles: tuple[str, ...] = ()


class TopologyPhase(BaseModel):
    """One step of the work: the roles taking part, who fans out and who fans in."""

    model_config = _FROZEN
    id: Id
    roles: tuple[str, ...] = ()
    fanout: Fan = False
    fanin: Fan = False
    required_evidence: tuple[str, ...] = ()
    coordinator_decision_kinds: tuple[str, ...] = Field(
        (), description="The decisions the coordinator takes in this phase: each one of the "
        "topology's coordinator_decisions.")

    @property
    def fanout_roles(self) -> tuple[str, ...]:
        """The role ids ``fanout`` stands for."""
        return _fanned(self.fanout, self.roles)

    @property
    def fanin_roles(self) -> tuple[str, ...]:
        """The role ids ``fanin`` stands for."""
        return _fanned(self.fanin, self.roles)


def _fanned(fan: Fan, roles: tuple[str, ...]) -> tuple[str, ...]:
    if fan is True:
        return roles
    if fan is False:
        return ()
    return fan


class Topology(BaseModel):
    """A declared way for agents to work together."""

    model_config = _FROZEN
    id: Id
    title: str = Field(min_length=1)
    summary: str = ""
    required_evidence: tuple[str, ...] = ()
    blackboard_topics: tuple[str, ...] = Field(
        (), description="The shared board's topics the instances read and write.")
    fanout_strategy: str = Field("", description="How work is split among instances.")
    fanin_strategy: str = Field("", description="How results are merged (vote, judge...).")
    coordinator_decisions: tuple[str, ...] = Field(
        (), description="Every kind of decision the coordinator may take.")
    candidate_expectations: tuple[str, ...] = Field(
        (), description="What every candidate answer must satisfy.")
    verifier_gates: tuple[str, ...] = Field(
        (), description="Checks a result must pass before it is accepted.")
    roles: tuple[TopologyRole, ...] = ()
    groups: tuple[TopologyGroup, ...] = ()
    phases: tuple[TopologyPhase, ...] = ()
    source: str = ""

    def role(self, role_id: str) -> TopologyRole | None:
        """The role ``role_id``, or None."""
        return next((r for r in self.roles if r.id == role_id), None)


# ---------------------------------------------------------------------- the set


@dataclass(frozen=True)
class TopologySet:
    """The declared topologies by id, and what could not be read."""

    topologies: Mapping[str, Topology] = field(default_factory=dict)
    errors: tuple[DeclarationError, ...] = ()
    broken: Mapping[str, DeclarationError] = field(default_factory=dict)

    def get(self, topology_id: str) -> Topology:
        """The topology ``topology_id``.

        Raises :class:`InvalidTopology` when a table with that id failed to parse
        (the error says why) and :class:`UnknownTopology`, with close ids, when none
        is declared.
        """
        found = self.topologies.get(topology_id)
        if found is not None:
            return found
        if topology_id in self.broken:
            raise InvalidTopology(topology_id, [str(self.broken[topology_id])])
        known = sorted(self.topologies)
        close = difflib.get_close_matches(topology_id, known, n=3, cutoff=0.6)
        raise UnknownTopology(topology_id, close, known)


# -------------------------------------------------------------------- validation


def _unknown(kind: str, name: str, known: Collection[str], where: str) -> str:
    hint = close_hint(name, known) or (f" ({kind}s: {', '.join(sorted(known))})" if known
                                       else f" (no {kind} is declared{where})")
    return f"unknown {kind} {name!r}{hint}"


def _duplicates(kind: str, ids: Iterable[str]) -> list[str]:
    seen: set[str] = set()
    problems = []
    for item in ids:
        if item in seen:
            problems.append(f"{kind} id {item!r} is declared twice")
        seen.add(item)
    return problems


MAX_INSTANCES = 1000
"""The most instances a topology expands to, all roles together: a count is sized by its
caller (``--set role.count=N``), so what an expansion may cost is bounded here."""


def validate_topology(topology: Topology, agents: Collection[str]) -> list[str]:
    """Every problem of ``topology``, one sentence each; empty when it is sound.

    ``agents`` are the declared agent names. Checked: at least one role; ids of
    roles, groups and phases unique; each role's agent declared and count at
    least 1; every role a group or phase names (its ``roles``, ``fanout`` and
    ``fanin``) declared, and a fanned role one of its phase's roles; no instance
    id (``role-N``) equal to another role's id; at most :data:`MAX_INSTANCES`
    instances in all.
    """
    problems: list[str] = []
    role_ids = [r.id for r in topology.roles]
    roles = set(role_ids)
    if not topology.roles:
        problems.append("declares no roles; add [[topology.roles]] with an id and an agent")
    problems += _duplicates("role", role_ids)
    problems += _duplicates("group", (g.id for g in topology.groups))
    problems += _duplicates("phase", (p.id for p in topology.phases))
    for role in topology.roles:
        if role.agent not in agents:
            problems.append(f"role {role.id!r} names "
                            + _unknown("agent", role.agent, agents,
                                       " under [agents] in capd.toml"))
        if role.count < 1:
            problems.append(f"role {role.id!r} has count {role.count}; a role needs at least "
                            "1 instance")
    for group in topology.groups:
        if not group.roles:
            problems.append(f"group {group.id!r} names no role")
        problems += [f"group {group.id!r} names " + _unknown("role", r, roles, "")
                     for r in group.roles if r not in roles]
    for phase in topology.phases:
        if not phase.roles:
            problems.append(f"phase {phase.id!r} names no role")
        problems += [f"phase {phase.id!r} names " + _unknown("role", r, roles, "")
                     for r in phase.roles if r not in roles]
        for name, fan in (("fanout", phase.fanout), ("fanin", phase.fanin)):
            if isinstance(fan, bool):
                continue
            for r in fan:
                if r not in roles:
                    problems.append(f"phase {phase.id!r} {name} names "
                                    + _unknown("role", r, roles, ""))
                elif r not in phase.roles:
                    problems.append(f"phase {phase.id!r} {name} names role {r!r}, which is not "
                                    "one of the phase's roles")
    total = sum(max(role.count, 0) for role in topology.roles)
    if total > MAX_INSTANCES:
        problems.append(f"the counts add up to {total} instances; a topology expands to at "
                        f"most {MAX_INSTANCES} (lower a role's count)")
    for role in topology.roles:
        if total > MAX_INSTANCES:
            break  # too many to list: the problem above says so
        clashes = [i for i in _instance_ids(role.id, role.count) if i != role.id and i in roles]
        problems += [f"instance {i!r} of role {role.id!r} has the id of another role"
                     for i in clashes]
    decisions = set(topology.coordinator_decisions)
    for phase in topology.phases:
        problems += [f"phase {phase.id!r} takes decision {kind!r}, which is not one of the "
                     "topology's coordinator_decisions"
                     + (f" ({', '.join(sorted(decisions))})" if decisions else " (none declared)")
                     for kind in phase.coordinator_decision_kinds if kind not in decisions]
    produced = {e for r in topology.roles for e in (*r.required_evidence, *r.expected_artifacts)}
    wanted = [("the topology", e) for e in topology.required_evidence]
    wanted += [(f"phase {p.id!r}", e) for p in topology.phases for e in p.required_evidence]
    problems += [f"{where} requires evidence {evidence!r}, which no role produces (list it in "
                 "a role's required_evidence or expected_artifacts)"
                 for where, evidence in wanted if evidence not in produced]
    return problems


# --------------------------------------------------------------------- expansion


@dataclass(frozen=True)
class RoleInstance:
    """One instance of a role: ``reviewer-3`` is instance 3 of role ``reviewer``."""

    id: str
    role: str
    index: int
    agent: str


@dataclass(frozen=True)
class PhasePlan:
    """A phase with its roles turned into instance ids."""

    id: str
    roles: tuple[str, ...]
    instances: tuple[str, ...]
    fanout: tuple[str, ...]
    fanin: tuple[str, ...]


@dataclass(frozen=True)
class TopologyExpansion:
    """A valid topology materialised: every instance, and groups and phases by instance."""

    topology: Topology
    instances: tuple[RoleInstance, ...]
    groups: Mapping[str, tuple[str, ...]]
    phases: tuple[PhasePlan, ...]

    def instances_of(self, role_ids: Iterable[str]) -> tuple[str, ...]:
        """The instance ids of ``role_ids``, in role order then instance order."""
        wanted = list(role_ids)
        return tuple(i.id for r in wanted for i in self.instances if i.role == r)


def _instance_ids(role_id: str, count: int) -> list[str]:
    if count == 1:
        return [role_id]
    return [f"{role_id}-{n}" for n in range(1, count + 1)]


def parse_count_overrides(items: Iterable[str]) -> dict[str, int]:
    """``role.count=N`` items as ``{role: N}``; raise ValueError naming a malformed one."""
    counts: dict[str, int] = {}
    for item in items:
        key, sep, value = item.partition("=")
        role, dot, attribute = key.strip().rpartition(".")
        if not sep or not dot or attribute != "count" or not role:
            raise ValueError(f"{item!r}: use ROLE.count=N (only a role's count can be set)")
        try:
            counts[role] = int(value.strip())
        except ValueError:
            raise ValueError(f"{item!r}: the count must be a whole number") from None
    return counts


def with_counts(topology: Topology, counts: Mapping[str, int]) -> Topology:
    """``topology`` with role counts replaced.

    Raises :class:`InvalidTopology` naming a role the topology does not have.
    """
    unknown = [r for r in counts if topology.role(r) is None]
    if unknown:
        known = [r.id for r in topology.roles]
        raise InvalidTopology(topology.id, [
            "a count is set for " + _unknown("role", r, known, "") for r in unknown])
    roles = tuple(r.model_copy(update={"count": counts[r.id]}) if r.id in counts else r
                  for r in topology.roles)
    return topology.model_copy(update={"roles": roles})


def expand_topology(topology: Topology, agents: Collection[str],
                    counts: Mapping[str, int] | None = None) -> TopologyExpansion:
    """Materialise ``topology`` with ``counts`` (role id → count) applied.

    Raises :class:`InvalidTopology` listing every problem :func:`validate_topology`
    finds once the counts are applied (a count below 1 among them), or naming a
    count set for a role the topology does not have.
    """
    if counts:
        topology = with_counts(topology, counts)
    problems = validate_topology(topology, agents)
    if problems:
        raise InvalidTopology(topology.id, problems)
    instances = tuple(
        RoleInstance(instance_id, role.id, index, role.agent)
        for role in topology.roles
        for index, instance_id in enumerate(_instance_ids(role.id, role.count), start=1))
    expansion = TopologyExpansion(topology, instances, {}, ())
    groups = {g.id: expansion.instances_of(g.roles) for g in topology.groups}
    phases = tuple(
        PhasePlan(p.id, p.roles, expansion.instances_of(p.roles),
                  expansion.instances_of(p.fanout_roles),
                  expansion.instances_of(p.fanin_roles))
        for p in topology.phases)
    return TopologyExpansion(topology, instances, groups, phases)

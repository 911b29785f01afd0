"""What the agent and topology rows do inside the daemon. Rows in ``_table`` point here.

Agents and injections come from capd.toml as the serving registry's (re)load read
it; topologies are read from the declaration files when a topology row runs (off
the event loop), so ``capd topology validate`` checks the files as they are now.

A caller bound to a profile sees an agent only when everything it resolves to is
inside that profile; any other agent is, to that caller, as if it were not
declared (the way a hidden capability is unknown to it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from capd.registry import (
    AgentSpec,
    InjectionSpec,
    InvalidTopology,
    Topology,
    TopologySet,
    expand_topology,
    parse_count_overrides,
    select_capabilities,
    validate_topology,
)

from .._args import Params
from .._errors import BadRequest, UnknownAgent, UnresolvedAgent
from .._table import AgentIn, ExpandIn, ResolveIn, TopologyIn, ValidateIn
from ._agents import (
    AgentResolution,
    BridgeLaunch,
    capd_command,
    claude_config,
    codex_config,
    find_agent,
    parse_context,
    resolve_agent,
)
from ._services import Context, Reply

TOML = "application/toml"


def _resolve(ctx: Context, name: str, context: Mapping[str, str],
             agents: Mapping[str, AgentSpec] | None = None,
             injections: Sequence[InjectionSpec] | None = None) -> AgentResolution:
    """Resolve ``name`` for this caller (``injections``: the ones it may know of, when
    already found); raises UnknownAgent or UnresolvedAgent.

    For a caller whose grant is limited, an agent that resolves (in this context:
    an injection may add more) to anything outside the grant is unknown to it.
    """
    d = ctx.services
    known = d.loaded.agents if agents is None else agents
    resolution = resolve_agent(
        name, agents=known, injections=_injections(ctx) if injections is None else injections,
        registry=d.registry, context=context,
        bridge=BridgeLaunch(capd_command(), d.socket_path))
    grant = ctx.caller.grant
    if grant.restricted and not all(grant.reaches(d.registry, n)
                                    for n in resolution.capabilities):
        raise UnknownAgent(name, [])
    return resolution


def _agents(ctx: Context) -> Mapping[str, AgentSpec]:
    """The agents this caller may see: all of them, unless its grant is limited; then
    those that resolve wholly inside it."""
    agents = ctx.services.loaded.agents
    if not ctx.caller.grant.restricted:
        return agents
    injections = _injections(ctx)  # once, not once per agent
    seen = {}
    for name, spec in agents.items():
        try:
            _resolve(ctx, name, {}, agents, injections)
        except (UnresolvedAgent, UnknownAgent):  # broken, or reaching outside the grant
            continue
        seen[name] = spec
    return seen


def _context(items: tuple[str, ...]) -> dict[str, str]:
    try:
        return parse_context(",".join(items))
    except ValueError as exc:
        raise BadRequest(f"context: {exc}") from exc


def _injections(ctx: Context) -> list[InjectionSpec]:
    """The run-time injections this caller may know of: all, unless its grant is limited;
    then only those whose every entry selects capabilities inside it (an injection that
    reaches further is left out of its listings and of its resolutions alike)."""
    injections = list(ctx.services.loaded.injections)
    grant = ctx.caller.grant
    if not grant.restricted:
        return injections
    registry = ctx.services.registry

    def inside(injection: InjectionSpec) -> bool:
        selections = [select_capabilities(registry, entry) for entry in injection.add]
        return all(s.problem is None and all(grant.reaches(registry, n)
                                             for n in s.capabilities) for s in selections)

    return [i for i in injections if inside(i)]


def _injections_view(ctx: Context) -> list[dict[str, Any]]:
    shown = {id(i) for i in _injections(ctx)}
    return [{"injection": index, "when": i.when, "add": list(i.add), "why": i.why}
            for index, i in enumerate(ctx.services.loaded.injections) if id(i) in shown]


async def agents_list(ctx: Context, _: Params) -> Reply:
    """The declared agents, with their entries, and the run-time injections."""
    agents = _agents(ctx)
    return Reply(200, {
        "agents": [{"agent": name, "description": spec.description,
                    "capabilities": list(spec.capabilities)}
                   for name, spec in sorted(agents.items())],
        "injections": _injections_view(ctx)})


async def agent_show(ctx: Context, a: AgentIn) -> Reply:
    """One agent: its entries and what each selects now, and the injections that may add more."""
    name = a.agent
    spec = find_agent(name, _agents(ctx))
    registry = ctx.services.registry
    expansion = [select_capabilities(registry, entry) for entry in spec.capabilities]
    return Reply(200, {
        "agent": name, "description": spec.description,
        "capabilities": list(spec.capabilities),
        "expansion": [s.as_dict() for s in expansion],
        "resolves": all(s.problem is None for s in expansion),
        "injections": _injections_view(ctx)})


async def agent_resolve(ctx: Context, a: ResolveIn) -> Reply:
    """The MCP servers an agent's runtime needs in a context: json, claude or codex."""
    form, name = a.format, a.agent
    agents = _agents(ctx)
    find_agent(name, agents)
    resolution = _resolve(ctx, name, _context(a.context), agents)
    if form == "claude":
        return Reply(200, claude_config(resolution))
    if form == "codex":
        return Reply(200, codex_config(resolution).encode(), content_type=TOML)
    return Reply(200, resolution.as_json())


# -------------------------------------------------------------------- topologies


async def _topologies(ctx: Context) -> TopologySet:
    """The declared topologies this caller may know of: all, unless its grant is limited;
    then only those every role of which names an agent it may see, and no read errors
    (they name files and other topologies)."""
    found = await asyncio.to_thread(ctx.services.loaded.topologies)
    if not ctx.caller.grant.restricted:
        return found
    agents = _agents(ctx)
    return TopologySet(topologies={
        tid: t for tid, t in found.topologies.items()
        if all(r.agent in agents for r in t.roles)})


def _problems(ctx: Context, topology: Topology, agents: Mapping[str, AgentSpec]) -> list[str]:
    """What validation finds, and each declared agent of a role that does not resolve."""
    problems = validate_topology(topology, agents)
    for agent in dict.fromkeys(r.agent for r in topology.roles if r.agent in agents):
        try:
            _resolve(ctx, agent, {}, agents)
        except UnresolvedAgent as exc:
            roles = ", ".join(repr(r.id) for r in topology.roles if r.agent == agent)
            problems.append(f"role {roles} uses agent {agent!r}, which cannot be resolved: "
                            + "; ".join(p["detail"] for p in exc.problems))
    return problems


async def topologies_list(ctx: Context, _: Params) -> Reply:
    """Every declared topology, briefly, and the tables that could not be read."""
    found = await _topologies(ctx)
    return Reply(200, {
        "topologies": [{"id": t.id, "title": t.title, "summary": t.summary,
                        "roles": [r.id for r in t.roles],
                        "instances": sum(max(r.count, 0) for r in t.roles),
                        "source": t.source}
                       for _, t in sorted(found.topologies.items())],
        "errors": [e.as_dict() for e in found.errors]})


async def topology_show(ctx: Context, a: TopologyIn) -> Reply:
    """One topology as declared, with the problems validation finds in it."""
    found = await _topologies(ctx)
    topology = found.get(a.id)
    return Reply(200, {**topology.model_dump(mode="json"),
                       "problems": _problems(ctx, topology, _agents(ctx))})


async def topology_validate(ctx: Context, a: ValidateIn) -> Reply:
    """Check one topology (``id``) or all of them; 422 with the report when any is unsound."""
    found = await _topologies(ctx)
    agents = _agents(ctx)
    wanted = a.topology or None
    checked: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    if wanted is not None:
        try:
            topologies = [found.get(wanted)]
        except InvalidTopology as exc:  # its table did not load: say why
            topologies = []
            checked.append({"id": wanted, "ok": False, "problems": exc.problems})
    else:
        topologies = [t for _, t in sorted(found.topologies.items())]
        broken = {id(e) for e in found.broken.values()}
        checked += [{"id": topology_id, "ok": False, "problems": [str(error)]}
                    for topology_id, error in sorted(found.broken.items())]
        errors = [e.as_dict() for e in found.errors if id(e) not in broken]
    for topology in topologies:
        problems = _problems(ctx, topology, agents)
        checked.append({"id": topology.id, "ok": not problems, "problems": problems})
    checked.sort(key=lambda c: str(c["id"]))
    ok = not errors and all(c["ok"] for c in checked)
    return Reply(200 if ok else 422, {"ok": ok, "topologies": checked, "errors": errors})


async def topology_expand(ctx: Context, a: ExpandIn) -> Reply:
    """Materialise a topology's instances (``set=role.count=N,...``), each with its agent's
    resolved config (in ``context=k=v,...``); refuse an unsound topology."""
    try:
        counts = parse_count_overrides(a.set)
    except ValueError as exc:
        raise BadRequest(f"set: {exc}") from exc
    context = _context(a.context)
    found = await _topologies(ctx)
    agents = _agents(ctx)
    # Off the loop: its size is the caller's (bounded by MAX_INSTANCES, checked first).
    expansion = await asyncio.to_thread(
        expand_topology, found.get(a.id), agents, counts)
    topology = expansion.topology
    resolved = {agent: _resolve(ctx, agent, context, agents)
                for agent in dict.fromkeys(i.agent for i in expansion.instances)}
    roles = {r.id: {"title": r.title, **{key: list(getattr(r, key)) for key in (
        "responsibilities", "required_evidence", "expected_artifacts", "fanin_obligations")}}
        for r in topology.roles}  # what each instance of a role carries of it
    seed = topology.model_dump(mode="json", include={
        "required_evidence", "blackboard_topics", "fanout_strategy", "fanin_strategy",
        "coordinator_decisions", "candidate_expectations", "verifier_gates"})
    phases = {p.id: p for p in topology.phases}
    return Reply(200, {
        "topology": topology.id, "title": topology.title, "summary": topology.summary,
        **seed, "source": topology.source,
        "context": context,
        "counts": {r.id: r.count for r in topology.roles},
        "roles": [{"id": r.id, "title": r.title, "agent": r.agent, "count": r.count,
                   "instances": list(expansion.instances_of([r.id]))} for r in topology.roles],
        "instances": [{"id": i.id, "role": i.role, "index": i.index, "agent": i.agent,
                       **roles[i.role], "capabilities": list(resolved[i.agent].capabilities),
                       "servers": dict(resolved[i.agent].servers)}
                      for i in expansion.instances],
        "groups": {g: list(members) for g, members in expansion.groups.items()},
        "phases": [{"id": p.id, "roles": list(p.roles), "instances": list(p.instances),
                    "fanout": list(p.fanout), "fanin": list(p.fanin),
                    "required_evidence": list(phases[p.id].required_evidence),
                    "coordinator_decision_kinds": list(phases[p.id].coordinator_decision_kinds)}
                   for p in expansion.phases],
        "agents": {agent: r.as_json() for agent, r in resolved.items()},
    })

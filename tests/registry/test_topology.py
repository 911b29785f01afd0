"""Topologies: loaded with the declarations, validated fail-closed, expanded into instances."""

from __future__ import annotations

from pathlib import Path

import pytest

from capd.registry import (
    InvalidTopology,
    OpTable,
    Topology,
    TopologySet,
    UnknownTopology,
    expand_topology,
    load_declarations,
    load_topologies,
    parse_count_overrides,
    validate_topology,
)

AGENTS = {"planner", "reviewer", "writer"}

REVIEW = """
[[topology]]
id = "review"
title = "Parallel code review"
summary = "Reviewers split the diff; a lead merges their findings."
required_evidence = ["every file has a reviewer's note", "the lead's summary"]

[[topology.roles]]
id = "planner"
title = "Planner"
responsibilities = ["split the diff into shares"]
agent = "planner"

[[topology.roles]]
id = "reviewer"
title = "Reviewer"
responsibilities = ["review one share", "write findings"]
agent = "reviewer"
count = 5
expected_artifacts = ["every file has a reviewer's note"]

[[topology.roles]]
id = "lead"
title = "Lead"
agent = "writer"
required_evidence = ["the lead's summary"]

[[topology.groups]]
id = "readers"
roles = ["planner", "reviewer"]

[[topology.phases]]
id = "plan"
roles = ["planner"]

[[topology.phases]]
id = "review"
roles = ["reviewer", "lead"]
fanout = ["reviewer"]
fanin = ["lead"]

[[topology.phases]]
id = "wrap-up"
roles = ["lead"]
fanout = true
"""


def load(tmp_path: Path, text: str, name: str = "topo.toml") -> TopologySet:
    (tmp_path / name).write_text(text)
    return load_topologies([tmp_path], label_root=tmp_path)


def review(tmp_path: Path) -> Topology:
    return load(tmp_path, REVIEW).get("review")


def with_role(tmp_path: Path, **changes: object) -> Topology:
    """The review topology with the reviewer role's fields replaced."""
    topology = review(tmp_path)
    roles = tuple(r.model_copy(update=changes) if r.id == "reviewer" else r
                  for r in topology.roles)
    return topology.model_copy(update={"roles": roles})


# ------------------------------------------------------------------------ expansion


def test_three_roles_with_count_5_expand_to_seven_instances(tmp_path: Path) -> None:
    """reviewer (count 5) becomes reviewer-1 … reviewer-5; a count-1 role keeps its id."""
    expansion = expand_topology(review(tmp_path), AGENTS)
    assert [i.id for i in expansion.instances] == [
        "planner", "reviewer-1", "reviewer-2", "reviewer-3", "reviewer-4", "reviewer-5", "lead"]
    assert [(i.role, i.index, i.agent) for i in expansion.instances][1:3] == [
        ("reviewer", 1, "reviewer"), ("reviewer", 2, "reviewer")]
    assert expansion.groups == {"readers": ("planner", "reviewer-1", "reviewer-2", "reviewer-3",
                                            "reviewer-4", "reviewer-5")}
    review_phase = expansion.phases[1]
    assert review_phase.fanout == tuple(f"reviewer-{n}" for n in range(1, 6))
    assert review_phase.fanin == ("lead",)
    assert review_phase.instances == (*review_phase.fanout, "lead")


def test_fanout_true_is_every_role_of_the_phase_and_absent_is_none(tmp_path: Path) -> None:
    """`fanout = true` stands for all the phase's roles; a phase without it fans nothing."""
    phases = {p.id: p for p in expand_topology(review(tmp_path), AGENTS).phases}
    assert phases["wrap-up"].fanout == ("lead",)
    assert phases["wrap-up"].fanin == ()
    assert (phases["plan"].fanout, phases["plan"].fanin) == ((), ())


def test_a_count_override_changes_the_instances(tmp_path: Path) -> None:
    """`--set reviewer.count=2` (parsed by parse_count_overrides) gives two reviewers."""
    counts = parse_count_overrides(["reviewer.count=2", "lead.count=3"])
    expansion = expand_topology(review(tmp_path), AGENTS, counts)
    assert [i.id for i in expansion.instances] == [
        "planner", "reviewer-1", "reviewer-2", "lead-1", "lead-2", "lead-3"]
    assert expansion.topology.role("reviewer").count == 2  # type: ignore[union-attr]


@pytest.mark.parametrize("item", ["reviewer=2", "reviewer.title=x", ".count=2",
                                  "reviewer.count=two", "reviewer.count"])
def test_a_malformed_override_is_refused(item: str) -> None:
    """Only ROLE.count=N with a whole number can be set."""
    with pytest.raises(ValueError, match=repr(item).replace(".", r"\.")):
        parse_count_overrides([item])


def test_an_override_of_an_unknown_role_or_below_1_is_refused(tmp_path: Path) -> None:
    """A count for a role the topology lacks, or a count of 0, fails closed, naming it."""
    with pytest.raises(InvalidTopology, match="a count is set for unknown role 'reviewr' "
                       r"\(did you mean 'reviewer'\?\)"):
        expand_topology(review(tmp_path), AGENTS, {"reviewr": 2})
    with pytest.raises(InvalidTopology, match="role 'reviewer' has count 0"):
        expand_topology(review(tmp_path), AGENTS, {"reviewer": 0})


def test_an_expansion_past_the_bound_is_refused_before_it_is_built(tmp_path: Path) -> None:
    """Counts adding up past 1,000 instances (a billion, say) are a problem, found without
    materialising a single instance; exactly 1,000 expands."""
    with pytest.raises(InvalidTopology, match="1000000003 instances; a topology expands to "
                       "at most 1000"):
        expand_topology(review(tmp_path), AGENTS, {"reviewer": 1_000_000_000, "lead": 2})
    top = review(tmp_path)
    others = sum(r.count for r in top.roles if r.id != "reviewer")
    expansion = expand_topology(top, AGENTS, {"reviewer": 1000 - others})
    assert len(expansion.instances) == 1000


# ----------------------------------------------------------------------- validation


def test_a_sound_topology_has_no_problems(tmp_path: Path) -> None:
    """The review topology validates clean against the declared agents."""
    assert validate_topology(review(tmp_path), AGENTS) == []


def test_an_unknown_role_in_a_group_is_named(tmp_path: Path) -> None:
    """A group naming a role the topology lacks is a problem with a suggestion."""
    text = REVIEW.replace('roles = ["planner", "reviewer"]', 'roles = ["planner", "reviewers"]')
    problems = validate_topology(load(tmp_path, text).get("review"), AGENTS)
    assert problems == ["group 'readers' names unknown role 'reviewers' "
                        "(did you mean 'reviewer'?)"]


def test_an_unknown_role_in_a_phase_its_fanout_or_fanin_is_named(tmp_path: Path) -> None:
    """Phase roles, fanout and fanin must name declared roles, and fanned ones the phase's."""
    text = (REVIEW.replace('roles = ["planner"]\n', 'roles = ["planner", "auditor"]\n')
            .replace('fanout = ["reviewer"]', 'fanout = ["reviewer", "planner"]')
            .replace('fanin = ["lead"]', 'fanin = ["boss"]'))
    problems = validate_topology(load(tmp_path, text).get("review"), AGENTS)
    assert problems == [
        "phase 'plan' names unknown role 'auditor' (roles: lead, planner, reviewer)",
        "phase 'review' fanout names role 'planner', which is not one of the phase's roles",
        "phase 'review' fanin names unknown role 'boss' (roles: lead, planner, reviewer)",
    ]


def test_an_unknown_agent_is_named(tmp_path: Path) -> None:
    """A role whose agent is not under [agents] is a problem naming both."""
    problems = validate_topology(with_role(tmp_path, agent="reviewr"), AGENTS)
    assert problems == ["role 'reviewer' names unknown agent 'reviewr' (did you mean 'reviewer'?)"]
    none = validate_topology(review(tmp_path), set())
    assert "role 'planner' names unknown agent 'planner' (no agent is declared under [agents] " \
        "in capd.toml)" in none


@pytest.mark.parametrize("count", [0, -3])
def test_a_count_below_1_is_named(tmp_path: Path, count: int) -> None:
    """count < 1 is a problem (and expansion refuses the topology)."""
    topology = load(tmp_path, REVIEW.replace("count = 5", f"count = {count}")).get("review")
    assert validate_topology(topology, AGENTS) == [
        f"role 'reviewer' has count {count}; a role needs at least 1 instance"]
    with pytest.raises(InvalidTopology, match=f"has count {count}"):
        expand_topology(topology, AGENTS)


def test_every_problem_is_listed_at_once_and_expansion_refuses(tmp_path: Path) -> None:
    """Expansion fails closed on an invalid topology, with every problem in the error."""
    text = (REVIEW.replace('agent = "writer"', 'agent = "ghost"')
            .replace("count = 5", "count = 0")
            .replace('roles = ["planner", "reviewer"]', 'roles = ["nobody"]'))
    with pytest.raises(InvalidTopology) as caught:
        expand_topology(load(tmp_path, text).get("review"), AGENTS)
    assert len(caught.value.problems) == 3
    assert str(caught.value).startswith("topology 'review' is invalid: ")


def test_duplicates_no_roles_and_instance_clashes_are_problems(tmp_path: Path) -> None:
    """Duplicate ids, an empty topology and `reviewer-1` clashing with a role are named."""
    empty = load(tmp_path, '[[topology]]\nid = "empty"\ntitle = "Empty"\n').get("empty")
    assert validate_topology(empty, AGENTS) == [
        "declares no roles; add [[topology.roles]] with an id and an agent"]
    text = REVIEW + '''
[[topology.roles]]
id = "reviewer-2"
agent = "reviewer"

[[topology.groups]]
id = "readers"
roles = ["lead"]
'''
    problems = validate_topology(load(tmp_path, text).get("review"), AGENTS)
    assert problems == ["group id 'readers' is declared twice",
                        "instance 'reviewer-2' of role 'reviewer' has the id of another role"]


def test_an_unknown_topology_suggests_the_close_one(tmp_path: Path) -> None:
    """get() of an undeclared id raises UnknownTopology: `unknown topology 'x' (did you mean …)`."""
    found = load(tmp_path, REVIEW)
    with pytest.raises(UnknownTopology, match=r"^unknown topology 'reviw' \(did you mean "
                       r"'review'\?\)$"):
        found.get("reviw")
    with pytest.raises(UnknownTopology, match=r"\(topologies: review\)$"):
        found.get("deploy")
    with pytest.raises(UnknownTopology, match="no topology is declared"):
        TopologySet().get("review")


# -------------------------------------------------------------------------- loading


def test_a_broken_table_names_the_file_and_the_field(tmp_path: Path) -> None:
    """A wrong type is a DeclarationError naming file, topology and field; a lookup says why."""
    found = load(tmp_path, REVIEW.replace("count = 5", 'count = "five"'))
    assert found.topologies == {}
    (error,) = found.errors
    assert str(error).startswith("topo.toml: topology 'review': roles.1.count: ")
    assert error.field == "roles"
    with pytest.raises(InvalidTopology, match=r"roles\.1\.count"):
        found.get("review")


@pytest.mark.parametrize(("text", "message"), [
    ('[[topology]]\nid = "x"\n', "title: Field required"),
    ('[[topology]]\nid = "X Y"\ntitle = "t"\n', "id: String should match pattern"),
    ('[[topology]]\nid = "validate"\ntitle = "t"\n', "the id is reserved"),
    ('[[topology]]\nid = "x"\ntitle = "t"\nsource = "me"\n', "field 'source' cannot be declared"),
    ('[[topology]]\nid = "x"\ntitle = "t"\nowner = "me"\n', "owner: unknown field"),
    ('[[topology]]\nid = "x"\ntitle = "t"\n[[topology.phases]]\nid = "p"\nfanout = "yes"\n',
     "phases.0.fanout"),
    ('topology = 3\n', "use [[topology]] (an array of tables)"),
])
def test_each_shape_error_is_reported(tmp_path: Path, text: str, message: str) -> None:
    """Every malformed table becomes one error naming the file; nothing is loaded from it."""
    found = load(tmp_path, text)
    assert found.topologies == {}
    assert len(found.errors) == 1
    assert message in str(found.errors[0])
    assert str(found.errors[0]).startswith("topo.toml: ")


def test_a_duplicate_id_keeps_the_first_and_names_both_files(tmp_path: Path) -> None:
    """The same id in two files: the first wins, the second is an error naming the first."""
    (tmp_path / "a.toml").write_text(REVIEW)
    (tmp_path / "b.toml").write_text(REVIEW.replace("Parallel code review", "Another"))
    found = load_topologies([tmp_path], label_root=tmp_path)
    assert found.get("review").title == "Parallel code review"
    assert [str(e) for e in found.errors] == [
        "b.toml: topology 'review' is already declared by a.toml (field 'id')"]


def test_topologies_load_with_the_declarations(tmp_path: Path) -> None:
    """load_declarations accepts [[topology]] beside capabilities and reports its errors too."""
    (tmp_path / "ok.toml").write_text(REVIEW)
    (tmp_path / "bad.toml").write_text('[[topology]]\nid = "bad"\n')
    found = load_declarations([tmp_path], OpTable(), {}, label_root=tmp_path)
    assert list(found.topologies) == ["review"]
    assert [e.source for e in found.errors] == ["bad.toml"]  # a build reports it
    assert found.topology_set().broken.keys() == {"bad"}


def test_a_declarations_path_that_is_gone_is_an_error_not_a_crash(tmp_path: Path) -> None:
    """Reading topologies never raises: a vanished folder is an error of the set."""
    found = load_topologies([tmp_path / "gone"], label_root=tmp_path)
    assert found.topologies == {}
    assert "does not exist" in str(found.errors[0])


SEEDED = """
[[topology]]
id = "panel"
title = "Panel"
coordinator_decisions = ["pick"]
required_evidence = ["scores", "a verdict"]
blackboard_topics = ["scores"]
fanout_strategy = "all answer"
fanin_strategy = "majority"
candidate_expectations = ["cites a source"]
verifier_gates = ["two judges agree"]

[[topology.roles]]
id = "judge"
agent = "reviewer"
count = 3
expected_artifacts = ["scores"]
fanin_obligations = ["score every candidate"]

[[topology.phases]]
id = "judge"
roles = ["judge"]
fanin = true
required_evidence = ["scores"]
coordinator_decision_kinds = ["pick", "rerun"]
"""


def test_the_seed_fields_load_and_are_checked(tmp_path: Path) -> None:
    """Every field of the seed's topology schema loads; a phase's decision kind must be one
    of the topology's coordinator_decisions, and every required evidence needs a role that
    produces it."""
    topology = load(tmp_path, SEEDED).get("panel")
    assert topology.fanin_strategy == "majority"
    assert topology.verifier_gates == ("two judges agree",)
    assert topology.roles[0].fanin_obligations == ("score every candidate",)
    assert topology.phases[0].coordinator_decision_kinds == ("pick", "rerun")
    assert validate_topology(topology, AGENTS) == [
        "phase 'judge' takes decision 'rerun', which is not one of the topology's "
        "coordinator_decisions (pick)",
        "the topology requires evidence 'a verdict', which no role produces (list it in a "
        "role's required_evidence or expected_artifacts)"]

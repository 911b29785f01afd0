"""One operator table: HTTP routes and CLI subcommands are generated from it, and only it."""

from __future__ import annotations

import argparse

from capd.sidecar._args import params_of
from capd.sidecar._table import COMMANDS, command
from capd.sidecar.client.cli import LOCAL_COMMANDS, make_parser
from capd.sidecar.server._api import Api, Router
from capd.sidecar.server._config import load_config
from capd.sidecar.server._daemon import Daemon
from tests.helpers.servers import ROOT


def _cli_paths(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()
               ) -> set[tuple[str, ...]]:
    paths: set[tuple[str, ...]] = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                nested = _cli_paths(sub, (*prefix, name))
                paths |= nested or {(*prefix, name)}
    return paths


def test_http_routes_equal_the_table() -> None:
    """Every route is a table row and every row is a route, method and path alike."""
    daemon = Daemon(load_config(None))
    api = Api(daemon, max_body_bytes=1024)
    assert api.router.routes() == {(row.method, row.path) for row in COMMANDS}


def test_cli_subcommands_equal_the_table_plus_local_commands() -> None:
    """Every CLI subcommand is a table row or one of the declared local commands."""
    expected = {row.cli for row in COMMANDS} | {(name,) for name in LOCAL_COMMANDS}
    assert _cli_paths(make_parser()) == expected


def test_rows_are_unique_and_complete() -> None:
    """No two rows share an id, a route or a CLI path; each has a summary."""
    assert len({r.id for r in COMMANDS}) == len(COMMANDS)
    assert len({(r.method, r.path) for r in COMMANDS}) == len(COMMANDS)
    assert len({r.cli for r in COMMANDS}) == len(COMMANDS)
    assert all(r.summary for r in COMMANDS)


def test_every_table_subcommand_takes_json_and_socket() -> None:
    """Each generated subcommand has --json and --socket, and its path parameters."""
    parser = make_parser()
    for row in COMMANDS:
        params = [p for p in params_of(row.params)
                  if not (row.takes_params and p.arg.at == "body")]  # --params, -p
        positional = [p for p in params if not p.arg.flags and p.info.is_required()]
        required = [word for p in params if p.arg.flags and p.info.is_required()
                    for word in (p.arg.flags[0], (p.choices or ("x",))[0])]
        argv = [*row.cli, *(["X"] * len(positional)), *required,
                "--json", "--socket", "/s"]
        args = parser.parse_args(argv)
        assert args.json is True
        assert args.socket == "/s"
        assert args.row == row.id


def test_every_row_names_a_handler_and_a_renderer_that_exist() -> None:
    """The table holds names; the server and the client each resolve every one."""
    from capd.sidecar.client._render import RENDERERS
    from capd.sidecar.server._handlers import HANDLERS

    assert {row.handler for row in COMMANDS} == set(HANDLERS)
    assert {row.render for row in COMMANDS} <= set(RENDERERS)


def test_every_row_on_one_surface_says_why() -> None:
    """A row that is not an MCP tool carries its reason: operator-only or CLI/HTTP only."""
    for row in COMMANDS:
        if row.mcp is None:
            assert (row.operator_only or row.cli_only), f"{row.id} is CLI-only with no reason"
        else:
            assert row.cli_only is None, row.id
            assert row.operator_only is None, row.id


def test_the_router_answers_the_same_with_and_without_its_call_shortcut() -> None:
    """POST /call/{name} is matched by prefix; every other shape goes the general way."""
    router = Router(COMMANDS)
    call = command("call")
    assert router.match("POST", "/call/notes.append") == (call, {"name": "notes.append"},
                                                          ["POST"])
    assert router.match("GET", "/call/notes.append") == (None, {}, ["POST"])  # 405
    assert router.match("POST", "/call/") == (None, {}, [])  # 404
    assert router.match("POST", "/call/a/b") == (None, {}, [])
    assert router.match("POST", "/queue/j1/retry")[1] == {"id": "j1"}
    assert router.match("GET", "/queue/stats")[0] == command("queue-stats")


def test_every_row_declares_who_may_use_it() -> None:
    """Each row admits operators and maybe agents, nothing else; an operator-only reason
    means operators alone; a row an agent's bridge offers always admits agents."""
    from capd.sidecar._table import COMMANDS

    for row in COMMANDS:
        assert row.roles, row.id
        assert "operator" in row.roles, row.id
        assert set(row.roles) <= {"operator", "agent"}, row.id
        if row.operator_only is not None:
            assert row.roles == ("operator",), row.id
        if row.mcp is not None:
            assert "agent" in row.roles, row.id


def test_the_docs_policy_table_is_the_operator_table() -> None:
    """The documentation's surface x role table (docs/policy.md) is what role_table()
    renders from the rows."""

    from capd.sidecar._table import role_table

    readme = (ROOT / "docs" / "policy.md").read_text()
    start = readme.index("<!-- role-table:start -->\n") + len("<!-- role-table:start -->\n")
    end = readme.index("\n<!-- role-table:end -->")
    assert readme[start:end] == role_table()


def test_a_rows_path_and_its_path_parameters_name_the_same() -> None:
    """A path placeholder with no parameter to fill it, or a path parameter the path does
    not hold, is refused when the row is made."""
    import pytest

    from capd.sidecar._table import JobIn, OperatorCommand

    with pytest.raises(ValueError, match="its path /queue/{job} and its parameters' path "
                                         r"fields \(id\) must name the same"):
        OperatorCommand("x", "X.", "GET", "/queue/{job}", ("x",), "queue_show", params=JobIn)
    with pytest.raises(ValueError, match=r"fields \(none\)"):
        OperatorCommand("x", "X.", "GET", "/queue/{id}", ("x",), "queue_show")

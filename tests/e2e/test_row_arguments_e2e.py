"""An operator row's arguments, as callers send them to the real daemon: a refusal stays
small and quick whatever was sent, an empty value is no value, the body forms the API
always took still work, and the bridge leaves out what a tool's schema does not list."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from tests.helpers.bridge import bridge, data
from tests.helpers.daemon import Start

pytestmark = pytest.mark.slow  # the real daemon, its socket and the bridge


def test_a_huge_wrong_batch_is_refused_small_and_fast_and_the_daemon_serves(
        start: Start) -> None:
    """300,000 wrong items in a batch (near a megabyte) is one problem, said in a few
    hundred bytes at once; 60,000 wrong prompt arguments list ten problems at most."""
    daemon = start()
    began = time.monotonic()
    many = daemon.call("POST", "/calls", {"calls": [1] * 300_000})
    assert many.status == 422, many.body
    assert many.body["errors"][0]["loc"] == ["calls"]
    assert "at most 8 items, not 300000" in many.body["detail"]
    assert len(json.dumps(many.body)) < 2_000
    assert time.monotonic() - began < 5
    wrong = daemon.call("POST", "/prompts/e2e.none", {f"k{i}": i for i in range(60_000)})
    assert wrong.status == 422
    assert len(wrong.body["errors"]) == 10
    assert "and 59997 more" in wrong.body["detail"]
    assert daemon.call("GET", "/livez").status == 200


def test_an_empty_value_is_no_value_and_the_apis_body_forms_still_work(
        start: Start) -> None:
    """`?safety=` and `?format=` mean not given; consent takes its operations as one
    string and a TTL as a number; a token's allow list as one comma-separated string."""
    daemon = start()
    assert daemon.call("GET", "/search?q=echo&safety=&latency_class=").status == 200
    assert daemon.call("GET", "/capabilities/e2e.echo?format=").status == 200
    granted = daemon.call("POST", "/consent", {"operations": "vault.write, mail.send",
                                               "ttl": 3600})
    assert granted.status == 200, granted.body
    assert granted.body["operations"] == ["vault.write", "mail.send"]
    default_ttl = daemon.call("POST", "/consent", {"operations": ["vault.write"], "ttl": ""})
    assert default_ttl.status == 200, default_ttl.body
    token = daemon.call("POST", "/tokens", {"allow": "e2e.echo,e2e.slow", "ttl": 60})
    assert token.status == 200, token.body
    assert token.body["allow"] == ["e2e.echo", "e2e.slow"]


def test_the_bridge_leaves_out_an_argument_its_schema_does_not_list(start: Start) -> None:
    """A model that adds words a tool does not take still gets its answer; one that sends
    a wrong value hears which, in the tool's words."""
    daemon = start()

    async def run() -> tuple[object, object]:
        async with bridge(daemon.socket) as session:
            found = await session.call_tool("search_capabilities",
                                            {"query": "echo", "limit": 3, "verbose": True})
            wrong = await session.call_tool("search_capabilities", {"query": "echo", "k": 0})
            return data(found), wrong

    found, wrong = asyncio.run(run())
    assert isinstance(found, dict)
    assert found["results"]
    assert getattr(wrong, "is_error", False) is True
    assert "k: Input should be greater than or equal to 1" in wrong.content[0].text  # type: ignore[attr-defined]

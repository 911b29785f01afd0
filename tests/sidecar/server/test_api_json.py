"""Response bodies always serialise: an op's odd return value never turns into a 500."""

from __future__ import annotations

from pathlib import Path

import orjson
from pydantic import BaseModel

from capd.sidecar.server._api import RequestIds, dumps


class Point(BaseModel):
    x: int


def test_values_json_cannot_hold_are_rendered() -> None:
    """Paths become strings, sets sorted lists, models their JSON dump."""
    body = {"path": Path("/srv/a"), "set": {3, 1}, "model": Point(x=1), "n": 1}
    assert orjson.loads(dumps(body)) == {"path": "/srv/a", "set": [1, 3], "model": {"x": 1},
                                         "n": 1}


def test_request_ids_are_unique_within_a_boot() -> None:
    """Request ids share a boot prefix and never repeat."""
    ids = RequestIds()
    many = [ids.next() for _ in range(1000)]
    assert len(set(many)) == 1000
    assert len({i.split("-")[0] for i in many}) == 1

"""Parameter JSON Schema generation, pinned by golden files."""

from __future__ import annotations

import json
import os
from enum import StrEnum

import pytest
from pydantic import BaseModel, Field

from capd.registry import parameters_schema
from tests.helpers.servers import TESTS

GOLDEN = TESTS / "golden"


class Priority(StrEnum):
    low = "low"
    high = "high"


class Address(BaseModel):
    city: str = Field(description="City name.")
    zip: str | None = Field(None, description="Postal code, if known.")


class CreateTicket(BaseModel):
    title: str = Field(description="Short title of the ticket; a property named title survives.")
    body: str | None = Field(None, description="Longer text.")
    priority: Priority = Field(Priority.low, description="How urgent.")
    labels: list[str] = Field(default_factory=list, description="Labels to attach.")
    assignee: Address | None = Field(None, description="Where the assignee sits.")
    estimate_h: float | None = Field(None, ge=0, description="Estimated hours.")


class AppendLine(BaseModel):
    note: str = Field(pattern=r"^[a-z]+$", description="Note name.")
    line: str = Field(description="The line.")


class Empty(BaseModel):
    pass


CASES = {"create_ticket": CreateTicket, "append_line": AppendLine, "empty": Empty}


@pytest.mark.parametrize("name", sorted(CASES))
def test_schema_matches_golden(name: str) -> None:
    """The generated schema equals the reviewed golden file."""
    schema = parameters_schema(CASES[name])
    path = GOLDEN / f"{name}.json"
    if os.environ.get("CAPD_UPDATE_GOLDEN"):
        path.write_text(json.dumps(schema, indent=2, sort_keys=True) + "\n")
    assert schema == json.loads(path.read_text())


def _walk(node: object, path: str = "") -> list[str]:
    found: list[str] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "title" and not path.endswith("properties"):
                found.append(path)
            found.extend(_walk(value, f"{path}/{key}"))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found.extend(_walk(value, f"{path}/{i}"))
    return found


def test_no_title_keywords_anywhere() -> None:
    """No schema node keeps a 'title' keyword, but a property called title stays."""
    schema = parameters_schema(CreateTicket)
    assert _walk(schema) == []
    assert "title" in schema["properties"]


def test_optional_is_unwrapped_and_descriptions_kept() -> None:
    """Optional[T] becomes T, and every property keeps its description."""
    props = parameters_schema(CreateTicket)["properties"]
    assert props["body"] == {"type": "string", "description": "Longer text.", "default": None}
    assert "anyOf" not in props["estimate_h"]
    assert props["estimate_h"]["type"] == "number"
    assert props["assignee"]["$ref"] == "#/$defs/Address"
    for name, prop in props.items():
        assert prop.get("description"), name

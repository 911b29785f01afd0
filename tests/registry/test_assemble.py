"""model_assembler: what model_construct builds, without its walk over the fields."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, PrivateAttr

from capd.registry import model_assembler


class _Plain(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    tags: list[str]
    size: int | None = None


class _WithPrivate(BaseModel):
    name: str
    _seen: int = PrivateAttr(default=0)


def test_the_fast_way_builds_what_model_construct_builds() -> None:
    assemble = model_assembler(_Plain, {"name": "a", "tags": ["x"], "size": None})
    assert assemble.__name__ == "assemble"  # the fast way was taken
    values = {"name": "b", "tags": ["y", "z"], "size": 3}
    built = assemble(dict(values))
    reference = _Plain.model_construct(**values)
    assert built == reference
    assert built.model_fields_set == reference.model_fields_set
    assert built.model_dump() == reference.model_dump()
    assert built.__dict__ == values  # in field order, as given


def test_a_model_it_cannot_mirror_falls_back_to_model_construct() -> None:
    """A private attribute needs model_construct's own work: it is used instead."""
    assemble = model_assembler(_WithPrivate, {"name": "a"})
    assert assemble.__name__ == "construct"
    built = assemble({"name": "b"})
    assert built.name == "b"
    assert built._seen == 0


def test_a_sample_out_of_field_order_falls_back() -> None:
    assert model_assembler(_Plain, {"tags": [], "name": "a", "size": None}).__name__ == \
        "construct"

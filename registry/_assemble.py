"""Build a pydantic model from values already of their types, without ``model_construct``'s walk.

``model_construct`` loops over the model's fields in Python on every call; on a hot
path (a call's result, a queued job) that loop is most of the cost. A model keeps
its fields in ``__dict__`` and three slots beside it; with every field given, in
field order (none aliased, no private attributes, no post-init), setting those is
all ``model_construct`` does. :func:`model_assembler` checks that once per model
against ``model_construct`` and hands back ``model_construct`` itself should
pydantic ever build models otherwise.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import BaseModel

M = TypeVar("M", bound=BaseModel)


def model_assembler(model: type[M], sample: dict[str, Any]) -> Callable[[dict[str, Any]], M]:
    """A function making a ``model`` from a dict of every field, in field order, unvalidated.

    The dict becomes the instance's own ``__dict__``: the caller must not keep using
    it. ``sample`` (every field, in order) is built both ways once to check the fast
    way gives what ``model_construct`` gives.
    """
    fields = set(model.model_fields)

    def construct(values: dict[str, Any]) -> M:
        return model.model_construct(**values)

    try:
        slots = vars(BaseModel)
        new = object.__new__
        set_dict = slots["__dict__"].__set__
        set_fields_set = slots["__pydantic_fields_set__"].__set__
        set_extra = slots["__pydantic_extra__"].__set__
        set_private = slots["__pydantic_private__"].__set__
        copy_fields = fields.copy

        def assemble(values: dict[str, Any]) -> M:
            instance: M = new(model)
            set_dict(instance, values)
            set_fields_set(instance, copy_fields())
            set_extra(instance, None)
            set_private(instance, None)
            return instance

        built, constructed = assemble(dict(sample)), model.model_construct(**sample)
        if (list(sample) == list(model.model_fields)
                and built == constructed and repr(built) == repr(constructed)
                and built.model_fields_set == constructed.model_fields_set
                and built.model_dump() == constructed.model_dump()
                and not model.__pydantic_post_init__ and not model.__private_attributes__):
            return assemble
    except Exception:  # any surprise: let pydantic build them
        pass
    return construct

"""The third-party search sets (tests/fixtures/search_sets/) and the figures measured on them.

Each set is a catalogue of real tools with their own descriptions and labelled
queries in a development and a held-out half; tests/fixtures/README.md says how
each was made. ``evaluate`` gives recall@1, recall@5 and MRR (over the first 5).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from capd.registry import Capability, SearchIndex, estimate_tokens
from capd.registry._model import DESCRIPTION_MAX_TOKENS
from capd.registry._search import Method
from capd.registry._upstream import summarize

SETS_DIR = Path(__file__).resolve().parent.parent / "fixtures" / "search_sets"
THIRD_PARTY_SETS = ("workspace", "atlassian", "bfcl_live", "bfcl_python")
Split = Literal["dev", "holdout"]


class Params(BaseModel):
    pass


def _noop(params: Params) -> None:
    return None


@cache
def load_set_catalogue(name: str) -> tuple[Capability, ...]:
    """The catalogue of set ``name``: one capability per third-party tool."""
    caps = []
    for line in (SETS_DIR / name / "catalogue.jsonl").read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        description = row["description"]
        if estimate_tokens(description) > DESCRIPTION_MAX_TOKENS:
            # As capd loads such a tool from an upstream MCP server: cut to the budget.
            description = summarize(description, DESCRIPTION_MAX_TOKENS)
        caps.append(Capability(name=row["name"], summary=row["summary"],
                               description=description, tags=tuple(row["tags"]),
                               parameters=Params, func=_noop))
    return tuple(caps)


def load_set_queries(name: str, split: Split) -> list[tuple[str, str]]:
    """(query, expected capability) pairs of one half of set ``name``."""
    path = SETS_DIR / name / f"queries_{split}.tsv"
    rows = [line.split("\t") for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip() and not line.startswith("#")]
    return [(query, expected) for query, expected in rows]


Ranker = Callable[[str, int], Sequence[str]]


@dataclass(frozen=True)
class Figures:
    """Ranking quality over one labelled set."""

    recall_at_1: float
    recall_at_5: float
    mrr: float
    queries: int


def ranker(index: SearchIndex, method: Method = "hybrid") -> Ranker:
    return lambda query, k: [h.capability.name for h in index.search(query, k=k, method=method)]


def evaluate(rank: Ranker, queries: Sequence[tuple[str, str]]) -> Figures:
    """recall@1, recall@5 and MRR (first 5 results) of ``rank`` over ``queries``."""
    first = hits = 0
    reciprocal = 0.0
    for query, expected in queries:
        results = list(rank(query, 5))
        if expected in results:
            position = results.index(expected)
            hits += 1
            first += position == 0
            reciprocal += 1 / (position + 1)
    n = len(queries)
    return Figures(first / n, hits / n, reciprocal / n, n)

"""The search fixture catalogue and its labelled queries, and a naive baseline scorer."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from pydantic import BaseModel

from capd.registry import Capability, SearchIndex

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


class Params(BaseModel):
    pass


def _noop(params: Params) -> None:
    return None


def _rows(name: str) -> list[list[str]]:
    lines = (FIXTURES / name).read_text(encoding="utf-8").splitlines()
    return [line.split("\t") for line in lines if line.strip() and not line.startswith("#")]


def load_catalogue(copies: int = 1) -> list[Capability]:
    """The fixture catalogue; ``copies`` > 1 adds renamed copies to make a larger one."""
    caps = []
    for copy in range(copies):
        for name, latency, tags, summary in _rows("catalogue.tsv"):
            suffix = "" if copy == 0 else f"_v{copy}"
            caps.append(Capability(
                name=name + suffix, summary=summary, parameters=Params, func=_noop,
                tags=tuple(tags.split(",")), latency_class=latency,  # type: ignore[arg-type]
                timeout_s=5.0 if latency == "inner" else 30.0,
            ))
    return caps


QUERY_SETS = ("queries.tsv", "queries_holdout.tsv")
BLIND_SET = "queries_blind.tsv"


def load_queries(name: str = "queries.tsv") -> list[tuple[str, str]]:
    """(query, expected capability) pairs of one labelled set."""
    return [(q, e) for q, e in _rows(name)]


Ranker = Callable[[str, int], Sequence[str]]


def bm25_ranker(caps: Sequence[Capability]) -> Ranker:
    index = SearchIndex(caps)
    return lambda query, k: [h.capability.name for h in index.search(query, k=k)]


def substring_ranker(caps: Sequence[Capability]) -> Ranker:
    """The naive baseline: count query words (3+ letters) found as substrings of a capsule."""
    docs = [(c.name, f"{c.name} {c.summary} {' '.join(c.tags)}".lower()) for c in caps]

    def rank(query: str, k: int) -> list[str]:
        words = [w for w in query.lower().split() if len(w) >= 3]
        scored = [(sum(w in text for w in words), name) for name, text in docs]
        scored = [s for s in scored if s[0] > 0]
        scored.sort(key=lambda s: (-s[0], s[1]))
        return [name for _, name in scored[:k]]

    return rank


def evaluate(rank: Ranker, queries: Sequence[tuple[str, str]], k: int = 5
             ) -> tuple[float, float]:
    """(recall@k, MRR) of ``rank`` over ``queries``."""
    hits = 0
    reciprocal = 0.0
    for query, expected in queries:
        results = list(rank(query, k))
        if expected in results:
            hits += 1
            reciprocal += 1 / (results.index(expected) + 1)
    return hits / len(queries), reciprocal / len(queries)

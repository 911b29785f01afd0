"""Capability search: BM25 over capsules, exact id/alias first, filters, success boost.

The index is built once per registry (the set of capabilities is fixed until a
reload) as an inverted index, so a query touches only the capabilities that
share a term with it. Fields are weighted by repeating their terms: name and
aliases x3, tags and summary x2, description x1.

Token estimate (documented, used for the capsule limit and context figures):
one token per four characters, rounded up — close to what common LLM
tokenizers produce for English prose and JSON.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from ._model import Capability
from ._thesaurus import EXPANSION_WEIGHT, build_expansions

_WORD = re.compile(r"[a-z0-9]+")
_STOP = frozenset({
    "a", "an", "and", "are", "as", "at", "be", "by", "can", "do", "for", "from", "get", "how",
    "i", "in", "into", "is", "it", "me", "my", "of", "on", "or", "please", "show", "some",
    "that", "the", "this", "to", "up", "what", "when", "where", "which", "with", "you", "your",
})
FIELD_WEIGHTS = {"name": 3, "aliases": 3, "tags": 2, "summary": 2, "description": 1}


def estimate_tokens(text: str) -> int:
    """Tokens in ``text`` by the documented estimate: ceil(characters / 4)."""
    return math.ceil(len(text) / 4)


def _stem(word: str) -> str:
    """A light, consistent stemmer: plural first, then -ing/-ed, then a final -e.

    ``meetings``, ``meeting`` and ``meet`` all become ``meet``; ``changes`` and
    ``changed`` become ``chang``.
    """
    if len(word) <= 3:
        return word
    if word.endswith("ies") and len(word) > 4:
        word = word[:-3] + "y"
    elif (word.endswith("es") and word[-3:-2] in ("s", "x", "z")) or word.endswith(("ches",
                                                                                    "shes")):
        word = word[:-2]
    elif word.endswith("s") and not word.endswith(("ss", "us", "is")):
        word = word[:-1]
    if word.endswith("ing") and len(word) > 5:
        word = word[:-3]
    elif word.endswith("ied") and len(word) > 4:
        word = word[:-3] + "y"
    elif word.endswith("ed") and len(word) > 4:
        word = word[:-2]
    if word.endswith("e") and len(word) > 4:
        word = word[:-1]
    return word


def tokenize(text: str) -> list[str]:
    """Lowercase words of two or more characters, stop words dropped, lightly stemmed.

    One-character words carry nothing to rank by: the "s" of "what's" would
    otherwise match every capsule with a possessive in it.
    """
    return [_stem(w) for w in _WORD.findall(text.lower()) if len(w) > 1 and w not in _STOP]


def _document(cap: Capability) -> list[str]:
    fields = {
        "name": cap.name.replace(".", " ").replace("_", " ").replace("-", " "),
        "aliases": " ".join(a.replace(".", " ").replace("_", " ") for a in cap.aliases),
        "tags": " ".join(cap.tags),
        "summary": cap.summary,
        "description": cap.description,
    }
    terms: list[str] = []
    for field, text in fields.items():
        terms.extend(tokenize(text) * FIELD_WEIGHTS[field])
    return terms


_EXPANSIONS = build_expansions(tokenize)


def expand(terms: Iterable[str]) -> dict[str, float]:
    """Query terms at weight 1, and their thesaurus relatives at ``EXPANSION_WEIGHT``."""
    weights = dict.fromkeys(terms, 1.0)
    for term in list(weights):
        for related in _EXPANSIONS.get(term, ()):
            weights.setdefault(related, EXPANSION_WEIGHT)
    return weights


@dataclass(frozen=True)
class Hit:
    """One search result: the capability and its score (exact matches score +inf)."""

    capability: Capability
    score: float
    exact: bool = False


class SearchIndex:
    """An inverted BM25 index over a fixed set of capabilities."""

    def __init__(self, capabilities: Iterable[Capability], *, k1: float = 1.2,
                 b: float = 0.75) -> None:
        self._caps = {c.name: c for c in capabilities}
        self._k1 = k1
        self._b = b
        self._postings: dict[str, list[tuple[str, int]]] = {}
        self._lengths: dict[str, int] = {}
        self._exact: dict[str, str] = {}
        for cap in self._caps.values():
            terms = _document(cap)
            self._lengths[cap.name] = len(terms)
            for term, count in Counter(terms).items():
                self._postings.setdefault(term, []).append((cap.name, count))
            for key in (cap.name, *cap.aliases):
                self._exact[key.lower()] = cap.name
        total = sum(self._lengths.values())
        self._avg_length = total / len(self._lengths) if self._lengths else 1.0
        n = len(self._caps)
        self._idf = {t: math.log(1 + (n - len(p) + 0.5) / (len(p) + 0.5))
                     for t, p in self._postings.items()}

    def __len__(self) -> int:
        return len(self._caps)

    def search(
        self,
        query: str,
        *,
        k: int = 5,
        tags: Sequence[str] = (),
        latency_class: str | None = None,
        allowed: Callable[[str], bool] = lambda _name: True,
        boost: Mapping[str, float] | None = None,
    ) -> list[Hit]:
        """The ``k`` best capabilities for ``query`` that pass every filter, best first.

        An exact id or alias match comes first. ``boost`` multiplies scores
        (observed success rates); ``allowed`` decides membership (live only,
        a profile, host requirements).
        """
        wanted_tags = set(tags)

        def passes(cap: Capability) -> bool:
            if wanted_tags and not wanted_tags <= set(cap.tags):
                return False
            if latency_class and cap.latency_class not in (latency_class, "both"):
                return False
            return allowed(cap.name)

        hits: list[Hit] = []
        exact_name = self._exact.get(query.strip().lower())
        if exact_name is not None and passes(self._caps[exact_name]):
            hits.append(Hit(self._caps[exact_name], math.inf, exact=True))
        scores: dict[str, float] = {}
        k1, b, avg = self._k1, self._b, self._avg_length
        for term, weight in expand(tokenize(query)).items():
            idf = self._idf.get(term)
            if idf is None:
                continue
            for name, tf in self._postings[term]:
                norm = tf * (k1 + 1) / (tf + k1 * (1 - b + b * self._lengths[name] / avg))
                scores[name] = scores.get(name, 0.0) + weight * idf * norm
        factors = boost or {}
        ranked = sorted(((s * factors.get(n, 1.0), n) for n, s in scores.items()),
                        key=lambda pair: (-pair[0], pair[1]))
        for score, name in ranked:
            if len(hits) >= k:
                break
            if name == exact_name:
                continue
            cap = self._caps[name]
            if passes(cap):
                hits.append(Hit(cap, score))
        if not hits and wanted_tags and not tokenize(query):
            # A pure tag filter: list what carries the tags.
            hits = [Hit(c, 0.0) for c in sorted(self._caps.values(), key=lambda c: c.name)
                    if passes(c)][:k]
        return hits[:k]


def success_boost(calls: Mapping[str, Mapping[str, int]]) -> dict[str, float]:
    """0.75 + 0.25 x the smoothed success rate ((ok + 1) / (calls + 2)) per capability."""
    boost = {}
    for name, counts in calls.items():
        total = sum(counts.values())
        ok = counts.get("success", 0) + counts.get("partial", 0)
        boost[name] = 0.75 + 0.25 * (ok + 1) / (total + 2)
    return boost

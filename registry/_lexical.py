"""The lexical half of search: BM25 over capsule terms, thesaurus relatives, typo repair.

Fields are weighted by repeating their terms (see :data:`FIELD_WEIGHTS`). Each
term's postings are two arrays built once per index: the documents that hold it
and their BM25 contribution (idf x saturated term frequency), so a query adds a
handful of array slices into one score vector and never loops over documents in
Python.

A query word the catalogue does not use (after stemming) and that is long
enough to be a misspelling is replaced by the nearest catalogue term within a
small edit distance (optimal string alignment: a swap of two letters is one
edit), found with rapidfuzz, at :data:`TYPO_WEIGHT`. Each query term then brings
its thesaurus relatives at ``EXPANSION_WEIGHT``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from rapidfuzz import process
from rapidfuzz.distance import OSA

from ._terms import STOP_WORDS, stem, surface_forms, tokenize, words
from ._thesaurus import EXPANSION_WEIGHT, build_expansions

Scores = npt.NDArray[np.float32]

FIELD_WEIGHTS: dict[str, float] = {"name": 3, "aliases": 3, "tags": 2, "summary": 2,
                                   "description": 0.5}
TYPO_WEIGHT = 0.8
# The shortest query term repaired at one edit, and at two.
_TYPO_ONE_EDIT = 5
_TYPO_TWO_EDITS = 8

_EXPANSIONS = build_expansions(tokenize)


def expand(terms: Iterable[str]) -> dict[str, float]:
    """Query terms at weight 1, and their thesaurus relatives at ``EXPANSION_WEIGHT``."""
    weights = dict.fromkeys(terms, 1.0)
    for term in list(weights):
        for related in _EXPANSIONS.get(term, ()):
            weights.setdefault(related, EXPANSION_WEIGHT)
    return weights


@dataclass(frozen=True)
class QueryTerm:
    """One term a query looks for: its weight and how it came from the query."""

    term: str
    weight: float
    source: str          # the query word it stands for
    how: str = "word"    # "word", "typo" (repaired) or "thesaurus" (a relative)


class LexicalIndex:
    """BM25 over a fixed list of documents, each a mapping of field name to text."""

    def __init__(self, documents: Sequence[Mapping[str, str]], *, k1: float = 1.2,
                 b: float = 0.75, known: Callable[[str], bool] = lambda _word: False) -> None:
        self.size = len(documents)
        self._known = known
        lengths = np.zeros(self.size, dtype=np.float32)
        counts: dict[str, list[tuple[int, float]]] = {}
        self._surface: dict[str, str] = {}
        for position, fields in enumerate(documents):
            weighted: dict[str, float] = {}
            for field, text in fields.items():
                terms = tokenize(text)
                weight = FIELD_WEIGHTS[field]
                for term, count in Counter(terms).items():
                    weighted[term] = weighted.get(term, 0.0) + weight * count
                lengths[position] += weight * len(terms)
                for term, word in surface_forms(text).items():
                    self._surface.setdefault(term, word)
            for term, frequency in weighted.items():
                counts.setdefault(term, []).append((position, frequency))
        average = float(lengths.mean()) if self.size else 1.0
        norm = k1 * (1 - b + b * lengths / max(average, 1.0))
        self._postings: dict[str, tuple[npt.NDArray[np.int32], Scores]] = {}
        for term, rows in counts.items():
            ids = np.fromiter((p for p, _ in rows), dtype=np.int32, count=len(rows))
            freq = np.fromiter((c for _, c in rows), dtype=np.float32, count=len(rows))
            idf = math.log(1 + (self.size - len(rows) + 0.5) / (len(rows) + 0.5))
            contribution = (idf * freq * (k1 + 1) / (freq + norm[ids])).astype(np.float32)
            self._postings[term] = (ids, contribution)
        self._vocabulary = list(self._postings)
        self._frequency = {term: len(ids) for term, (ids, _) in self._postings.items()}

    def __contains__(self, term: object) -> bool:
        return term in self._postings

    def surface(self, term: str) -> str:
        """A word of the catalogue that stems to ``term`` (``term`` itself if none)."""
        return self._surface.get(term, term)

    def repair(self, term: str) -> str | None:
        """The catalogue term nearest a misspelt ``term``, or None when none is close."""
        if term in self._postings or not term.isalpha() or len(term) < _TYPO_ONE_EDIT:
            return None
        limit = 2 if len(term) >= _TYPO_TWO_EDITS else 1
        found = process.extract(term, self._vocabulary, scorer=OSA.distance,
                                score_cutoff=limit, limit=None)
        # A misspelling keeps its first letter far more often than not; requiring it
        # stops a rare real word from turning into its neighbour (picker -> ticker).
        found = [hit for hit in found if hit[0][:1] == term[:1]]
        if not found:
            return None
        best = min(found, key=lambda hit: (hit[1], -self._frequency[hit[0]], hit[0]))
        return str(best[0])

    def query_terms(self, query: str, *, expand_relatives: bool = True) -> list[QueryTerm]:
        """The weighted terms ``query`` looks for, repaired and expanded."""
        chosen: dict[str, QueryTerm] = {}
        for word in words(query):
            if len(word) < 2 or word in STOP_WORDS:
                continue
            term = stem(word)
            if term in chosen:
                continue
            # A word the language model knows as one token is a real word, not a typo.
            fixed = None if self._known(word) else self.repair(term)
            if fixed is None:
                chosen[term] = QueryTerm(term, 1.0, term)
            elif fixed not in chosen:
                chosen[fixed] = QueryTerm(fixed, TYPO_WEIGHT, term, "typo")
        if expand_relatives:
            for qt in list(chosen.values()):
                for related in sorted(_EXPANSIONS.get(qt.term, ())):
                    if related not in chosen:
                        chosen[related] = QueryTerm(related, EXPANSION_WEIGHT * qt.weight,
                                                    qt.source, "thesaurus")
        return list(chosen.values())

    def scores(self, terms: Sequence[QueryTerm]) -> Scores:
        """BM25 score of every document for ``terms`` (zero where no term occurs)."""
        total = np.zeros(self.size, dtype=np.float32)
        for qt in terms:
            posting = self._postings.get(qt.term)
            if posting is not None:
                ids, contribution = posting
                total[ids] += qt.weight * contribution
        return total

    def matched(self, position: int, terms: Sequence[QueryTerm]) -> list[QueryTerm]:
        """Which of ``terms`` occur in document ``position``."""
        found = []
        for qt in terms:
            posting = self._postings.get(qt.term)
            if posting is None:
                continue
            ids = posting[0]
            at = int(np.searchsorted(ids, position))
            if at < len(ids) and ids[at] == position:
                found.append(qt)
        return found

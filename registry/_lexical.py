"""The lexical half of search: BM25 over capsule terms, thesaurus relatives, typo repair.

Fields are weighted by repeating their terms (see :data:`FIELD_WEIGHTS`). Each
term's postings are two arrays built once per index: the documents that hold it
and their BM25 contribution (idf x saturated term frequency), so a query adds a
handful of array slices into one score vector and never loops over documents in
Python. A term held by more than one document in :data:`_DENSE_SHARE` keeps its
contributions as one dense row instead (zero where it does not occur): adding a
whole row is cheaper than scattering thousands of entries, and adds exactly the
same numbers.

A query word the catalogue does not use (after stemming) and that is long
enough to be a misspelling is replaced by the nearest catalogue term within a
small edit distance (optimal string alignment: a swap of two letters is one
edit), found with rapidfuzz, at :data:`TYPO_WEIGHT`. Only catalogue terms with
the misspelling's first letter and a length within the edit limit of its own are
compared (no other term can qualify), so a repair looks at a few dozen terms,
not the whole vocabulary. Each query term then brings its thesaurus relatives at
``EXPANSION_WEIGHT``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import NamedTuple

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
# A term in more than this share of the documents keeps a dense row of contributions.
_DENSE_SHARE = 1 / 8

_EXPANSIONS = build_expansions(tokenize)


def expand(terms: Iterable[str]) -> dict[str, float]:
    """Query terms at weight 1, and their thesaurus relatives at ``EXPANSION_WEIGHT``."""
    weights = dict.fromkeys(terms, 1.0)
    for term in list(weights):
        for related in _EXPANSIONS.get(term, ()):
            weights.setdefault(related, EXPANSION_WEIGHT)
    return weights


class QueryTerm(NamedTuple):
    """One term a query looks for: its weight and how it came from the query.

    (A named tuple: a long query makes a hundred of them, and a frozen dataclass
    takes several times as long to make.)
    """

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
        self._dense: dict[str, Scores] = {}
        for term, rows in counts.items():
            ids = np.fromiter((p for p, _ in rows), dtype=np.int32, count=len(rows))
            freq = np.fromiter((c for _, c in rows), dtype=np.float32, count=len(rows))
            idf = math.log(1 + (self.size - len(rows) + 0.5) / (len(rows) + 0.5))
            contribution = (idf * freq * (k1 + 1) / (freq + norm[ids])).astype(np.float32)
            self._postings[term] = (ids, contribution)
            if len(rows) > self.size * _DENSE_SHARE:
                dense = np.zeros(self.size, dtype=np.float32)
                dense[ids] = contribution
                self._dense[term] = dense
        self._frequency = {term: len(ids) for term, (ids, _) in self._postings.items()}
        # Typo candidates by first letter, then by length (see repair).
        self._by_initial: dict[str, dict[int, list[str]]] = {}
        for term in self._postings:
            self._by_initial.setdefault(term[:1], {}).setdefault(len(term), []).append(term)

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
        # A misspelling keeps its first letter far more often than not; requiring it
        # stops a rare real word from turning into its neighbour (picker -> ticker).
        # A term whose length differs by more than ``limit`` is more than ``limit``
        # edits away.
        by_length = self._by_initial.get(term[:1], {})
        candidates = [t for n in range(len(term) - limit, len(term) + limit + 1)
                      for t in by_length.get(n, ())]
        if not candidates:
            return None
        found = process.extract(term, candidates, scorer=OSA.distance,
                                score_cutoff=limit, limit=None)
        if not found:
            return None
        best = min(found, key=lambda hit: (hit[1], -self._frequency[hit[0]], hit[0]))
        return str(best[0])

    def query_terms(self, query: str, *, expand_relatives: bool = True,
                    query_words: Sequence[str] | None = None) -> list[QueryTerm]:
        """The weighted terms ``query`` looks for, repaired and expanded.

        ``query_words``: ``words(query)`` when the caller has it already.
        """
        chosen: dict[str, QueryTerm] = {}
        postings, known = self._postings, self._known
        for word in words(query) if query_words is None else query_words:
            if len(word) < 2 or word in STOP_WORDS:
                continue
            term = stem(word)
            if term in chosen:
                continue
            # A catalogue term needs no repair; a word the language model knows as one
            # token is a real word, not a typo.
            fixed = None if term in postings or known(word) else self.repair(term)
            if fixed is None:
                chosen[term] = QueryTerm(term, 1.0, term)
            elif fixed not in chosen:
                chosen[fixed] = QueryTerm(fixed, TYPO_WEIGHT, term, "typo")
        if expand_relatives:
            for qt in list(chosen.values()):
                relatives = _EXPANSIONS.get(qt.term)
                if not relatives:
                    continue
                for related in sorted(relatives):
                    if related not in chosen:
                        chosen[related] = QueryTerm(related, EXPANSION_WEIGHT * qt.weight,
                                                    qt.source, "thesaurus")
        return list(chosen.values())

    def scores(self, terms: Sequence[QueryTerm]) -> Scores:
        """BM25 score of every document for ``terms`` (zero where no term occurs)."""
        # Each document gets total + weight x contribution for each of its terms, in the
        # order of the terms, in float32, whichever way it is added: a run of sparse
        # terms is added in one call (np.add.at adds in the order of its indices), a
        # dense row on its own.
        total = np.zeros(self.size, dtype=np.float32)
        run_ids: list[npt.NDArray[np.int32]] = []
        run_values: list[Scores] = []
        for qt in terms:
            posting = self._postings.get(qt.term)
            if posting is None:
                continue
            dense = self._dense.get(qt.term)
            if dense is not None:
                _add_run(total, run_ids, run_values)
                total += dense if qt.weight == 1.0 else qt.weight * dense
            else:
                ids, contribution = posting
                run_ids.append(ids)
                run_values.append(contribution if qt.weight == 1.0
                                  else qt.weight * contribution)
        _add_run(total, run_ids, run_values)
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


def _add_run(total: Scores, ids: list[npt.NDArray[np.int32]], values: list[Scores]) -> None:
    """Add a run of sparse postings to ``total``, in order, and empty the run."""
    if len(ids) == 1:
        np.add.at(total, ids[0], values[0])
    elif ids:
        np.add.at(total, np.concatenate(ids), np.concatenate(values))
    ids.clear()
    values.clear()

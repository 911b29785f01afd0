"""Capability search: BM25 and static embeddings, fused; exact id/alias first; never empty.

Two rankers look at every capability:

- **lexical** (``_lexical.py``): BM25 over name, aliases, tags, summary and
  description, with a light stemmer that also meets British and American
  spellings, typo repair against the catalogue's own terms, and thesaurus
  relatives at reduced weight;
- **semantic** (``_embed.py``): the cosine between the query's and the capsule's
  static embedding (WordLlama), which finds paraphrases that share no word
  ("put on some jazz" for a music player).

They are fused by a convex combination of the two scores, each scaled to
[0, 1] within the query (:class:`Fusion`; reciprocal-rank fusion is the
alternative that ``bench/search.py`` measures). An exact id or alias comes
first, filters decide membership, and the observed success rate multiplies the
fused score. A query with any content gets the best ``k`` capabilities that pass
the filters, never an empty list; :attr:`Ranking.confidence`, the margin of the
first over the second, tells an agent when to ask rather than guess.

Capsule vectors are computed once per index build, and with a ``cache_dir``
they are kept on disk by content hash, so a reload embeds only what changed.

Token estimate (documented, used for the capsule limit and context figures):
one token per four characters, rounded up — close to what common LLM
tokenizers produce for English prose and JSON.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import numpy.typing as npt
import structlog

from ._embed import Embedder, EmbeddingModelMissing, Vectors, embed_with_cache, load_embedder
from ._lexical import FIELD_WEIGHTS, LexicalIndex, QueryTerm, Scores, expand
from ._model import Capability, estimate_tokens
from ._names import without_mark
from ._terms import STOP_WORDS, tokenize, words

__all__ = [
    "FIELD_WEIGHTS", "Explanation", "Fusion", "Hit", "Method", "Ranking", "SearchIndex",
    "estimate_tokens", "expand", "success_boost", "tokenize",
]

log = structlog.get_logger("capd.search")

Method = Literal["hybrid", "bm25", "semantic"]


@dataclass(frozen=True)
class Fusion:
    """How the lexical and the semantic score are combined.

    ``convex``: ``weight`` x BM25 / best BM25 + (1 - ``weight``) x the cosine
    rescaled so that the query's mean cosine is 0 and its best is 1.
    ``rrf``: reciprocal-rank fusion, ``weight / (rrf_k + lexical rank) + (1 -
    weight) / (rrf_k + semantic rank)``.
    """

    method: Literal["convex", "rrf"] = "convex"
    weight: float = 0.6
    rrf_k: float = 60.0


DEFAULT_FUSION = Fusion()
SEMANTIC_SPREAD_FLOOR = 0.2
_BLOCK_ROWS = 1024


@dataclass(frozen=True)
class Explanation:
    """Why a capability ranked where it did.

    ``terms``: query terms found in the capsule, as ``word``, ``typo->term`` or
    ``word~relative`` (a thesaurus relative). ``neighbours``: the capsule's words
    nearest the query in the embedding space. ``lexical`` is the BM25 score,
    ``semantic`` the cosine.
    """

    terms: tuple[str, ...]
    neighbours: tuple[str, ...]
    lexical: float
    semantic: float


@dataclass(frozen=True)
class Hit:
    """One search result: the capability and its score (exact matches score +inf)."""

    capability: Capability
    score: float
    exact: bool = False
    explanation: Explanation | None = None


@dataclass(frozen=True)
class Ranking:
    """The hits of one search, best first, and how sure the first one is.

    ``confidence`` is in [0, 1]: 1 for an exact id or alias, else the margin of the
    first fused score over the second (the first's score when it is alone), 0 for
    no hit. On the third-party development sets the first hit was right 38% of the
    time below 0.1 (ask, or show the list) and 94% of the time from 0.3 up.
    """

    hits: list[Hit]
    confidence: float


def _fields(cap: Capability) -> dict[str, str]:
    return {
        "name": cap.name.replace(".", " ").replace("_", " ").replace("-", " "),
        "aliases": " ".join(a.replace(".", " ").replace("_", " ").replace("-", " ")
                            for a in cap.aliases),
        "tags": " ".join((*cap.tags, *cap.provides)),
        "summary": cap.summary,
        "description": cap.description,
    }


def semantic_text(cap: Capability) -> str:
    """What the embedding of a capability is made of: its name's words, tags and summary."""
    fields = _fields(cap)
    return ". ".join(t for t in (fields["name"], fields["aliases"], fields["tags"],
                                 cap.summary) if t)


class SearchIndex:
    """Lexical and semantic indexes over a fixed set of capabilities.

    ``cache_dir`` (optional) keeps capsule vectors across builds; ``embedder``
    replaces the default model (tests). When the default model is not installed
    the index logs ``search_semantic_unavailable`` and ranks by BM25 alone.
    """

    def __init__(self, capabilities: Iterable[Capability], *, k1: float = 1.2,
                 b: float = 0.75, cache_dir: Path | None = None,
                 embedder: Embedder | None = None, fusion: Fusion = DEFAULT_FUSION) -> None:
        # Ordered by name, so that a stable sort breaks ties by name.
        caps = sorted({c.name: c for c in capabilities}.values(), key=lambda c: c.name)
        if embedder is None:
            try:
                embedder = load_embedder()
            except EmbeddingModelMissing as exc:
                log.warning("search_semantic_unavailable", error=str(exc))
        vectors: Vectors | None = None
        embedded = 0
        if embedder is not None and caps:
            texts = [semantic_text(c) for c in caps]
            vectors, embedded = embed_with_cache(embedder, texts, cache_dir)
        self._setup(caps, k1, b, fusion, embedder, vectors)
        self.embedded = embedded

    def _setup(self, caps: list[Capability], k1: float, b: float, fusion: Fusion,
               embedder: Embedder | None, vectors: Vectors | None) -> None:
        """Build the lexical index and lookups over ``caps`` (sorted by name), with their
        capsule ``vectors`` (row for row)."""
        self._caps = caps
        self._k1, self._b = k1, b
        self._position = {c.name: i for i, c in enumerate(caps)}
        self._fusion = fusion
        self._exact: dict[str, int] = {}
        for i, cap in enumerate(caps):
            for key in (cap.name, *cap.aliases):
                self._exact[key.lower()] = i
        self._embedder = embedder
        known = embedder.knows if embedder is not None else (lambda _word: False)
        self._lexical = LexicalIndex([_fields(c) for c in caps], k1=k1, b=b, known=known)
        self._vectors = vectors
        self._blocks: list[tuple[Vectors, slice]] = []
        if vectors is not None:
            self._blocks = [(vectors[start:start + _BLOCK_ROWS],
                             slice(start, start + _BLOCK_ROWS))
                            for start in range(0, len(vectors), _BLOCK_ROWS)]
        self.embedded = 0

    def reach(self, keep: Callable[[Capability], bool]) -> tuple[int, ...]:
        """The positions of the capabilities ``keep`` takes: the same set, the same key
        (exact, so two reaches never share an index)."""
        return tuple(i for i, cap in enumerate(self._caps) if keep(cap))

    def subset(self, reach: Sequence[int]) -> SearchIndex:
        """The index of the capabilities at positions ``reach`` (what :meth:`reach`
        answers), ranked as if no other existed: document frequencies, lengths and every
        normalisation are over them alone, so a restricted caller's scores never move
        with what it cannot see. The capsule vectors are shared (sliced), never embedded
        again. Blocking: call it off the loop.
        """
        chosen = list(reach)
        index = object.__new__(SearchIndex)
        vectors = None
        if self._vectors is not None and chosen:
            vectors = np.ascontiguousarray(self._vectors[chosen])
        index._setup([self._caps[i] for i in chosen], self._k1, self._b, self._fusion,
                      self._embedder, vectors)
        return index

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
        method: Method = "hybrid",
    ) -> list[Hit]:
        """The ``k`` best capabilities for ``query`` that pass every filter, best first.

        See :meth:`rank`, which also says how sure the first hit is.
        """
        return self.rank(query, k=k, tags=tags, latency_class=latency_class, allowed=allowed,
                         boost=boost, method=method).hits

    def rank(
        self,
        query: str,
        *,
        k: int = 5,
        tags: Sequence[str] = (),
        latency_class: str | None = None,
        allowed: Callable[[str], bool] = lambda _name: True,
        boost: Mapping[str, float] | None = None,
        method: Method = "hybrid",
        explain: bool = False,
    ) -> Ranking:
        """The ``k`` best capabilities for ``query`` that pass every filter, and a confidence.

        An exact id or alias match (``@`` or not) comes first. ``boost`` multiplies scores
        (observed success rates); ``allowed`` decides membership (live only, a
        profile, host requirements). With ``method="hybrid"`` (the default) or
        ``"semantic"``, a query with any content returns ``k`` hits when ``k``
        capabilities pass the filters; ``"bm25"`` returns only capabilities that
        share a term with the query. A query with no content and tags lists the
        capabilities carrying them. ``explain`` attaches an :class:`Explanation`.
        """
        wanted_tags = set(tags)

        def passes(i: int) -> bool:
            cap = self._caps[i]
            if wanted_tags and not wanted_tags <= set(cap.tags):
                return False
            if latency_class and cap.latency_class not in (latency_class, "both"):
                return False
            return allowed(cap.name)

        exact = self._exact.get(without_mark(query.strip()).lower())
        hits: list[Hit] = []
        if exact is not None and passes(exact):
            hits.append(Hit(self._caps[exact], math.inf, exact=True))
        query_words = words(query)
        terms = (self._lexical.query_terms(query, query_words=query_words)
                 if method != "semantic" else [])
        lexical = self._lexical.scores(terms)
        semantic, query_vector = self._semantic(query, terms, method)
        fused = self._fuse(lexical, semantic)
        if boost:
            self._boost(fused, boost)
        content = bool(query_words)
        if semantic is None or not content:
            # BM25 alone (or no query): only capabilities that share a term rank.
            fused[lexical <= 0] = -np.inf
        chosen = self._pick(fused, passes, k, exclude=exact)
        scores = [float(fused[i]) for i in chosen]
        if not chosen and not hits and (content or wanted_tags) and (
                method != "bm25" or not content):
            # Nothing to rank by (no term known, no model): list what passes, by name.
            chosen = [i for i in range(len(self._caps)) if i != exact and passes(i)][:k]
            scores = [0.0] * len(chosen)
        for i, score in zip(chosen, scores, strict=True):
            if len(hits) >= k:
                break
            explanation = (self._explain(i, terms, lexical, semantic, query_vector)
                           if explain else None)
            hits.append(Hit(self._caps[i], score, explanation=explanation))
        return Ranking(hits[:k], _confidence(hits[:k]))

    # ---------------------------------------------------------------- internals

    def _semantic(self, query: str, terms: Sequence[QueryTerm], method: Method
                  ) -> tuple[Scores | None, Vectors | None]:
        """Cosines of every capsule with the query (typos repaired), or None when off."""
        if method == "bm25" or self._embedder is None or self._vectors is None:
            return None, None
        repaired = {qt.source: self._lexical.surface(qt.term) for qt in terms if qt.how == "typo"}
        text = (" ".join(self._repair_word(w, repaired) for w in query.split())
                if repaired else query)
        vector = self._embedder.embed([text])[0]
        if not vector.any():
            return None, None
        cosines: Scores = np.empty(len(self._vectors), dtype=np.float32)
        # In blocks small enough that BLAS stays on this thread: a threaded product over
        # 10,000 rows is no faster on two cores, and a descheduled helper thread makes
        # the slowest searches ten times slower (p99 12 ms against 0.5 ms, measured).
        # This product reads every capsule vector (10 MB at 10,000 capabilities) and is
        # most of a search's time.
        for rows, block in self._blocks:
            np.dot(rows, vector, out=cosines[block])
        return cosines, vector

    def _boost(self, fused: Scores, boost: Mapping[str, float]) -> None:
        """Multiply the fused scores of the capabilities ``boost`` names by their factors.

        A fused score can be negative (a cosine below the query's mean): a factor under 1
        must still lower it, so it divides those.
        """
        found = list(map(self._position.get, boost.keys()))
        factors = list(boost.values())
        if None in found:
            factors = [f for at, f in zip(found, factors, strict=True) if at is not None]
            found = [at for at in found if at is not None]
        if not found:
            return
        positions = np.fromiter(found, dtype=np.intp, count=len(found))
        if not set(map(type, factors)) <= {float, int}:
            # Not plain Python numbers: keep numpy's promotion of each product.
            for position, factor in zip(positions.tolist(), factors, strict=True):
                value = fused[position]
                fused[position] = value * factor if value >= 0 else value / factor
            return
        # A Python number meets a float32 score as a float32: the same products, at once.
        scale = np.fromiter(factors, dtype=np.float32, count=len(factors))
        values = fused[positions]
        up = values >= 0
        boosted = np.multiply(values, scale, out=np.empty_like(values), where=up)
        np.divide(values, scale, out=boosted, where=~up)
        fused[positions] = boosted

    @staticmethod
    def _repair_word(word: str, repaired: Mapping[str, str]) -> str:
        terms = tokenize(word)
        if len(terms) == 1 and terms[0] in repaired:
            return repaired[terms[0]]
        return word

    def _fuse(self, lexical: Scores, semantic: Scores | None) -> Scores:
        """One score per capability from the two rankers (see :class:`Fusion`)."""
        best = float(lexical.max()) if len(lexical) else 0.0
        if semantic is None:
            return (lexical / best).astype(np.float32) if best > 0 else lexical.copy()
        fusion = self._fusion
        if fusion.method == "rrf":
            fused = (1 - fusion.weight) / (fusion.rrf_k + _ranks(semantic))
            if best > 0:
                lexical_part = fusion.weight / (fusion.rrf_k + _ranks(lexical))
                fused = np.where(lexical > 0, fused + lexical_part, fused)
            return fused.astype(np.float32)
        mean = _mean(semantic)
        # A floor under the spread: in a small catalogue the best and the mean cosine can
        # be close, and dividing by their gap would blow a tiny difference up to 1.
        spread = max(float(semantic.max()) - mean, SEMANTIC_SPREAD_FLOOR)
        # (1 - weight) x (semantic - mean) / spread + weight x (lexical / best), each step
        # in float32, in place.
        convex: Scores = np.subtract(semantic, mean, dtype=np.float32)
        convex /= spread
        convex *= 1 - fusion.weight
        if best > 0:
            lexical_part = np.divide(lexical, best, dtype=np.float32)
            lexical_part *= fusion.weight
            convex += lexical_part
        return convex

    def _pick(self, fused: Scores, passes: Callable[[int], bool], k: int,
              exclude: int | None) -> list[int]:
        """The best ``k`` positions that pass, best first, ties by name.

        Only the best few dozen are sorted: the candidates are every position scoring
        at least the ``depth``-th best score (ties included), and ``depth`` grows only
        when filters reject too many of them.
        """
        total = len(fused)
        depth = min(total, max(4 * k, 32))
        while True:
            complete = depth >= total
            if complete:
                top = np.arange(total)
            else:
                kth = np.partition(fused, total - depth)[total - depth]
                if np.isfinite(kth):
                    top = np.flatnonzero(fused >= kth)
                else:  # fewer than ``depth`` finite scores: they are all the candidates
                    top = np.flatnonzero(np.isfinite(fused))
                    complete = True
            order = top[np.lexsort((top, -fused[top]))]
            finite = np.isfinite(fused[order])
            chosen: list[int] = []
            for i, ok in zip(order.tolist(), finite.tolist(), strict=True):
                if ok and i != exclude and passes(i):
                    chosen.append(i)
                    if len(chosen) == k:
                        return chosen
            if complete or len(top) >= total:
                return chosen
            depth = min(total, depth * 8)

    def _explain(self, i: int, terms: Sequence[QueryTerm], lexical: Scores,
                 semantic: Scores | None, query_vector: Vectors | None) -> Explanation:
        matched = []
        for qt in self._lexical.matched(i, terms):
            if qt.how == "typo":
                matched.append(f"{qt.source}->{qt.term}")
            elif qt.how == "thesaurus":
                matched.append(f"{qt.source}~{qt.term}")
            else:
                matched.append(qt.term)
        neighbours: tuple[str, ...] = ()
        if query_vector is not None and self._embedder is not None:
            cap = self._caps[i]
            candidates = sorted({w for w in words(f"{_fields(cap)['name']} {cap.summary}")
                                 if len(w) > 2 and w not in STOP_WORDS and not w.isdigit()})
            if candidates:
                similarity = self._embedder.embed(candidates) @ query_vector
                best = np.argsort(-similarity, kind="stable")[:3]
                neighbours = tuple(candidates[j] for j in best if similarity[j] > 0.2)
        return Explanation(tuple(matched), neighbours, round(float(lexical[i]), 4),
                           round(float(semantic[i]), 4) if semantic is not None else 0.0)


def _mean(scores: Scores) -> float:
    """``float(scores.mean())`` to the bit (float32 sum, then divided in float64 and
    rounded to float32), without numpy's generic reduction wrapper."""
    total = np.add.reduce(scores, axis=None)
    return float(total.dtype.type(total / np.intp(len(scores))))


def _ranks(scores: Scores) -> npt.NDArray[np.float32]:
    """1-based rank of each score, best first (ties share the order of position)."""
    order = np.argsort(-scores, kind="stable")
    ranks = np.empty(len(scores), dtype=np.float32)
    ranks[order] = np.arange(1, len(scores) + 1, dtype=np.float32)
    return ranks


def _confidence(hits: Sequence[Hit]) -> float:
    """1 for an exact first hit; else the first's margin over the second, in [0, 1]."""
    if not hits:
        return 0.0
    if hits[0].exact:
        return 1.0
    first = hits[0].score
    second = hits[1].score if len(hits) > 1 else 0.0
    return round(min(1.0, max(0.0, first - second)), 4)


def success_boost(calls: Mapping[str, Mapping[str, int]]) -> dict[str, float]:
    """0.75 + 0.25 x the smoothed success rate ((ok + 1) / (calls + 2)) per capability."""
    boost = {}
    for name, counts in calls.items():
        total = sum(counts.values())
        ok = counts.get("success", 0) + counts.get("partial", 0)
        boost[name] = 0.75 + 0.25 * (ok + 1) / (total + 2)
    return boost

"""Hybrid search: third-party sets, fusion beats its parts, never empty, typos, cache, explain."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from capd.registry import Capability, SearchIndex, success_boost, tokenize
from capd.registry import _search as search_module
from capd.registry._embed import EmbeddingModelMissing, VectorCache, Vectors, load_embedder
from capd.registry._search import semantic_text
from tests.helpers.catalogue import load_catalogue
from tests.helpers.daemon import Start
from tests.helpers.search_sets import (
    THIRD_PARTY_SETS,
    evaluate,
    load_set_catalogue,
    load_set_queries,
    ranker,
)

# Held-out recall@5 of the hybrid ranking, measured once when the method was frozen:
# 0.848, 0.907, 0.850, 0.912 (bench/search.py --holdout; README, Performance). Each floor
# sits a little
# under its figure: it pins that the ranking does not get worse, it is not a target.
HOLDOUT_FLOORS = {"workspace": 0.82, "atlassian": 0.86, "bfcl_live": 0.83, "bfcl_python": 0.89}


class P(BaseModel):
    pass


def cap(name: str, summary: str, **extra: object) -> Capability:
    return Capability(name=name, summary=summary, parameters=P, func=lambda p: None,
                      **extra)  # type: ignore[arg-type]


@functools.cache
def _index(name: str) -> SearchIndex:
    return SearchIndex(load_set_catalogue(name))


class CountingEmbedder:
    """The real model, counting the texts it is asked to embed."""

    def __init__(self) -> None:
        self.inner = load_embedder()
        self.texts = 0

    @property
    def model_id(self) -> str:
        return self.inner.model_id

    def embed(self, texts: Sequence[str]) -> Vectors:
        self.texts += len(texts)
        return self.inner.embed(texts)

    def knows(self, word: str) -> bool:
        return self.inner.knows(word)


# ------------------------------------------------------------------ the sets


def test_third_party_sets_are_large_enough_and_labelled_with_real_tools() -> None:
    """At least 300 tools and 300 labelled queries in all; every label names a catalogued tool."""
    tools = queries = 0
    for name in THIRD_PARTY_SETS:
        names = {c.name for c in load_set_catalogue(name)}
        tools += len(names)
        for split in ("dev", "holdout"):
            rows = load_set_queries(name, split)  # type: ignore[arg-type]
            assert rows, (name, split)
            assert {expected for _, expected in rows} <= names
            queries += len(rows)
    assert tools >= 300
    assert queries >= 300


@pytest.mark.parametrize("name", THIRD_PARTY_SETS)
def test_holdout_recall_stays_above_its_floor(name: str) -> None:
    """Hybrid recall@5 on each held-out half stays at or above the floor measured for it."""
    figures = evaluate(ranker(_index(name)), load_set_queries(name, "holdout"))
    assert figures.recall_at_5 >= HOLDOUT_FLOORS[name]


def test_hybrid_beats_each_ranker_alone_on_the_held_out_queries() -> None:
    """Over all held-out queries, hybrid recall@5 and MRR are above BM25's and the embedding's."""
    pooled: dict[str, list[float]] = {"hybrid": [0, 0], "bm25": [0, 0], "semantic": [0, 0]}
    for name in THIRD_PARTY_SETS:
        queries = load_set_queries(name, "holdout")
        for method, sums in pooled.items():
            figures = evaluate(ranker(_index(name), method), queries)  # type: ignore[arg-type]
            sums[0] += figures.recall_at_5 * figures.queries
            sums[1] += figures.mrr * figures.queries
    for component in ("bm25", "semantic"):
        assert pooled["hybrid"][0] > pooled[component][0], component
        assert pooled["hybrid"][1] > pooled[component][1], component


# ------------------------------------------------------------------ never empty


@settings(max_examples=60, deadline=None)
@given(st.text(min_size=1, max_size=40).filter(lambda q: any(c.isalnum() and c.isascii()
                                                             for c in q)))
def test_a_query_with_content_never_gets_an_empty_list(query: str) -> None:
    """Any query with a letter or digit gets k hits, best first, with a confidence in [0, 1]."""
    ranking = _index("workspace").rank(query, k=5)
    assert len(ranking.hits) == 5
    scores = [h.score for h in ranking.hits if not h.exact]
    assert scores == sorted(scores, reverse=True)
    assert 0.0 <= ranking.confidence <= 1.0


def test_never_empty_holds_under_filters_and_without_the_model(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Filters still decide membership; with no model, unknown words list what passes."""
    caps = [cap("a.one", "Read a file.", tags=("files",)), cap("b.two", "Send a message.")]
    index = SearchIndex(caps)
    assert [h.capability.name for h in index.search("qwxz", tags=["files"])] == ["a.one"]
    assert index.search("qwxz", allowed=lambda n: False) == []

    def missing() -> None:
        raise EmbeddingModelMissing("not installed")

    monkeypatch.setattr(search_module, "load_embedder", missing)
    lexical_only = SearchIndex(caps)
    assert [h.capability.name for h in lexical_only.search("send")] == ["b.two"]
    assert {h.capability.name for h in lexical_only.search("qwxz")} == {"a.one", "b.two"}


def test_a_query_with_no_content_and_no_tag_gets_nothing() -> None:
    """Punctuation alone is not a query: no hits, confidence 0."""
    ranking = SearchIndex([cap("a.one", "Read a file.")]).rank("?!")
    assert (ranking.hits, ranking.confidence) == ([], 0.0)


# ------------------------------------------------------------------ what the fusion fixes


def test_a_paraphrase_with_no_shared_word_is_found() -> None:
    """The embedding finds music.play for "put on some jazz", which shares no word with it."""
    index = SearchIndex(load_catalogue())
    assert "music.play" in [h.capability.name for h in index.search("put on some jazz")]
    assert "music.play" not in [h.capability.name
                                for h in index.search("put on some jazz", method="bm25")]


def test_a_misspelt_word_meets_its_catalogue_term_and_a_real_word_does_not() -> None:
    """"transalte" is read as "translate"; "contract" is a word, never turned into "contact"."""
    index = SearchIndex([cap("translate.text", "Translate text into another language."),
                         cap("contacts.find", "Find a contact by name."),
                         cap("files.read", "Read a text file.")])
    ranking = index.rank("transalte this to french", explain=True, method="bm25")
    assert ranking.hits[0].capability.name == "translate.text"
    assert ranking.hits[0].explanation is not None
    assert "transalt->translat" in ranking.hits[0].explanation.terms
    assert index.search("contract", method="bm25") == []


def test_plurals_hyphens_digits_and_british_spellings_meet() -> None:
    """PRs = PR, sha-256 = sha256, kilometres = kilometers, colour = color, mom's = mom."""
    assert tokenize("open PRs") == tokenize("open PR")
    assert tokenize("the ids") == tokenize("the id")
    assert tokenize("sha-256") == tokenize("sha256")
    assert tokenize("kilometres") == tokenize("kilometers")
    assert tokenize("colour") == tokenize("color")
    assert tokenize("organise") == tokenize("organize")
    assert tokenize("cancelled") == tokenize("canceled")
    assert tokenize("mom's") == tokenize("mom")
    assert set(tokenize("email")) <= set(tokenize("e-mail"))


def test_confidence_is_one_for_an_exact_id_and_higher_for_a_clear_query() -> None:
    """An exact id is certain; a query that fits one capability beats one that fits two."""
    index = SearchIndex([cap("notes.append", "Append a line to a note."),
                         cap("notes.create", "Create a new note."),
                         cap("music.play", "Play a song on the speakers.")])
    assert index.rank("notes.append").confidence == 1.0
    clear = index.rank("play a song").confidence
    vague = index.rank("note").confidence
    assert clear > vague


def test_explain_names_matched_terms_and_semantic_neighbours() -> None:
    """explain=True gives each hit the query terms it holds and its words nearest the query."""
    index = SearchIndex(load_catalogue())
    hit = index.rank("put on some jazz", explain=True).hits[0]
    assert hit.explanation is not None
    assert hit.explanation.neighbours
    plain = index.rank("put on some jazz").hits[0]
    assert plain.explanation is None


# ------------------------------------------------------------------ the vector cache


def test_a_rebuild_embeds_only_the_capsules_that_changed(tmp_path: Path) -> None:
    """With a cache directory, an unchanged catalogue embeds nothing; one edit embeds one."""
    caps = list(load_catalogue())
    first = CountingEmbedder()
    SearchIndex(caps, cache_dir=tmp_path, embedder=first)
    assert first.texts == len(caps)
    again = CountingEmbedder()
    rebuilt = SearchIndex(caps, cache_dir=tmp_path, embedder=again)
    assert (again.texts, rebuilt.embedded) == (0, 0)
    edited = [caps[0].model_copy(update={"summary": "Something else entirely."}), *caps[1:]]
    once = CountingEmbedder()
    SearchIndex(edited, cache_dir=tmp_path, embedder=once)
    assert once.texts == 1


def test_cached_vectors_rank_exactly_like_fresh_ones(tmp_path: Path) -> None:
    """Vectors read back from the cache give the same hits and scores as computed ones."""
    caps = load_catalogue()
    fresh = SearchIndex(caps)
    SearchIndex(caps, cache_dir=tmp_path)
    cached = SearchIndex(caps, cache_dir=tmp_path)
    assert cached.embedded == 0
    for query in ("put on some jazz", "resize a photo", "who changed this line"):
        assert ([(h.capability.name, h.score) for h in fresh.search(query)]
                == [(h.capability.name, h.score) for h in cached.search(query)])


def test_a_corrupt_cache_file_is_ignored_and_replaced(tmp_path: Path) -> None:
    """A garbage cache file costs a full embedding, not an error; the next build reads it."""
    caps = load_catalogue()[:10]
    path = VectorCache(tmp_path, load_embedder().model_id).path
    path.write_bytes(b"not a numpy archive")
    assert SearchIndex(caps, cache_dir=tmp_path).embedded == 10
    assert SearchIndex(caps, cache_dir=tmp_path).embedded == 0


def test_an_unwritable_cache_directory_does_not_stop_the_build(tmp_path: Path) -> None:
    """A cache path that is a file: the index is built and searches, the cache is skipped."""
    blocker = tmp_path / "state"
    blocker.write_text("a file, not a directory")
    index = SearchIndex(load_catalogue()[:10], cache_dir=blocker)
    assert index.embedded == 10
    assert index.search("read a file")


def test_the_semantic_text_is_the_capsule() -> None:
    """A capability is embedded from its name's words, aliases, tags and summary."""
    text = semantic_text(cap("git.blame", "Show who last changed each line.",
                             tags=("git",), aliases=("annotate",)))
    assert text == "git blame. annotate. git. Show who last changed each line."


# ------------------------------------------------------------------ the HTTP answer


@pytest.mark.slow
def test_the_search_answer_carries_a_confidence_and_on_request_an_explanation(
        start: Start) -> None:
    """GET /search answers a confidence; explain=true adds each hit's terms and neighbours."""
    daemon = start()
    plain = daemon.call("GET", "/search?q=echo+text+back").body
    assert 0.0 <= plain["confidence"] <= 1.0
    assert plain["results"][0]["name"] == "e2e.echo"
    assert "explain" not in plain["results"][0]
    explained = daemon.call("GET", "/search?q=echo+text+back&explain=true").body
    first = explained["results"][0]
    assert "echo" in first["explain"]["terms"]
    assert set(first["explain"]) == {"terms", "neighbours", "lexical", "semantic"}
    exact = daemon.call("GET", "/search?q=e2e.echo").body
    assert (exact["confidence"], exact["results"][0]["exact"]) == (1.0, True)


def test_a_poor_success_rate_lowers_a_capability_even_where_its_score_is_negative() -> None:
    """The boost lowers every failing capability, above or below the query's mean cosine."""
    index = SearchIndex(load_catalogue())
    plain = {h.capability.name: h.score for h in index.search("put on some jazz", k=169)}
    failing = {name: {"error_permanent": 20} for name in plain}
    boost = success_boost(failing)
    boosted = {h.capability.name: h.score
               for h in index.search("put on some jazz", k=169, boost=boost)}
    assert any(score < 0 for score in plain.values())
    assert all(boosted[name] < score for name, score in plain.items() if score != 0)

"""Search quality and speed.

Quality: recall@1, recall@5 and MRR (over the first 5) of BM25 alone, the
embedding alone, and the hybrid (capd's default), on four third-party sets
(tests/fixtures/search_sets: Google Workspace and Atlassian MCP servers' tools
with hand-written queries, and the Berkeley Function Calling Leaderboard's
functions with its own questions), each in a development and a held-out half,
and on capd's own fixture catalogue (tests/fixtures: 169 capabilities, three
query sets). Also: reciprocal-rank fusion instead of the convex combination, the
hybrid without the thesaurus, and the BM25 of the previous release, for
comparison. ``--holdout`` adds the held-out halves (run once, at the end).

Speed: search latency p50/p99 over 1,000 and 10,000 capabilities (the real
catalogues pooled, then renamed copies) beside bm25s (BM25 in numpy) on the same
documents (the text capd's BM25 indexes: name, aliases, tags, summary and
description) and the same queries, top 5 each: capd's hybrid search, capd's BM25
alone and bm25s in interleaved rounds, after one untimed warm-up pass of each.
Each query's figure is the CPU time of this process while it runs (every thread:
the tokenizer's pool, BLAS), the wall time printed beside it; a round's p50 and
p99 are over its queries, and the figure is their median over rounds (min-max in
the results table). Then the build time of the 10,000 (and the part of it spent
embedding), and the memory the search adds, measured in a fresh process. Context
economy: the token size of what `tools/list` returns in meta mode against direct
mode.

    python bench/search.py [--holdout] [--rounds 5] [--results FILE] [--speed-only]

bm25s comes from the `bench` extra; without it the comparison is skipped.
"""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

import argparse
import functools
import json
import statistics
import subprocess
import textwrap
import time
import types
from collections.abc import Callable, Sequence

from bench._harness import Results, spread
from capd.registry import Capability, SearchIndex, estimate_tokens, parameters_schema
from capd.registry import _lexical as lexical
from capd.registry._search import Fusion, _fields
from capd.registry._terms import tokenize
from capd.registry._thesaurus import build_expansions
from capd.sidecar.client._mcp import META_TOOLS
from tests.helpers.catalogue import BLIND_SET, QUERY_SETS, load_catalogue, load_queries
from tests.helpers.search_sets import (
    THIRD_PARTY_SETS,
    Figures,
    Ranker,
    evaluate,
    load_set_catalogue,
    load_set_queries,
    ranker,
)


def _row(label: str, figures: Figures) -> str:
    return (f"  {label:<28} recall@1 {figures.recall_at_1:.3f}  recall@5 "
            f"{figures.recall_at_5:.3f}  MRR {figures.mrr:.3f}")


def _sets(holdout: bool) -> list[tuple[str, Sequence[Capability], list[tuple[str, str]]]]:
    out = []
    splits = ("dev", "holdout") if holdout else ("dev",)
    for name in THIRD_PARTY_SETS:
        for split in splits:
            out.append((f"{name} {split}", load_set_catalogue(name),
                        load_set_queries(name, split)))  # type: ignore[arg-type]
    own = load_catalogue()
    for query_set in (*QUERY_SETS, BLIND_SET):
        out.append((f"capd {query_set}", own, load_queries(query_set)))
    return out


# The commit whose registry/_search.py is the BM25-only search this one replaced.
PREVIOUS_SEARCH = "b3438e522390c07e097f38eb4a1adf46781450d1"


def _previous_bm25(caps: Sequence[Capability]) -> Ranker | None:
    """The BM25 of the previous release (read from git), or None outside a git checkout."""
    root = _HERE.parent
    sources = {}
    for module in ("_search", "_thesaurus"):
        done = subprocess.run(["git", "-C", str(root), "show",
                               f"{PREVIOUS_SEARCH}:registry/{module}.py"],
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            return None
        sources[module] = done.stdout
    thesaurus = types.ModuleType("previous_thesaurus")
    exec(compile(sources["_thesaurus"], "previous_thesaurus", "exec"), thesaurus.__dict__)
    module = types.ModuleType("previous_search")
    sys.modules[module.__name__] = module  # dataclasses look their module up
    module.__dict__.update(Capability=Capability, EXPANSION_WEIGHT=thesaurus.EXPANSION_WEIGHT,
                           build_expansions=thesaurus.build_expansions)
    code = sources["_search"].replace("from ._model import Capability", "").replace(
        "from ._thesaurus import EXPANSION_WEIGHT, build_expansions", "")
    exec(compile(code, "previous_search", "exec"), module.__dict__)
    index = module.SearchIndex(caps)
    return lambda query, k: [h.capability.name for h in index.search(query, k=k)]


def quality(holdout: bool) -> None:
    indexes: dict[int, SearchIndex] = {}
    previous: dict[int, Ranker | None] = {}
    rrf: dict[int, SearchIndex] = {}
    for label, caps, queries in _sets(holdout):
        key = id(caps)
        if key not in indexes:
            indexes[key] = SearchIndex(caps)
            rrf[key] = SearchIndex(caps, fusion=Fusion("rrf", 0.5, 60))
            previous[key] = _previous_bm25(caps)
        index = indexes[key]
        print(f"{label}: {len(caps)} capabilities, {len(queries)} labelled queries")
        for method, name in (("bm25", "BM25 only"), ("semantic", "embedding only"),
                             ("hybrid", "hybrid (convex 0.6)")):
            print(_row(name, evaluate(ranker(index, method), queries)))  # type: ignore[arg-type]
        print(_row("hybrid, RRF (k=60)", evaluate(ranker(rrf[key]), queries)))
        saved = lexical._EXPANSIONS
        lexical._EXPANSIONS = build_expansions(tokenize, ())
        try:
            print(_row("hybrid, no thesaurus", evaluate(ranker(index), queries)))
        finally:
            lexical._EXPANSIONS = saved
        before = previous[key]
        if before is not None:
            print(_row("previous release's BM25", evaluate(before, queries)))


def _pooled(target: int) -> list[Capability]:
    """``target`` capabilities: every real catalogue, then renamed copies of them."""
    base = [*load_catalogue()]
    for name in THIRD_PARTY_SETS:
        base.extend(load_set_catalogue(name))
    caps: list[Capability] = []
    copy = 0
    while len(caps) < target:
        for cap in base:
            name = cap.name if copy == 0 else f"{cap.name}_v{copy}"
            caps.append(cap.model_copy(update={"name": name}))
        copy += 1
    return caps[:target]


Search = Callable[[str], object]


def _bm25s(caps: Sequence[Capability]) -> tuple[Search, float] | None:
    """bm25s over the text capd's BM25 indexes (same k1 and b), and its build time; None
    when bm25s is not installed. A query is tokenized as its corpus was (English stop
    words, the same Snowball stemmer capd uses), then the top 5 retrieved."""
    try:
        import bm25s
        import Stemmer
    except ImportError:
        return None
    stemmer = Stemmer.Stemmer("english")
    started = time.perf_counter()
    corpus = [" ".join(t for t in _fields(c).values() if t) for c in caps]
    tokens = bm25s.tokenize(corpus, stopwords="en", stemmer=stemmer, show_progress=False)
    retriever = bm25s.BM25(k1=1.2, b=0.75)
    retriever.index(tokens, show_progress=False)
    built = time.perf_counter() - started

    def search(query: str) -> object:
        terms = bm25s.tokenize([query], stopwords="en", stemmer=stemmer, return_ids=False,
                               show_progress=False)
        return retriever.retrieve(terms, k=5, show_progress=False)

    return search, built


def _pass(search: Search, texts: Sequence[str]) -> tuple[list[float], list[float]]:
    """Per-query CPU time and wall time (ms) of one pass over ``texts``."""
    cpu, wall = [], []
    for query in texts:
        c0, w0 = time.process_time_ns(), time.perf_counter_ns()
        search(query)
        w1, c1 = time.perf_counter_ns(), time.process_time_ns()
        cpu.append((c1 - c0) / 1e6)
        wall.append((w1 - w0) / 1e6)
    return cpu, wall


def _p50_p99(times: Sequence[float]) -> tuple[float, float]:
    ordered = sorted(times)
    return statistics.median(ordered), ordered[int(len(ordered) * .99)]


def speed(results: Results, rounds: int) -> None:
    texts = [q for name in THIRD_PARTY_SETS for q, _ in load_set_queries(name, "dev")]
    texts += [q for q, _ in load_queries()]
    print(f"  {len(texts)} queries, top 5, {rounds} interleaved rounds after a warm-up pass; "
          "per-query CPU time (wall in brackets), median of the rounds' p50 and p99")
    for target in (1000, 10000):
        caps = _pooled(target)
        started = time.perf_counter()
        index = SearchIndex(caps)
        built = time.perf_counter() - started
        runners: dict[str, Search] = {"capd hybrid": functools.partial(index.search, k=5)}
        peer = _bm25s(caps)
        if peer is None:
            print("  bm25s is not installed (pip install -e '.[bench]'): skipped")
        else:
            runners["bm25s"] = peer[0]
        runners["capd bm25 only"] = functools.partial(index.search, k=5, method="bm25")
        for search in runners.values():
            _pass(search, texts)  # warm-up: caches, page faults, lazy imports
        p50s: dict[str, list[float]] = {name: [] for name in runners}
        p99s: dict[str, list[float]] = {name: [] for name in runners}
        walls: dict[str, list[tuple[float, float]]] = {name: [] for name in runners}
        for _ in range(rounds):
            for name, search in runners.items():
                cpu, wall = _pass(search, texts)
                p50, p99 = _p50_p99(cpu)
                p50s[name].append(p50)
                p99s[name].append(p99)
                walls[name].append(_p50_p99(wall))
        for name in runners:
            p50, lo50, hi50 = spread(p50s[name])
            p99, lo99, hi99 = spread(p99s[name])
            wall50 = statistics.median(w[0] for w in walls[name])
            wall99 = statistics.median(w[1] for w in walls[name])
            versus = ""
            if name != "bm25s" and "bm25s" in runners:
                versus = (f"  = {p50 / statistics.median(p50s['bm25s']):.2f}x / "
                          f"{p99 / statistics.median(p99s['bm25s']):.2f}x bm25s")
            print(f"  {name:<15} over {target:>6} capabilities: p50 {p50:.3f} ms "
                  f"({lo50:.3f}-{hi50:.3f}) [{wall50:.3f}]  p99 {p99:.3f} ms "
                  f"({lo99:.3f}-{hi99:.3f}) [{wall99:.3f}]{versus}")
            compared = name != "bm25s" and "bm25s" in runners
            for quantile, values in (("p99", p99s), ("p50", p50s)):
                results.add("search", f"{name} {quantile}, {target:,} capabilities, top 5",
                            values[name], "ms CPU/query",
                            against=f"bm25s {quantile}" if compared else "",
                            against_values=values["bm25s"] if compared else None,
                            note=f"{len(texts)} queries, median of the rounds' {quantile}")
        print(f"  build of {target} capabilities: capd {built:.2f} s"
              + (f", bm25s {peer[1]:.2f} s" if peer is not None else ""))


_MEMORY_PROBE = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {root!r})
    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096 / 2**20
    import pydantic, structlog
    base = rss()
    import numpy, tokenizers, rapidfuzz, Stemmer
    from capd.registry import SearchIndex
    from capd.registry._embed import load_embedder
    deps = rss()
    embedder = load_embedder()
    model = rss()
    sys.path.insert(0, {bench!r})
    from search import _pooled
    caps = _pooled(10000)
    loaded = rss()
    from capd.registry._search import semantic_text
    texts = [semantic_text(c) for c in caps]
    started = time.perf_counter()
    embedder.embed(texts)
    embed_s = time.perf_counter() - started
    started = time.perf_counter()
    index = SearchIndex(caps)
    build_s = time.perf_counter() - started
    built = rss()
    print(f"  imports (numpy, tokenizers, rapidfuzz, PyStemmer, capd): {{deps - base:.1f}} MiB")
    print(f"  model (memory-mapped table, tokenizer): {{model - deps:.1f}} MiB")
    print(f"  index of 10,000 capabilities: {{built - loaded:.1f}} MiB "
          f"(build {{build_s:.2f}} s, of which embedding 10,000 capsules {{embed_s:.2f}} s)")
    print(f"  search added in all (imports, model, index): "
          f"{{built - loaded + model - base:.1f}} MiB")
""")


def memory() -> None:
    code = _MEMORY_PROBE.format(root=str(_HERE.parent), bench=str(_HERE))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=False)
    print(done.stdout.rstrip() or done.stderr)


def context_economy() -> None:
    caps = load_catalogue()
    meta = [{"name": t.name, "description": t.description, "inputSchema": t.input_schema}
            for t in META_TOOLS.values()]
    direct = [{"name": c.name, "description": c.summary,
               "inputSchema": parameters_schema(c.parameters)} for c in caps]
    meta_tokens = estimate_tokens(json.dumps(meta))
    direct_tokens = estimate_tokens(json.dumps(direct))
    print(f"context economy (tools/list, 1 token per 4 characters): meta mode {meta_tokens} "
          f"tokens, direct mode {direct_tokens} tokens for {len(caps)} capabilities "
          f"({direct_tokens / meta_tokens:.1f}x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--holdout", action="store_true",
                        help="also the held-out halves (run once, when the method is frozen)")
    parser.add_argument("--rounds", type=int, default=5,
                        help="interleaved timed rounds of the speed comparison (3 or more)")
    parser.add_argument("--results", type=Path, default=None,
                        help="append the speed figures to this file (JSON lines)")
    parser.add_argument("--speed-only", action="store_true",
                        help="only the speed comparison (no quality, memory or context)")
    args = parser.parse_args()
    if args.rounds < 3:
        parser.error("--rounds: at least 3")
    results = Results(args.results)
    if not args.speed_only:
        quality(args.holdout)
    print("speed")
    speed(results, args.rounds)
    if args.speed_only:
        return
    print("memory, 10,000 capabilities, fresh process")
    memory()
    context_economy()


if __name__ == "__main__":
    main()

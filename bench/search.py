"""Search quality and speed.

Quality: recall@5 and MRR of capd's BM25 search on the fixture catalogue
(tests/fixtures, 169 capabilities; 78 labelled queries, and 60 held-out
queries written before the thesaurus was run against them, and 50 blind queries
written after it was frozen), beside a naive
substring scorer (the baseline). Speed: search latency p50/p99 over 1,000 and
10,000 capabilities (the catalogue repeated with renamed copies). Context
economy: the token size (1 token per 4 characters) of what `tools/list`
returns in meta mode (4 tools) against direct mode (one tool per capability).

    python bench/search.py
"""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

import json
import statistics
import time

from capd.registry import SearchIndex, estimate_tokens, parameters_schema
from capd.sidecar.client._mcp import META_TOOLS
from tests.catalogue import (
    BLIND_SET,
    QUERY_SETS,
    bm25_ranker,
    evaluate,
    load_catalogue,
    load_queries,
    substring_ranker,
)


def main() -> None:
    caps = load_catalogue()
    for query_set in (*QUERY_SETS, BLIND_SET):
        queries = load_queries(query_set)
        recall, mrr = evaluate(bm25_ranker(caps), queries)
        base_recall, base_mrr = evaluate(substring_ranker(caps), queries)
        print(f"search quality, {len(caps)} capabilities, {len(queries)} labelled queries "
              f"({query_set})")
        print(f"  capd BM25 + thesaurus recall@5 {recall:.3f}  MRR {mrr:.3f}")
        print(f"  substring baseline    recall@5 {base_recall:.3f}  MRR {base_mrr:.3f}")
        print(f"  ratio                 recall {recall / base_recall:.2f}x  "
              f"MRR {mrr / base_mrr:.2f}x")
    texts = [q for q, _ in load_queries()]
    for target in (1000, 10000):
        copies = -(-target // len(caps))
        index_caps = load_catalogue(copies)[:target]
        index = SearchIndex(index_caps)
        times = []
        for _ in range(5):
            for query in texts:
                started = time.perf_counter()
                index.search(query, k=5)
                times.append(time.perf_counter() - started)
        times.sort()
        p50, p99 = statistics.median(times) * 1e3, times[int(len(times) * .99)] * 1e3
        print(f"  latency over {len(index_caps):>6} capabilities: p50 {p50:.3f} ms  "
              f"p99 {p99:.3f} ms")
    meta = [{"name": t.name, "description": t.description, "inputSchema": t.input_schema}
            for t in META_TOOLS.values()]
    direct = [{"name": c.name, "description": c.summary,
               "inputSchema": parameters_schema(c.parameters)} for c in caps]
    meta_tokens = estimate_tokens(json.dumps(meta))
    direct_tokens = estimate_tokens(json.dumps(direct))
    print(f"context economy (tools/list, 1 token per 4 characters): meta mode {meta_tokens} "
          f"tokens, direct mode {direct_tokens} tokens for {len(caps)} capabilities "
          f"({direct_tokens / meta_tokens:.1f}x)")


if __name__ == "__main__":
    main()

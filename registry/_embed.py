"""Static text embeddings for semantic search, and their on-disk cache.

The model is WordLlama's ``l2_supercat`` at 256 dimensions: a table of one vector
per token of the Llama-2 tokenizer (32,000 x 256, float16, 16 MB), trained so
that the mean of a text's token vectors places paraphrases close together. A
text's embedding is that mean, scaled to unit length; there is no network, no
GPU and no neural network to run, only a table look-up, so embedding a capsule
takes microseconds and a query well under a millisecond. Each distinct word is
tokenized once and its token ids kept (up to 32,768 words, the capsules' and then
the queries', in at most 4 MiB), so a query's words are looked up, not tokenized
again.

The weights and the tokenizer ship inside the ``wordllama`` wheel; this module
reads the two files straight from the installed package (the safetensors file
is memory-mapped) without importing ``wordllama`` itself, whose import
configures the root logger and pulls in an HTTP client for downloads we never
make.

:class:`VectorCache` keeps capsule vectors on disk by content hash, so a reload
re-embeds only the capsules whose text changed.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import itertools
import json
import os
import struct
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np
import numpy.typing as npt
import structlog
from tokenizers import Tokenizer

log = structlog.get_logger("capd.search")

Vectors = npt.NDArray[np.float32]
MODEL_ID = "wordllama-l2_supercat-256"
_WEIGHTS = "weights/l2_supercat_256.safetensors"
_TOKENIZER = "tokenizers/l2_supercat_tokenizer_config.json"
_BATCH = 256
_SMALL = 32
# Words whose token ids are kept (capsule words from index builds, then query words).
_WORD_CACHE = 32768
_FIRST = np.zeros(1, dtype=np.intp)  # reduceat's start of the one text of a query


class Embedder(Protocol):
    """Texts to unit-length vectors; ``model_id`` names the model in cache keys."""

    @property
    def model_id(self) -> str: ...

    def embed(self, texts: Sequence[str]) -> Vectors:
        """One row per text, each of unit length (a text with no tokens: all zeros)."""
        ...

    def knows(self, word: str) -> bool:
        """Whether ``word`` is a word of the model's vocabulary (so not a misspelling)."""
        ...


class EmbeddingModelMissing(RuntimeError):
    """The model's files are not installed; semantic search is unavailable."""


class StaticEmbedder:
    """Mean of token vectors from a static table, unit-normalised."""

    def __init__(self, table: npt.NDArray[np.float16], tokenizer: Tokenizer,
                 model_id: str = MODEL_ID) -> None:
        self._table = table
        # The same memory as a plain array: indexing an np.memmap goes through Python.
        self._rows: npt.NDArray[np.float16] = table.view(np.ndarray)
        self._tokenizer = tokenizer
        self._model_id = model_id
        # word -> its token ids (clipped to the table) as the bytes of an array of
        # ``_id_type``, so that a word is tokenized once and a text's ids are one join.
        self._ids: dict[str, bytes] = {}
        self._id_type = np.uint16 if table.shape[0] <= 1 << 16 else np.uint32

    @property
    def model_id(self) -> str:
        return self._model_id

    @property
    def dimensions(self) -> int:
        return int(self._table.shape[1])

    def embed(self, texts: Sequence[str]) -> Vectors:
        """One unit row per text (zeros for a text with no tokens), in batches of 256.

        Batches bound the memory a large build needs: the token vectors of one batch
        are gathered, summed per text and dropped before the next.
        """
        if len(texts) == 1:
            return self._embed_one(texts[0])
        out = np.zeros((len(texts), self.dimensions), dtype=np.float32)
        for start in range(0, len(texts), _BATCH):
            self._embed_batch(texts[start:start + _BATCH], out[start:start + _BATCH])
        # np.linalg.norm(out, axis=1, keepdims=True), without its argument checks.
        norms = np.sqrt(np.add.reduce(out * out, axis=1, keepdims=True))
        np.divide(out, norms, out=out, where=norms > 0)
        return out

    def _embed_one(self, text: str) -> Vectors:
        """A query: the same sum as :meth:`_embed_batch` and the same division by the
        norm, in fewer numpy calls (the float16 rows are widened first, which adds them
        in the same order as summing with dtype=float32 does)."""
        words = text.split()
        ids_of = self._ids_of(words)
        ids = np.frombuffer(b"".join([ids_of[w] for w in words]), dtype=self._id_type)
        if not len(ids):
            return np.zeros((1, self.dimensions), dtype=np.float32)
        out: Vectors = np.add.reduceat(self._rows[ids].astype(np.float32), _FIRST, axis=0)
        norm = np.sqrt(np.add.reduce(out[0] * out[0]))
        if norm > 0:
            out /= norm
        return out

    def _embed_batch(self, texts: Sequence[str], out: Vectors) -> None:
        # The tokenizer has no pre-tokenizer: given a whole text it runs BPE over it
        # as one "word" and caches it whole, which is slow on long texts and keeps
        # every text in memory. No merge crosses a space (tokens start with "▁"),
        # so each distinct word is tokenized once on its own, and a text's tokens
        # are its words' tokens in order.
        split = [text.split() for text in texts]
        ids_of = self._ids_of(w for ws in split for w in ws)
        width = np.dtype(self._id_type).itemsize
        lengths = np.fromiter((sum(len(ids_of[w]) for w in ws) // width for ws in split),
                              dtype=np.int64, count=len(split))
        if not lengths.any():
            return
        ids = np.frombuffer(b"".join([ids_of[w] for ws in split for w in ws]),
                            dtype=self._id_type)
        filled = lengths > 0
        starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))[filled]
        out[filled] = np.add.reduceat(self._rows[ids], starts, axis=0, dtype=np.float32)

    def _ids_of(self, words: Iterable[str]) -> dict[str, bytes]:
        """The word cache, holding the token ids (clipped to the table) of ``words``."""
        if len(self._ids) > _WORD_CACHE:
            self._ids = {}  # a new dict: a search in another thread keeps the one it has
        ids_of = self._ids
        unique = list(dict.fromkeys(w for w in words if w not in ids_of))
        if unique:
            # A query's few words are encoded in this thread: the batch call hands them
            # to a thread pool, whose wake-up costs more than the work.
            pieces = (self._tokenizer.encode_batch(unique, add_special_tokens=False)
                      if len(unique) > _SMALL else
                      [self._tokenizer.encode(w, add_special_tokens=False) for w in unique])
            counts = [len(encoding.ids) for encoding in pieces]
            flat = np.fromiter(itertools.chain.from_iterable(e.ids for e in pieces),
                               dtype=np.int64, count=sum(counts))
            np.clip(flat, 0, self._rows.shape[0] - 1, out=flat)
            raw = flat.astype(self._id_type).tobytes()
            width = np.dtype(self._id_type).itemsize
            at = 0
            for word, count in zip(unique, counts, strict=True):
                ids_of[word] = raw[at:at + count * width]
                at += count * width
        return ids_of

    def knows(self, word: str) -> bool:
        """Whether `` word`` is a single token: a common word, not a misspelling."""
        return self._tokenizer.token_to_id(f"\u2581{word}") is not None

    def tokens(self, text: str) -> list[str]:
        """The model's tokens for ``text`` (for explanations)."""
        return list(self._tokenizer.encode(text, add_special_tokens=False).tokens)


def _package_dir(name: str) -> Path:
    """Where package ``name`` is installed, found without importing it."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddingModelMissing(f"the {name} package is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


def _map_safetensors(path: Path, key: str) -> npt.NDArray[np.float16]:
    """Memory-map one float16 tensor of a safetensors file (header: u64 length + JSON)."""
    with path.open("rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
    entry = header[key]
    if entry["dtype"] != "F16":
        raise EmbeddingModelMissing(f"{path.name}: expected float16 weights, not {entry['dtype']}")
    start, end = entry["data_offsets"]
    rows, dims = entry["shape"]
    if end - start != rows * dims * 2:
        raise EmbeddingModelMissing(f"{path.name}: the tensor's size does not match its shape")
    table: npt.NDArray[np.float16] = np.memmap(path, dtype=np.float16, mode="r",
                                                offset=8 + header_len + start,
                                                shape=(rows, dims))
    return table


@functools.cache
def load_embedder() -> StaticEmbedder:
    """The default model, loaded once per process (about 0.1 s).

    Raises :class:`EmbeddingModelMissing` when the ``wordllama`` package or its
    files are not installed.
    """
    root = _package_dir("wordllama")
    try:
        table = _map_safetensors(root / _WEIGHTS, "embedding.weight")
    except (OSError, KeyError, ValueError, struct.error) as exc:
        raise EmbeddingModelMissing(f"cannot read the wordllama weights: {exc}") from exc
    try:
        tokenizer = Tokenizer.from_file(str(root / _TOKENIZER))
    except Exception as exc:  # the Rust tokenizer raises a bare Exception on a bad file
        raise EmbeddingModelMissing(f"cannot read the wordllama tokenizer: {exc}") from exc
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return StaticEmbedder(table, tokenizer)


def content_key(model_id: str, text: str) -> bytes:
    """The cache key of ``text``'s vector under ``model_id``: a SHA-256 digest."""
    return hashlib.sha256(f"{model_id}\0{text}".encode()).digest()


class VectorCache:
    """Vectors by content hash in one file of a directory the caller owns.

    The file holds exactly the vectors of the last index built with it, so it does
    not grow across reloads. A missing, unreadable or foreign file is treated as
    empty (and replaced); writing is atomic (a temporary file, then a rename).
    """

    def __init__(self, directory: Path, model_id: str) -> None:
        self.path = Path(directory) / f"search-vectors-{model_id}.npz"

    def load(self) -> dict[bytes, Vectors]:
        """The stored vectors by key; empty when there is no usable file."""
        try:
            with np.load(self.path, allow_pickle=False) as data:
                keys = data["keys"]
                vectors = data["vectors"].astype(np.float32)
        except FileNotFoundError:
            return {}
        except (OSError, KeyError, ValueError) as exc:
            log.warning("search_vector_cache_unreadable", path=str(self.path), error=str(exc))
            return {}
        if keys.ndim != 2 or keys.shape[1] != 32 or len(keys) != len(vectors):
            log.warning("search_vector_cache_unreadable", path=str(self.path),
                        error="unexpected shape")
            return {}
        return {bytes(k): v for k, v in zip(keys, vectors, strict=True)}

    def store(self, keys: Sequence[bytes], vectors: Vectors) -> None:
        """Replace the file with ``vectors`` under ``keys``; a failure is logged, not raised."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".search-vectors-",
                                       suffix=".npz")
            try:
                with os.fdopen(fd, "wb") as out:
                    key_array = np.frombuffer(b"".join(keys), dtype=np.uint8).reshape(-1, 32)
                    np.savez(out, keys=key_array, vectors=vectors.astype(np.float32))
                os.replace(tmp, self.path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except OSError as exc:
            log.warning("search_vector_cache_unwritable", path=str(self.path), error=str(exc))


def embed_with_cache(embedder: Embedder, texts: Sequence[str],
                     cache_dir: Path | None) -> tuple[Vectors, int]:
    """Vectors of ``texts`` (one unit row each) and how many had to be computed.

    With ``cache_dir``, vectors of texts embedded before (same model, same text)
    are read back instead of computed, and the cache is rewritten to hold exactly
    this set when anything changed.
    """
    if cache_dir is None:
        return embedder.embed(texts), len(texts)
    cache = VectorCache(cache_dir, embedder.model_id)
    stored = cache.load()
    keys = [content_key(embedder.model_id, t) for t in texts]
    missing = [i for i, key in enumerate(keys) if key not in stored]
    fresh = embedder.embed([texts[i] for i in missing]) if missing else None
    dims = fresh.shape[1] if fresh is not None else (
        next(iter(stored.values())).shape[0] if stored else 0)
    out = np.zeros((len(texts), dims), dtype=np.float32)
    for i, key in enumerate(keys):
        if key in stored:
            out[i] = stored[key]
    if fresh is not None:
        out[missing] = fresh
    if missing or len(stored) != len(set(keys)):
        unique = dict(zip(keys, range(len(keys)), strict=True))
        cache.store(list(unique), out[list(unique.values())])
    return out, len(missing)

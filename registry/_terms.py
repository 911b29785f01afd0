"""Search terms: words to the terms the lexical index counts.

One function, :func:`tokenize`, is used on both sides (capsules at build, queries
at search), so every rule below only has to map two spellings of a word to the
same term; it never has to produce a real word.

- Words are runs of letters and digits. A hyphen between a word and a number
  joins them (``sha-256`` = ``sha256``, ``utf-8`` = ``utf8``); a hyphen between two
  words also yields the joined word (``e-mail`` gives ``mail`` and ``email``).
  camelCase splits (``getWeather`` = ``get weather``).
- An upper-case abbreviation's plural is the abbreviation (``PRs`` = ``PR``), and
  so is the plural of a three-letter word ending in consonant + s (``ids`` = ``id``).
  A possessive's ``'s`` is a one-letter word, and one-letter words do not count.
- British spellings meet American ones by their endings (``-our``, ``-ise``,
  ``-yse``, ``-tre``, ``-ogue``, ``-elled``, ``-ence``), before a light stemmer
  folds plurals and ``-ing``/``-ed``; no list of word pairs is kept.
"""

from __future__ import annotations

import functools
import re
import string

import Stemmer  # type: ignore[import-not-found]  # PyStemmer is a C module with no stubs

_WORD = re.compile(r"[a-z0-9]+")
# A letter run, a hyphen, then a digit run (sha-256, utf-8, covid-19, gpt-4o).
_LETTER_DIGIT = re.compile(r"\b([a-z]+)-(\d)")
# Two letter runs joined by a hyphen (e-mail, to-do, sign-up).
_COMPOUND = re.compile(r"\b([a-z]+)-([a-z]+)\b")
_CAMEL = re.compile(r"(?<=[a-z])(?=[A-Z])")
_ABBREVIATION_PLURAL = re.compile(r"\b([A-Z]{2,})s\b")
# A text's shape: each ASCII upper-case letter "A", lower-case letter "a" (but "s"),
# digit "0". A rule whose pattern cannot occur in the shape is not run: a regular
# expression costs some 20 ns a character, a look in the shape about one.
_SHAPE = str.maketrans({**dict.fromkeys(string.ascii_uppercase, "A"),
                        **dict.fromkeys(string.ascii_lowercase, "a"), "s": "s",
                        **dict.fromkeys(string.digits, "0")})


class _Spaces(dict[int, str]):
    """A translation table that turns every character it does not list into a space."""

    def __missing__(self, key: int) -> str:
        return " "


# Letters a-z and digits kept, everything else a space: ``text.translate(_WORDS).split()``
# is ``_WORD.findall(text)``, three times faster on a long text.
_WORDS = _Spaces({c: chr(c) if chr(c) in string.ascii_lowercase + string.digits else " "
                  for c in range(128)})
STOP_WORDS = frozenset({
    "a", "an", "and", "are", "as", "at", "be", "by", "can", "do", "for", "from", "get", "how",
    "i", "in", "into", "is", "it", "me", "my", "of", "on", "or", "please", "show", "some",
    "that", "the", "this", "to", "up", "what", "when", "where", "which", "with", "you", "your",
})
_VOWELS = frozenset("aeiou")

# British ending -> American ending, tried longest first on the whole word.
_SPELLINGS: tuple[tuple[str, str, int], ...] = (
    # (ending, replacement, shortest word it applies to)
    ("isations", "izations", 9), ("isation", "ization", 8),
    ("ysing", "yzing", 7), ("ysed", "yzed", 6), ("yses", "yzes", 6), ("yse", "yze", 6),
    ("ising", "izing", 7), ("ised", "ized", 6), ("ises", "izes", 7), ("ise", "ize", 6),
    ("ours", "ors", 7), ("oured", "ored", 8), ("ouring", "oring", 9), ("our", "or", 6),
    ("ourite", "orite", 8), ("ourites", "orites", 9), ("ourable", "orable", 9),
    ("tres", "ters", 6), ("tre", "ter", 5), ("bres", "bers", 6), ("bre", "ber", 5),
    ("ogues", "ogs", 7), ("ogue", "og", 6),
    ("elled", "eled", 8), ("elling", "eling", 9),
    ("cence", "cense", 7), ("fence", "fense", 7),
    ("ammes", "ams", 8), ("amme", "am", 7),
)


def _american(word: str) -> str:
    """``word`` with a British ending replaced by the American one."""
    for ending, replacement, shortest in _SPELLINGS:
        if len(word) >= shortest and word.endswith(ending):
            return word[: -len(ending)] + replacement
    return word


def light_stem(word: str) -> str:
    """A light stemmer: plural first, then -ing/-ed, then a final -e (``meetings`` = ``meet``)."""
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


_SNOWBALL = Stemmer.Stemmer("english")
USE_SNOWBALL = True


@functools.lru_cache(maxsize=65536)
def stem(word: str) -> str:
    """The term of a lower-case word: American spelling, then the Snowball English stemmer.

    ``meetings``, ``meeting`` and ``meet`` all become ``meet``; ``planning`` and
    ``plan`` become ``plan``; ``kilometres`` and ``kilometers`` meet; ``ids`` and
    ``prs`` become ``id`` and ``pr``.
    """
    word = _american(word)
    if len(word) == 3 and word[2] == "s" and word[1] not in _VOWELS and word[1] != "s":
        return word[:2]
    if not USE_SNOWBALL:
        return light_stem(word)
    return str(_SNOWBALL.stemWord(word))


def words(text: str) -> list[str]:
    """The lower-case words of ``text`` after the joining rules, stop words included."""
    lower = text.lower()
    if lower != text:  # the case rules need an upper-case letter
        shape = text.translate(_SHAPE)
        if "aA" in shape or "sA" in shape:
            text = _CAMEL.sub(" ", text)
        if "AAs" in shape:  # (the camelCase rule never splits such a run)
            text = _ABBREVIATION_PLURAL.sub(r"\1", text)
        lower = text.lower()
    if "-" in lower:  # and the joining rules a hyphen
        shape = lower.translate(_SHAPE)
        if "a-" in shape or "s-" in shape:  # (not "a-0": \d also matches other digits)
            lower = _LETTER_DIGIT.sub(r"\1\2", lower)
        if "-a" in shape or "-s" in shape:
            lower = _COMPOUND.sub(r"\1 \2 \1\2", lower)
    return lower.translate(_WORDS).split()


def tokenize(text: str) -> list[str]:
    """Terms of ``text``: words of two or more characters, stop words dropped, stemmed.

    One-character words carry nothing to rank by: the "s" of "what's" would
    otherwise match every capsule with a possessive in it.
    """
    return [stem(w) for w in words(text) if len(w) > 1 and w not in STOP_WORDS]


def surface_forms(text: str) -> dict[str, str]:
    """Each term of ``text`` to the first word that produced it (to show or embed a term)."""
    forms: dict[str, str] = {}
    for word in words(text):
        if len(word) > 1 and word not in STOP_WORDS:
            forms.setdefault(stem(word), word)
    return forms

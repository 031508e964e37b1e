"""Pure-Python BM25 that reproduces the reference's Lucene (pyserini) index on the WebShop catalog.

Reference: ``search_engine/convert_product_file_format.py`` (document text) and pyserini's ``LuceneSearcher``
defaults (Anserini: BM25 k1=0.9, b=0.4, ``DefaultEnglishAnalyzer``, bag-of-words SHOULD query); the recipe that
matches Lucene term for term is in ``docs/webshop.md`` ("BM25 that matches Lucene exactly"):

- tokens = UAX#29 word segments (``regex`` ``\\b`` with ``WORD|V1``) that hold a letter, digit or emoji;
- EnglishPossessiveFilter (strip trailing ``'s``), lower-case, Lucene's 33 English stop words;
- Lucene's PorterStemmer = nltk ``PorterStemmer(MARTIN_EXTENSIONS)``;
- Lucene 9 BM25 in float32: ``idf = ln(1 + (N - df + 0.5) / (df + 0.5))``, document length quantised with
  ``SmallFloat.intToByte4``, per term ``w - w / (1 + tf / (k1 (1 - b + b len / avgdl)))``, sum over query terms,
  rank by score desc, ties by ASIN ascending (Anserini's ScoreTiesAdjusterReranker).

The index is built once per process per catalog (:func:`get_index`) and shared by every session.
"""

from __future__ import annotations

import math
import threading
from collections import Counter, defaultdict
from functools import lru_cache

import numpy as np
import regex
from nltk.stem.porter import PorterStemmer

# Lucene EnglishAnalyzer.ENGLISH_STOP_WORDS_SET
STOP_WORDS = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such that the their then there these they "
    "this to was will with".split()
)
K1 = 0.9
B = 0.4
MAX_TOKEN_LENGTH = 255  # StandardTokenizer default max token length

_WORD_BREAK = regex.compile(r"\b", flags=regex.WORD | regex.V1)
_HAS_ALNUM = regex.compile(r"[\p{L}\p{Nd}\p{Extended_Pictographic}]")
_LUCENE_EMOJI_RANGES = (
    (0x2600, 0x2605), (0x2607, 0x2612), (0x2614, 0x2685), (0x2690, 0x2705), (0x2708, 0x2712), (0x2714, 0x2714),
    (0x2716, 0x2716), (0x271D, 0x271D), (0x2721, 0x2721), (0x2728, 0x2728), (0x2733, 0x2734), (0x2744, 0x2744),
    (0x2747, 0x2747), (0x274C, 0x274C), (0x274E, 0x274E), (0x2753, 0x2755), (0x2757, 0x2757), (0x2763, 0x2767),
    (0x2795, 0x2797), (0x27A1, 0x27A1), (0x27B0, 0x27B0), (0x27BF, 0x27BF),
)
_STEMMER = PorterStemmer(mode=PorterStemmer.MARTIN_EXTENSIONS)


def _is_token(segment: str) -> bool:
    """Whether StandardTokenizer emits this UAX#29 segment (it holds a letter, digit or emoji)."""
    for ch in segment:
        if ch in "\uff9e\uff9f":
            continue
        if _HAS_ALNUM.match(ch):
            return True
        cp = ord(ch)
        if 0x2600 <= cp <= 0x27BF and any(lo <= cp <= hi for lo, hi in _LUCENE_EMOJI_RANGES):
            return True
    return False


@lru_cache(maxsize=200_000)
def _normalise(token: str) -> str | None:
    """Possessive filter, lower-case, stop words, Porter stem; ``None`` when the token is dropped."""
    if len(token) >= 2 and token[-1] in "sS" and token[-2] in "'\u2019\uff07":
        token = token[:-2]
    token = token.lower()
    if not token or token in STOP_WORDS:
        return None
    return _STEMMER.stem(token, to_lowercase=False)


def analyze(text: str) -> list[str]:
    """Lucene ``DefaultEnglishAnalyzer`` terms of ``text``, in order (duplicates kept)."""
    terms: list[str] = []
    for segment in _WORD_BREAK.split(text):
        if not segment or not _is_token(segment):
            continue
        for start in range(0, len(segment), MAX_TOKEN_LENGTH):
            term = _normalise(segment[start : start + MAX_TOKEN_LENGTH])
            if term is not None:
                terms.append(term)
    return terms


def _int_to_byte4(i: int) -> int:
    """Lucene ``SmallFloat.intToByte4`` (length norm encoding; 24 free values, then 3-bit mantissa floats)."""
    num_free = 24
    if i < num_free:
        return i
    return num_free + _long_to_int4(i - num_free)


def _long_to_int4(i: int) -> int:
    num_bits = i.bit_length()
    if num_bits < 4:
        return i
    shift = num_bits - 4
    encoded = (i >> shift) & 0x07
    encoded |= (shift + 1) << 3
    return encoded


def _int4_to_long(i: int) -> int:
    bits = i & 0x07
    shift = (i >> 3) - 1
    if shift == -1:
        return bits
    return (bits | 0x08) << shift


def _byte4_to_int(b: int) -> int:
    num_free = 24
    if b < num_free:
        return b
    return num_free + _int4_to_long(b - num_free)


def quantised_length(n_terms: int) -> int:
    """Document length as Lucene's BM25 sees it after the norm round trip."""
    return _byte4_to_int(_int_to_byte4(n_terms))


def product_document(title: str, description: str, bullet_points: list[str], options: dict[str, list[str]]) -> str:
    """``convert_product_file_format.py``: lower(' '.join([Title, Description, BulletPoints[0], option_text]))."""
    option_text = ", and ".join(f"{name}: {', '.join(values)}" for name, values in options.items())
    return " ".join([title, description, bullet_points[0], option_text]).lower()


class BM25Index:
    """Lucene-9 BM25 over a fixed list of documents (doc id = list position).

    Args:
        docs: document texts.
        ids: the external id of each document (ASINs), same length as ``docs``.
    """

    def __init__(self, docs: list[str], ids: list[str], k1: float = K1, b: float = B) -> None:
        self.ids = list(ids)
        self.n_docs = len(docs)
        # Anserini's ScoreTiesAdjusterReranker breaks score ties by the external doc id (ASIN), ascending.
        self._id_rank = np.argsort(np.argsort(np.array(self.ids, dtype=object), kind="stable"), kind="stable")
        postings: dict[str, list[tuple[int, int]]] = defaultdict(list)
        lengths = np.zeros(self.n_docs, dtype=np.int64)
        for doc_id, text in enumerate(docs):
            counts = Counter(analyze(text))
            lengths[doc_id] = sum(counts.values())
            for term, tf in counts.items():
                postings[term].append((doc_id, tf))
        sum_ttf = int(lengths.sum())
        avgdl = sum_ttf / self.n_docs if self.n_docs else 1.0
        self.sum_total_term_freq = sum_ttf
        self.lengths = lengths
        # 1 / (k1 * ((1 - b) + b * dl / avgdl)) in float32 (Lucene BM25Scorer cache by norm byte)
        qlen = np.array([quantised_length(int(n)) for n in lengths], dtype=np.float64)
        self.norm_inverse = (
            np.float32(1.0) / (np.float32(k1) * (np.float32(1 - b) + np.float32(b) * (qlen / np.float32(avgdl)).astype(np.float32)))
        ).astype(np.float32)
        self.postings: dict[str, tuple[np.ndarray, np.ndarray, np.float32]] = {}
        for term, plist in postings.items():
            doc_ids = np.array([d for d, _ in plist], dtype=np.int64)
            tfs = np.array([t for _, t in plist], dtype=np.float32)
            df = len(plist)
            idf = np.float32(math.log(1 + (self.n_docs - df + 0.5) / (df + 0.5)))
            self.postings[term] = (doc_ids, tfs, idf)

    def search(self, query: str, k: int = 50) -> list[str]:
        """Top-``k`` document ids for ``query`` (bag of analysed terms), best first; ties by id ascending.

        Returns:
            up to ``k`` ids of documents that contain at least one query term.
        """
        counts = Counter(analyze(query))
        scores = np.zeros(self.n_docs, dtype=np.float64)
        matched = np.zeros(self.n_docs, dtype=bool)
        for term, qtf in counts.items():
            posting = self.postings.get(term)
            if posting is None:
                continue
            doc_ids, tfs, idf = posting
            w = np.float32(idf * np.float32(qtf))
            contrib = w - w / (np.float32(1.0) + tfs * self.norm_inverse[doc_ids])
            scores[doc_ids] += contrib.astype(np.float32)
            matched[doc_ids] = True
        hits = np.flatnonzero(matched)
        if hits.size == 0 or k <= 0:
            return []
        hit_scores = scores[hits].astype(np.float32)
        order = np.lexsort((self._id_rank[hits], -hit_scores))[:k]
        return [self.ids[i] for i in hits[order]]


_INDEXES: dict[int, BM25Index] = {}
_LOCK = threading.Lock()


def get_index(catalog) -> BM25Index:  # noqa: ANN001 - envs.webshop.catalog.Catalog (avoid an import cycle)
    """The process-wide index of ``catalog`` (built on first use, ~1-2 s; shared by all sessions)."""
    key = id(catalog)
    index = _INDEXES.get(key)
    if index is None:
        with _LOCK:
            index = _INDEXES.get(key)
            if index is None:
                docs = [product_document(p.title, p.description, p.bullet_points, p.options) for p in catalog.products]
                index = BM25Index(docs, [p.asin for p in catalog.products])
                _INDEXES[key] = index
    return index

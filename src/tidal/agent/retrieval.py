"""The retrieval layer of an episode's prompt: the documents most relevant to the task, by BM25.

`DocumentIndex.load(path)` reads a text file (one document per blank-line-separated paragraph) or
a folder (one document per text file under it, in sorted order, unreadable or non-UTF-8 files
refused with their path). `search(query, k)` ranks them by Okapi BM25 (k1 = 1.5, b = 0.75, the
Lucene idf `log(1 + (N - df + 0.5) / (df + 0.5))`, never negative) over lower-cased word tokens;
ties keep document order, and documents sharing no term with the query are never returned. The
scorer is a few lines of arithmetic, written here rather than taken from a package so the agent
layer needs nothing beyond the standard library.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from tidal.errors import ConfigError

_WORD = re.compile(r"[a-z0-9_]+")
MAX_DOCUMENT_BYTES = 1 << 20
K1, B = 1.5, 0.75


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


@dataclass(frozen=True)
class Document:
    name: str  # the file (and paragraph number for a single file)
    text: str


class DocumentIndex:
    """BM25 over a fixed set of documents (see the module docstring)."""

    def __init__(self, documents: list[Document]) -> None:
        self.documents = documents
        self.terms = [Counter(words(d.text)) for d in documents]
        self.lengths = [sum(t.values()) for t in self.terms]
        self.average = (sum(self.lengths) / len(self.lengths)) if self.lengths else 0.0
        frequency: Counter[str] = Counter()
        for terms in self.terms:
            frequency.update(terms.keys())
        count = len(documents)
        self.idf = {term: math.log(1 + (count - df + 0.5) / (df + 0.5)) for term, df in frequency.items()}

    @classmethod
    def load(cls, path: str | Path) -> DocumentIndex:
        """The documents at `path` (a file or a folder); ConfigError naming the path when it cannot be read."""
        path = Path(path)
        if path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.is_file())
            documents = [Document(str(p.relative_to(path)), _read(p)) for p in files]
        elif path.is_file():
            paragraphs = [p.strip() for p in re.split(r"\n\s*\n", _read(path)) if p.strip()]
            documents = [Document(f"{path.name}#{i + 1}", p) for i, p in enumerate(paragraphs)]
        else:
            raise ConfigError([f"prompt.retrieval.path: {path} does not exist"])
        if not documents:
            raise ConfigError([f"prompt.retrieval.path: {path} holds no documents"])
        return cls(documents)

    def scores(self, query: str) -> list[float]:
        terms = set(words(query))
        out = []
        for counts, length in zip(self.terms, self.lengths):
            score = 0.0
            for term in terms & counts.keys():
                tf = counts[term]
                score += self.idf[term] * tf * (K1 + 1) / (tf + K1 * (1 - B + B * length / (self.average or 1)))
            out.append(score)
        return out

    def search(self, query: str, k: int) -> list[Document]:
        """The `k` best documents for `query`, best first (only those sharing a term with it)."""
        scored = sorted(((s, i) for i, s in enumerate(self.scores(query)) if s > 0), key=lambda p: (-p[0], p[1]))
        return [self.documents[i] for _, i in scored[:k]]


def _read(path: Path) -> str:
    try:
        data = path.read_bytes()[:MAX_DOCUMENT_BYTES]
        return data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError([f"prompt.retrieval.path: cannot read {path}: {error}"]) from None

"""Character-level text corpora for language models: the text as indices into its sorted
vocabulary, a train / validation split by position, and random windows drawn on the device.

    corpus = td.corpus.Shakespeare()            # data/shakespeare/shakespeare.txt.gz
    train, val = corpus.split(0.9)              # int64 index tensors (first 90% / last 10%)
    x, y = corpus.windows(train, 64, 256)       # [64, 256] inputs and their next characters
    corpus.decode(x[0].tolist())
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

from .autodiff.shape_ops import gather_rows
from .datafiles import DataFileError, cache_root, read_file, repo_data_root
from .tensor import Tensor, arange, from_numpy, rand


class CharCorpus:
    """A text and its character vocabulary (the sorted distinct characters)."""

    def __init__(self, text: str, name="text"):
        if not text:
            raise ValueError(f"{name}: the text is empty")
        self.name = name
        self.vocab = sorted(set(text))
        self.stoi = {c: i for i, c in enumerate(self.vocab)}
        if all(ord(c) < 256 for c in self.vocab):  # one table lookup over the bytes
            table = np.zeros(256, np.int64)
            table[[ord(c) for c in self.vocab]] = np.arange(len(self.vocab))
            self.ids = table[np.frombuffer(text.encode("latin-1"), np.uint8)]
        else:
            self.ids = np.array([self.stoi[c] for c in text], np.int64)

    def __len__(self):
        return len(self.ids)

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def encode(self, text: str) -> list:
        missing = sorted({c for c in text if c not in self.stoi})
        if missing:
            raise ValueError(f"{self.name}: characters {missing!r} are not in the vocabulary "
                             f"({self.vocab_size} characters)")
        return [self.stoi[c] for c in text]

    def decode(self, ids) -> str:
        if isinstance(ids, Tensor):
            ids = ids.tolist()
        return "".join(self.vocab[int(i)] for i in ids)

    def split(self, fraction=0.9, device=None):
        """(train, val): int64 tensors of the first `fraction` of the characters and the rest."""
        if not 0.0 < fraction < 1.0:
            raise ValueError(f"{self.name}: split fraction must lie in (0, 1), got {fraction}")
        cut = int(len(self.ids) * fraction)
        return (from_numpy(self.ids[:cut]).to(device) if device else from_numpy(self.ids[:cut]),
                from_numpy(self.ids[cut:]).to(device) if device else from_numpy(self.ids[cut:]))

    @staticmethod
    def windows(ids: Tensor, batch: int, context: int):
        """(x, y): `batch` windows of `context` characters at random offsets of `ids` (drawn on
        its device from tritonad's random stream, td.manual_seed), and y the characters one
        position on."""
        n = ids.shape[0]
        if n < context + 2:
            raise ValueError(f"windows: {n} characters cannot hold a window of {context} + 1")
        starts = rand(batch, device=ids.device) * (n - context - 1)
        starts = starts.to(ids.dtype)  # (truncation: uniform over [0, n - context - 1))
        index = starts.reshape((batch, 1)) + arange(context + 1, device=ids.device)
        rows = gather_rows(ids.reshape((n, 1)), index.reshape((-1,)))
        rows = rows.reshape((batch, context + 1))
        return rows[:, :-1], rows[:, 1:]


class Shakespeare(CharCorpus):
    """Shakespeare's 42 plays and poems (Project Gutenberg texts, public domain), 5,057,198
    characters of ASCII, 84 distinct; data/shakespeare/shakespeare.txt.gz (see data/README.md).
    The decompressed text is checked against its pinned SHA256."""

    FILE = "shakespeare.txt.gz"
    SHA256 = "da68ca4e8201d41a12c1d5e82d967bda85105f1dabe823d5735138bccabdd387"

    def __init__(self, root=None):
        path = self.locate(root)
        content = read_file(path)
        digest = hashlib.sha256(content).hexdigest()
        if digest != self.SHA256:
            raise DataFileError(f"{path}: checksum mismatch: the SHA256 of its decompressed text "
                                f"is {digest}, expected {self.SHA256}; the file is corrupt or "
                                "not the corpus of that name; replace it with data/shakespeare/"
                                f"{self.FILE} from the repository")
        super().__init__(content.decode("ascii"), "Shakespeare")
        self.path = path

    @classmethod
    def locate(cls, root=None) -> Path:
        if root is not None:
            roots = [Path(root).expanduser()]
        elif os.environ.get("TRITONAD_DATA"):
            roots = [Path(os.environ["TRITONAD_DATA"]).expanduser()]
        else:
            roots = [repo_data_root(), cache_root()]
        folders = [f for r in roots for f in (r, r / "shakespeare")]
        for folder in folders:
            for name in (cls.FILE, cls.FILE[:-3]):
                if (folder / name).is_file():
                    return folder / name
        raise FileNotFoundError(f"Shakespeare: {cls.FILE} not found; looked in "
                                f"{', '.join(map(str, folders))}; the repository ships it in "
                                "data/shakespeare/ (pass root= or set TRITONAD_DATA to a folder "
                                "holding it)")

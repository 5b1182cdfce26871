"""td.corpus: the shipped Shakespeare text, its vocabulary, split, device windows and errors;
FashionMNIST's search path (Debian's folder)."""
import gzip
from pathlib import Path

import numpy as np
import pytest

import tritonad as td
from tritonad import corpus


@pytest.fixture(scope="module")
def shakespeare():
    return corpus.Shakespeare()


def test_the_shipped_text(shakespeare):
    assert len(shakespeare) == 5_057_198 and shakespeare.vocab_size == 84
    text = "ROMEO:\nWherefore art thou?"
    assert shakespeare.decode(shakespeare.encode(text)) == text
    train, val = shakespeare.split(0.9)
    assert train.shape == (4_551_478,) and val.shape == (505_720,)
    assert train.dtype == td.int64
    np.testing.assert_array_equal(np.concatenate([train.numpy(), val.numpy()]), shakespeare.ids)
    with pytest.raises(ValueError, match=r"Shakespeare: characters \['€'\] are not in the vocab"):
        shakespeare.encode("5€")
    with pytest.raises(ValueError, match="split fraction must lie in"):
        shakespeare.split(1.0)


def test_windows_are_slices_and_their_next_characters(shakespeare, backend_name):
    with td.use_backend(backend_name):
        ids = td.tensor(shakespeare.ids[:5000])
        td.manual_seed(3)
        x, y = corpus.CharCorpus.windows(ids, 6, 32)
        assert x.shape == (6, 32) and y.shape == (6, 32) and x.dtype == td.int64
        full = shakespeare.ids[:5000]
        for row_x, row_y in zip(x.numpy(), y.numpy()):
            starts = [i for i in range(5000 - 32) if (full[i:i + 32] == row_x).all()]
            assert starts, "a window is not a slice of the text"
            np.testing.assert_array_equal(row_y, full[starts[0] + 1:starts[0] + 33])
        with pytest.raises(ValueError, match="cannot hold a window of 4999"):
            corpus.CharCorpus.windows(ids, 2, 4999)


def test_a_corrupt_or_missing_text_is_named(tmp_path):
    folder = tmp_path / "shakespeare"
    folder.mkdir()
    (folder / "shakespeare.txt.gz").write_bytes(gzip.compress(b"To be, or not to be"))
    with pytest.raises(td.datafiles.DataFileError, match="checksum mismatch: the SHA256"):
        corpus.Shakespeare(root=tmp_path)
    with pytest.raises(FileNotFoundError, match="shakespeare.txt.gz not found; looked in"):
        corpus.Shakespeare(root=tmp_path / "elsewhere")


def test_fashion_mnist_looks_in_debians_folder(monkeypatch):
    monkeypatch.delenv("TRITONAD_DATA", raising=False)
    roots = td.data.FashionMNIST.roots()
    assert roots[0].name == "data" and str(roots[1]) == "/usr/share/datasets"
    assert td.data.FashionMNIST.roots("/x") == [Path("/x")]

"""The general data pipeline: datasets with transform= / target_transform=, DataLoader over any
map-style or iterable-style dataset (collate_fn, generator, the accepted worker options), and
default_collate; the device-resident path kept for MNIST with torchvision-style transforms."""
from collections import namedtuple
from pathlib import Path

import numpy as np
import pytest
import torch

import tritonad as td
from tritonad import data
from tritonad import transforms as T
from tritonad.reference import randperm_numpy

from helpers import assert_close

REPO_MNIST = Path(td.__file__).parents[1] / "data" / "mnist"
MEAN, STD = (0.1307,), (0.3081,)


@pytest.fixture(scope="module")
def mnist_images():
    ds = data.MNIST(root=REPO_MNIST, train=False, download=False)
    return ds.images, ds.labels


def mnist(transform=None, target_transform=None):
    return data.MNIST(root=REPO_MNIST, train=False, transform=transform,
                      target_transform=target_transform, download=False)


def reference_input(images_uint8):
    """torchvision's ToTensor + Normalize((0.1307,), (0.3081,)) in float32, [N, 1, H, W]."""
    return (images_uint8[:, None].astype(np.float32) / np.float32(255) - np.float32(0.1307)) / \
        np.float32(0.3081)


class Squares(data.Dataset):
    """A map-style dataset of dicts: sample i holds i in several forms."""
    Pair = namedtuple("Pair", "half twice")

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"image": np.full((2, 3), i, np.float32), "index": i, "name": f"s{i}",
                "pair": self.Pair(i / 2, td.tensor([2 * i]))}


class Stream(data.IterableDataset):
    """An iterable-style dataset of (float, int) samples, without a length."""
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return ((np.float32(i), i % 3) for i in range(self.n))


class Counting(Stream):
    def __len__(self):
        return self.n


# ---------------------------------------------------------------------- datasets
def test_mnist_transforms_as_torchvision(mnist_images):
    images, labels = mnist_images
    seen = []
    ds = mnist(transform=lambda a: (seen.append(a.dtype), a.shape, int(a[14, 14]))[1:],
               target_transform=lambda y: f"digit {y}")
    assert ds[5] == (((28, 28), int(images[5, 14, 14])), f"digit {labels[5]}")
    assert seen == [np.uint8]  # the transform gets the uint8 array, as ToTensor expects
    pipeline = T.Compose([T.ToTensor(), T.Normalize(MEAN, STD)])
    x, y = mnist(transform=pipeline)[-1]
    assert x.shape == (1, 28, 28) and x.dtype is td.float32 and y == labels[-1]
    assert_close(x, reference_input(images[-1:])[0], 1e-6, 1e-6)
    changed = mnist(transform=lambda a: a.fill(0))
    changed[3]
    assert changed.images[3].any()  # the transform got a copy
    with pytest.raises(IndexError, match="MNIST: index 10000 is out of range for 10000 images"):
        ds[10000]
    with pytest.raises(TypeError, match="transform must be callable, got str"):
        mnist(transform="ToTensor")


# ---------------------------------------------------------------------- resident path kept
def test_torchvision_style_transform_keeps_the_resident_path(mnist_images, backend_name):
    """The PyTorch MNIST example's data lines: Compose([ToTensor(), Normalize]) and the usual
    loader options; the batches come from the device-resident tensors."""
    images, labels = mnist_images
    ds = mnist(transform=T.Compose([T.ToTensor(), T.Normalize(MEAN, STD)]))
    kwargs = {"batch_size": 64, "num_workers": 1, "pin_memory": True, "shuffle": True}
    loader = data.DataLoader(ds, **kwargs, limit=200)
    assert loader.images is not None and loader.batch_transform is None
    assert loader.images.shape == (200, 1, 28, 28)
    assert_close(loader.images, reference_input(images[:200]), 1e-6, 1e-6)
    td.manual_seed(3)
    order = loader.permutation().numpy()
    td.manual_seed(3)
    batches = list(loader)
    assert [len(y) for _, y in batches] == [64, 64, 64, 8]
    assert_close(batches[1][1], labels[order[64:128]], name="labels")
    assert_close(batches[1][0], reference_input(images[order[64:128]]), 1e-6, 1e-6)


def test_augmentation_runs_on_each_resident_batch(mnist_images, backend_name):
    images, labels = mnist_images
    augment = T.RandomAffine(15, translate=(0.1, 0.1))
    ds = mnist(transform=T.Compose([T.ToTensor(), augment, T.Normalize(MEAN, STD)]))
    loader = data.DataLoader(ds, batch_size=8, shuffle=True, limit=20, flatten=True)
    assert [type(t) for t in loader.batch_transform.transforms] == [T.RandomAffine, T.Normalize]
    assert loader.images.shape == (20, 1, 28, 28)  # un-normalised: Normalize runs per batch
    td.manual_seed(9)
    batches = list(loader)
    # the same draws by hand: the epoch's permutation, then one augmentation per batch
    td.manual_seed(9)
    order = loader.permutation().numpy()
    for b, (x, y) in enumerate(batches):
        rows = order[b * 8:(b + 1) * 8]
        raw = td.tensor(images[rows][:, None].astype(np.float32) / np.float32(255))
        expected = T.Normalize(MEAN, STD)(augment(raw))
        assert x.shape == (len(rows), 784)
        assert_close(x, expected.reshape(len(rows), -1), 1e-6, 1e-6, name=f"batch {b}")
        assert_close(y, labels[rows], name="labels")


def test_transforms_the_resident_path_cannot_take_go_sample_by_sample(mnist_images):
    images, labels = mnist_images
    double = T.Compose([T.ToTensor(), lambda t: t * 2])
    for ds, kwargs in ((mnist(transform=double), {}),
                       (mnist(target_transform=lambda y: y + 1), {}),
                       (mnist(), {"collate_fn": data.default_collate})):
        loader = data.DataLoader(ds, batch_size=10, limit=25, **kwargs)
        assert loader.images is None and len(loader) == 3
        x, y = next(iter(loader))
        assert x.shape == (10, 1, 28, 28) and y.dtype is td.int64
    class Cropped(data.Dataset):  # arrays, but samples from its own __getitem__
        def __init__(self):
            self.images, self.labels = images[:6], labels[:6]

        def __len__(self):
            return 6

        def __getitem__(self, i):
            return td.tensor(self.images[i, 4:8, 4:8]), int(self.labels[i])

    loader = data.DataLoader(Cropped(), batch_size=6)
    assert loader.images is None and next(iter(loader))[0].shape == (6, 4, 4)
    x, y = next(iter(data.DataLoader(mnist(transform=double), batch_size=4)))
    assert_close(x, images[:4, None] / np.float32(255) * 2, 1e-6, 1e-6)
    y = next(iter(data.DataLoader(mnist(target_transform=lambda v: v + 1), batch_size=4)))[1]
    assert y.tolist() == (labels[:4] + 1).tolist()


# ---------------------------------------------------------------------- per-sample path
def test_map_style_dataset_batches(backend_name):
    loader = data.DataLoader(Squares(10), batch_size=4)
    batches = list(loader)
    assert len(loader) == len(batches) == 3 and loader.num_samples == 10
    first = batches[0]
    assert set(first) == {"image", "index", "name", "pair"}
    assert first["image"].shape == (4, 2, 3) and first["image"].dtype is td.float32
    assert first["index"].dtype is td.int64 and first["index"].tolist() == [0, 1, 2, 3]
    assert first["name"] == ["s0", "s1", "s2", "s3"]
    assert isinstance(first["pair"], Squares.Pair)
    assert first["pair"].half.dtype is td.float64  # Python floats batch as torch's: float64
    assert first["pair"].twice.tolist() == [[0], [2], [4], [6]]
    assert batches[2]["index"].tolist() == [8, 9]
    assert all(t.device == loader.device for t in (first["image"], first["pair"].twice))
    dropped = data.DataLoader(Squares(10), batch_size=4, drop_last=True, limit=9)
    assert [b["index"].tolist() for b in dropped] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    listed = data.DataLoader([(1.5, 2), (2.5, 3), (3.5, 4)], batch_size=2)  # a plain list
    assert [[t.tolist() for t in b] for b in listed] == [[[1.5, 2.5], [2, 3]], [[3.5], [4]]]
    custom = data.DataLoader(Squares(5), batch_size=2, collate_fn=lambda s: len(s))
    assert list(custom) == [2, 2, 1]


def test_shuffle_streams():
    n = 11
    td.manual_seed(7)  # the global stream, as the resident path's permutation
    order = np.concatenate([b["index"].numpy() for b in
                            data.DataLoader(Squares(n), batch_size=3, shuffle=True)])
    assert order.tolist() == randperm_numpy(n, 7, 0).tolist()
    # a generator: the loader's own counter, whatever else draws in between
    loader = data.DataLoader(Squares(n), batch_size=n, shuffle=True, generator=5)
    first = next(iter(loader))["index"].tolist()
    td.rand(100)
    second = next(iter(loader))["index"].tolist()
    assert first == randperm_numpy(n, 5, 0).tolist() and second == randperm_numpy(n, 5, n).tolist()
    assert first != second and sorted(second) == list(range(n))
    g = torch.Generator().manual_seed(5)  # a torch.Generator's seed is used the same way
    again = data.DataLoader(Squares(n), batch_size=n, shuffle=True, generator=g)
    assert next(iter(again))["index"].tolist() == first
    g.manual_seed(6)  # a new seed restarts the loader's counter
    assert next(iter(again))["index"].tolist() == randperm_numpy(n, 6, 0).tolist()
    # the resident path takes the generator too
    resident = data.DataLoader(data.TensorDataset(np.arange(n)), batch_size=n, shuffle=True,
                               generator=5)
    assert next(iter(resident))[0].tolist() == first


def test_iterable_datasets():
    batches = list(data.DataLoader(Counting(7), batch_size=3))
    assert [x.tolist() for x, _ in batches] == [[0, 1, 2], [3, 4, 5], [6]]
    assert batches[0][0].dtype is td.float32 and batches[0][1].tolist() == [0, 1, 2]
    assert len(data.DataLoader(Counting(7), batch_size=3)) == 3
    assert len(list(data.DataLoader(Counting(7), batch_size=3, drop_last=True))) == 2
    assert len(list(data.DataLoader(Counting(7), batch_size=2, limit=5))) == 3
    generated = data.DataLoader((i for i in range(5)), batch_size=2)  # anything with __iter__
    assert [b.tolist() for b in generated] == [[0, 1], [2, 3], [4]]
    with pytest.raises(TypeError, match="has no __len__, so the number of batches"):
        len(data.DataLoader(Stream(7), batch_size=3))
    with pytest.raises(ValueError, match="shuffle=True is not possible"):
        data.DataLoader(Counting(7), batch_size=3, shuffle=True)


def test_loader_options_errors():
    for kwargs, kind, message in (
            ({"num_workers": -1}, ValueError, "num_workers must be a non-negative int"),
            ({"sampler": [0, 1]}, NotImplementedError, "sampler= and batch_sampler= are not "
                                                       "supported yet"),
            ({"collate_fn": 3}, TypeError, "collate_fn must be callable"),
            ({"generator": "seed"}, TypeError, "generator must be an int seed"),
            ({"generator": -2}, ValueError, "non-negative int, got -2"),
            ({"flatten": True}, ValueError, "flatten=True applies to the device-resident"),
            ({"batch_size": True}, ValueError, "batch_size must be a positive int")):
        with pytest.raises(kind, match=message):
            data.DataLoader(Squares(3), **{"batch_size": 2, **kwargs})
    accepted = data.DataLoader(Squares(3), batch_size=2, num_workers=4, pin_memory=True,
                               persistent_workers=True)
    assert len(list(accepted)) == 2


# ---------------------------------------------------------------------- default_collate
def test_default_collate():
    x = [td.tensor(np.arange(6, dtype=np.float32).reshape(2, 3) + i) for i in range(3)]
    stacked = data.default_collate(x)
    assert stacked.shape == (3, 2, 3) and stacked[2].tolist() == (x[2]).tolist()
    bf16 = data.default_collate([t.bfloat16() for t in x])
    assert bf16.dtype is td.bfloat16 and bf16.float().tolist() == stacked.tolist()
    assert data.default_collate([np.int32(1), np.int32(2)]).dtype is td.int32  # numpy keeps
    assert data.default_collate([True, False]).dtype is td.bool
    lists = data.default_collate([[1, 2.0], [3, 4.0]])
    assert isinstance(lists, list) and lists[0].tolist() == [1, 3] and lists[1].dtype is td.float64
    cases = [
        ([], ValueError, "an empty batch"),
        ([x[0], x[0][:1]], ValueError, r"the tensors differ: sample 0 is float32 \(2, 3\) on "
                                       r"cpu, sample 1 is float32 \(1, 3\)"),
        ([(x[0],), (np.zeros(3),)], TypeError, r"sample 1 holds a ndarray at \[0\] where sample "
                                               "0 holds a Tensor"),
        ([np.zeros(2), np.zeros(3)], ValueError, r"arrays differ in shape: \[\(2,\), \(3,\)\]"),
        ([{"a": 1}, {"b": 1}], ValueError, r"sample 1 has keys \['b'\], sample 0 has \['a'\]"),
        ([(1, 2), (1,)], ValueError, "sequences of different lengths"),
        ([{"a": object()}] * 2, TypeError, r"cannot batch samples of type object at \['a'\]"),
        ([1, "a"], TypeError, "mix arrays, numbers and other types"),
    ]
    for batch, kind, message in cases:
        with pytest.raises(kind, match=message):
            data.default_collate(batch)


@pytest.mark.gpu
def test_pipeline_on_gpu(mnist_images):
    images, labels = mnist_images
    with td.use_backend("triton"):
        on_gpu = [td.tensor(np.full((2, 2), i, np.float32), device="cuda") for i in range(3)]
        stacked = data.default_collate(on_gpu)  # our copy kernel into slices
        assert stacked.device.type == "cuda" and stacked[:, 0, 0].tolist() == [0, 1, 2]
        # samples made on the host, batches moved to the GPU by the loader
        ds = mnist(transform=T.Compose([T.ToTensor(), lambda t: t, T.Normalize(MEAN, STD)]))
        x, y = next(iter(data.DataLoader(ds, batch_size=32, device="cuda")))
        assert x.device.type == "cuda" and y.device.type == "cuda"
        assert_close(x, reference_input(images[:32]), 1e-6, 1e-6)
        augment = T.Compose([T.ToTensor(), T.RandomCrop(28, padding=2), T.Normalize(MEAN, STD)])
        loader = data.DataLoader(mnist(transform=augment), batch_size=128, shuffle=True,
                                 device="cuda")
        x, y = next(iter(loader))
        assert x.shape == (128, 1, 28, 28) and x.device.type == "cuda"


def test_subset_concat_and_random_split_as_torch():
    import torch.utils.data as tud
    base = Squares(10)
    sub = data.Subset(base, [7, 2, -1])
    ref = tud.Subset(list(range(10)), [7, 2, -1])
    assert len(sub) == 3 and [s["index"] for s in sub] == [ref[i] for i in range(3)] == [7, 2, 9]
    assert [b["index"].tolist() for b in data.DataLoader(sub, batch_size=2)] == [[7, 2], [9]]
    both = data.ConcatDataset([data.Subset(base, [1, 3]), Squares(2)])
    assert len(both) == 4 and [both[i]["index"] for i in range(4)] == [1, 3, 0, 1]
    assert both[-1]["index"] == 1 and both.cumulative_sizes == [2, 4]
    with pytest.raises(IndexError, match="ConcatDataset: index 4"):
        both[4]
    with pytest.raises(IndexError, match="Subset: index 10 is out of range"):
        data.Subset(base, [0, 10])
    with pytest.raises(TypeError, match="ConcatDataset: Stream is not a map-style"):
        data.ConcatDataset([Stream(3)])
    # random_split: disjoint parts covering everything; fractions split as torch's do
    parts = data.random_split(base, [0.5, 0.3, 0.2], generator=3)
    torch_parts = tud.random_split(range(10), [0.5, 0.3, 0.2])
    assert [len(p) for p in parts] == [len(p) for p in torch_parts] == [5, 3, 2]
    odd = data.random_split(range(11), [0.5, 0.5])
    assert [len(p) for p in odd] == [len(p) for p in tud.random_split(range(11), [0.5, 0.5])]
    assert sorted(sum((p.indices for p in parts), [])) == list(range(10))
    assert [p.indices for p in data.random_split(base, [5, 3, 2], generator=3)] == \
        [p.indices for p in parts] and parts[0].indices == randperm_numpy(10, 3, 0)[:5].tolist()
    td.manual_seed(1)
    first = [p.indices for p in data.random_split(base, [6, 4])]
    td.manual_seed(1)
    assert [p.indices for p in data.random_split(base, [6, 4])] == first
    with pytest.raises(ValueError, match="sum to the dataset's 10 samples"):
        data.random_split(base, [6, 5])
    with pytest.raises(TypeError, match="generator must be"):
        data.random_split(base, [5, 5], generator="seed")
    assert td.utils.data.random_split is data.random_split  # torch.utils.data's names
    assert td.utils.data.DataLoader is data.DataLoader


def test_subset_of_arrays_stays_on_the_device(mnist_images, backend_name):
    images, labels = mnist_images
    ds = mnist(T.Compose([T.ToTensor(), T.Normalize(MEAN, STD)]))
    train, val = data.random_split(ds, [0.75, 0.25], generator=0)
    loader = data.DataLoader(data.Subset(val, range(1, 9)), batch_size=5)
    assert loader.images is not None and loader.num_samples == 8  # the resident path
    rows = np.asarray(val.indices)[1:9]
    got = np.concatenate([x.numpy() for x, _ in loader])
    assert_close(got, reference_input(images[rows]), rtol=1e-6, atol=1e-6)
    assert np.concatenate([y.numpy() for _, y in loader]).tolist() == labels[rows].tolist()
    xs = td.arange(20).reshape(10, 2)
    tensors = data.DataLoader(data.Subset(data.TensorDataset(xs), [9, 0]), batch_size=2)
    assert tensors.tensors is not None and next(iter(tensors))[0].tolist() == [[18, 19], [0, 1]]
    assert len(train) + len(val) == len(ds) and not set(train.indices) & set(val.indices)

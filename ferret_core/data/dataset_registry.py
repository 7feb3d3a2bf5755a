"""Dataset names (DESIGN §4) and :func:`load_dataset`, the one entry point that resolves them.

The data root is always an explicit argument (the core resolves no default directory and reads no
environment); only ``digits`` needs none. ``seed`` drives every random choice a loader makes (shuffling
class-grouped files, drawing a train/test split); datasets published in a fixed order (MNIST,
Fashion-MNIST, EMNIST, CIFAR-100, SVHN) keep it. ``cache_dir`` (optional) stores decoded images
for the loaders that decode image files (``cifar10``, ``tiny-imagenet``, ``core50*``, ``clear*``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ferret_core.data.cifar10_jpeg import load_cifar10
from ferret_core.data.cifar100 import load_cifar100
from ferret_core.data.covertype import load_covertype
from ferret_core.data.dataset import Dataset
from ferret_core.data.digits import load_digits
from ferret_core.data.idx import load_emnist, load_fashion_mnist, load_mnist
from ferret_core.data.image_folders import load_clear, load_core50, load_tiny_imagenet
from ferret_core.data.images import Progress
from ferret_core.data.splits import split_by_class
from ferret_core.data.svhn import load_svhn
from ferret_core.errors import ConfigError

BASE_NAMES: tuple[str, ...] = (
    "digits",
    "mnist",
    "fashion-mnist",
    "emnist",
    "cifar10",
    "cifar100",
    "svhn",
    "tiny-imagenet",
    "core50",
    "core50-iid",
    "covertype",
    "clear10",
    "clear100",
)
SPLIT_PREFIX = "split-"
DATASET_NAMES: tuple[str, ...] = BASE_NAMES + tuple(SPLIT_PREFIX + name for name in BASE_NAMES)

Loader = Callable[[Path, int, Path | None, Progress | None], Dataset]

_LOADERS: dict[str, Loader] = {
    "mnist": lambda root, seed, cache, progress: load_mnist(root),
    "fashion-mnist": lambda root, seed, cache, progress: load_fashion_mnist(root),
    "emnist": lambda root, seed, cache, progress: load_emnist(root),
    "cifar10": lambda root, seed, cache, progress: load_cifar10(root, seed=seed, cache_dir=cache, progress=progress),
    "cifar100": lambda root, seed, cache, progress: load_cifar100(root),
    "svhn": lambda root, seed, cache, progress: load_svhn(root),
    "tiny-imagenet": lambda root, seed, cache, progress: load_tiny_imagenet(
        root, seed=seed, cache_dir=cache, progress=progress
    ),
    "core50": lambda root, seed, cache, progress: load_core50(root, seed=seed, cache_dir=cache, progress=progress),
    "core50-iid": lambda root, seed, cache, progress: load_core50(
        root, iid=True, seed=seed, cache_dir=cache, progress=progress
    ),
    "covertype": lambda root, seed, cache, progress: load_covertype(root, seed=seed),
    "clear10": lambda root, seed, cache, progress: load_clear(
        root, "clear10", seed=seed, cache_dir=cache, progress=progress
    ),
    "clear100": lambda root, seed, cache, progress: load_clear(
        root, "clear100", seed=seed, cache_dir=cache, progress=progress
    ),
}


def load_dataset(
    name: str,
    root: str | Path | None,
    *,
    seed: int = 0,
    cache_dir: str | Path | None = None,
    progress: Progress | None = None,
) -> Dataset:
    """Load the dataset called ``name`` (one of :data:`DATASET_NAMES`) from the data ``root``.

    ``split-<name>`` returns the 5-task class-incremental version of ``<name>``
    (:func:`ferret_core.data.splits.split_by_class`). Raises :class:`ConfigError` for an unknown name
    or a missing root, and :class:`DataError` naming the expected files when they are missing or
    malformed. ``progress(done, total)`` (``total`` may be None) is called while image files are
    decoded, for a progress bar; nothing is called when the arrays come from the cache.
    """
    if name not in DATASET_NAMES:
        raise ConfigError(f"unknown dataset {name!r}: expected one of {', '.join(DATASET_NAMES)}")
    if name.startswith(SPLIT_PREFIX):
        return split_by_class(
            load_dataset(name[len(SPLIT_PREFIX) :], root, seed=seed, cache_dir=cache_dir, progress=progress)
        )
    if name == "digits":
        return load_digits(seed=seed)
    if root is None:
        raise ConfigError(
            f"dataset {name!r} is read from files: pass the data root folder (root=...), "
            "e.g. the folder that holds MNIST/raw/ or CIFAR10-jpeg-q75.tar.gz"
        )
    cache = None if cache_dir is None else Path(cache_dir)
    return _LOADERS[name](Path(root), seed, cache, progress)


# What a stream of each dataset looks like, without loading it (services build models and validators
# from this). Must agree with the loaders: tests/unit/test_data_specs.py checks the ones available here.
DATASET_SPECS: dict[str, tuple[tuple[int, ...], int]] = {
    "digits": ((1, 8, 8), 10),
    "mnist": ((1, 28, 28), 10),
    "fashion-mnist": ((1, 28, 28), 10),
    "emnist": ((1, 28, 28), 47),
    "cifar10": ((3, 32, 32), 10),
    "cifar100": ((3, 32, 32), 100),
    "svhn": ((3, 32, 32), 10),
    "tiny-imagenet": ((3, 32, 32), 200),
    "core50": ((3, 32, 32), 10),
    "core50-iid": ((3, 32, 32), 10),
    "covertype": ((54,), 7),
    "clear10": ((3, 224, 224), 11),
    "clear100": ((3, 224, 224), 101),
}


def dataset_spec(name: str) -> tuple[tuple[int, ...], int]:
    """(per-item input shape, number of classes) of a dataset name, ``split-<name>`` included."""
    base = name.removeprefix(SPLIT_PREFIX)
    if base not in DATASET_SPECS:
        raise ConfigError(f"unknown dataset {name!r}: expected one of {list(DATASET_NAMES)}")
    return DATASET_SPECS[base]

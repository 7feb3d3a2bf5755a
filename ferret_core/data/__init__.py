"""Datasets as streams: loaders for the names of DESIGN §4 and the stream the engine consumes.

``load_dataset(name, root)`` returns a :class:`Dataset` (uint8 images or float32 features in memory);
``iter_stream(ds)`` yields :class:`StreamItem` ``(index, x, y, task)`` with ``x`` float32 in ``[0, 1]``;
``test_split(ds)`` gives the held-out tensors (``test_batches`` in batches). Both streams resize images
to a model's ``input_shape`` when it differs (bilinear). The data root is always passed in explicitly.
"""

from ferret_core.data.dataset import Dataset, normalise
from ferret_core.data.dataset_registry import DATASET_NAMES, DATASET_SPECS, dataset_spec, load_dataset
from ferret_core.data.stream import RESIZE_METHOD, StreamItem, iter_stream, needs_resize, test_batches, test_split

__all__ = [
    "DATASET_NAMES",
    "DATASET_SPECS",
    "RESIZE_METHOD",
    "Dataset",
    "StreamItem",
    "dataset_spec",
    "iter_stream",
    "load_dataset",
    "needs_resize",
    "normalise",
    "test_batches",
    "test_split",
]

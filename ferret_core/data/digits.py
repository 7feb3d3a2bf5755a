"""scikit-learn's bundled 8×8 digits (1,797 real images): the stream that needs no data root.

Pixel values 0…16 are scaled to float32 ``[0, 1]`` (÷16) and shaped ``(N, 1, 8, 8)``. Split: a seeded
random 80/20 train/test split (1,438 / 359 rows), the training rows in that random order.
"""

from __future__ import annotations

import numpy as np

from ferret_core.data.dataset import Dataset, holdout_indices

TEST_FRACTION = 0.2


def load_digits(*, seed: int = 0) -> Dataset:
    """The digits dataset as float32 ``(N, 1, 8, 8)`` in ``[0, 1]``, 10 classes."""
    from sklearn.datasets import load_digits as sklearn_load_digits

    bunch = sklearn_load_digits()
    x = (np.asarray(bunch.data, dtype=np.float32) / 16.0).reshape(-1, 1, 8, 8)
    y = np.asarray(bunch.target, dtype=np.int64)
    train, test = holdout_indices(len(y), TEST_FRACTION, seed)
    return Dataset("digits", x[train], y[train], x[test], y[test], num_classes=10, input_shape=(1, 8, 8))

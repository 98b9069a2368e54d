"""scikit-learn's bundled digits: small enough for tests that train in seconds."""

import numpy as np

Split = tuple[np.ndarray, np.ndarray]


def digits(test_fraction: float = 0.2) -> tuple[Split, Split]:
    """Loads the 1,797 8x8 handwritten digits bundled with scikit-learn, split in two.

    Images come as float32 in [0, 1] with shape (8, 8, 1), labels as int64 class ids. The
    split is the same on every call and every machine.

    Args:
        test_fraction: Share of the images held out for testing. Defaults to 0.2.

    Example:

    >>> (x_train, y_train), (x_test, y_test) = digits()
    >>> x_train.shape
    (1438, 8, 8, 1)
    """
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = (bunch.images.astype(np.float32) / 16.0)[..., None]
    labels = bunch.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(labels))
    split_at = len(labels) - int(round(len(labels) * test_fraction))
    train, test = order[:split_at], order[split_at:]
    return (images[train], labels[train]), (images[test], labels[test])

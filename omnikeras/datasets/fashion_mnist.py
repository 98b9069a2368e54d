"""Fashion-MNIST, from Debian's `dataset-fashion-mnist` files where present, else Keras'."""

import gzip
import pathlib

import numpy as np

DEBIAN_DIR = pathlib.Path("/usr/share/datasets/fashion-mnist")

Split = tuple[np.ndarray, np.ndarray]


def fashion_mnist() -> tuple[Split, Split]:
    """Loads Fashion-MNIST (60,000 training and 10,000 test images of clothes, 10 classes).

    Images come as float32 in [0, 1] with shape (28, 28, 1), labels as int64 class ids.
    The files of the Debian package `dataset-fashion-mnist` are read where installed;
    elsewhere Keras' loader downloads them once into its cache.

    Example:

    >>> (x_train, y_train), (x_test, y_test) = fashion_mnist()
    >>> x_train.shape
    (60000, 28, 28, 1)
    """
    if (DEBIAN_DIR / "train-images-idx3-ubyte.gz").exists():
        raw = (
            (_idx(DEBIAN_DIR / "train-images-idx3-ubyte.gz"), _idx(DEBIAN_DIR / "train-labels-idx1-ubyte.gz")),
            (_idx(DEBIAN_DIR / "t10k-images-idx3-ubyte.gz"), _idx(DEBIAN_DIR / "t10k-labels-idx1-ubyte.gz")),
        )
    else:
        import keras

        raw = keras.datasets.fashion_mnist.load_data()
    return tuple(_prepare(images, labels) for images, labels in raw)  # type: ignore[return-value]


def _idx(path: pathlib.Path) -> np.ndarray:
    """Reads an IDX file: a magic number whose last byte is the rank, the dimensions, and
    unsigned bytes."""
    with gzip.open(path, "rb") as f:
        content = f.read()
    rank = content[3]
    shape = np.frombuffer(content, ">u4", count=rank, offset=4)
    return np.frombuffer(content, np.uint8, offset=4 + 4 * rank).reshape(shape)


def _prepare(images: np.ndarray, labels: np.ndarray) -> Split:
    return (images.astype(np.float32) / 255.0)[..., None], labels.astype(np.int64)

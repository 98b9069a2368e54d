"""The reference CNN: what `omnikeras profile` measures when no model is named."""

import keras


def reference_cnn() -> keras.Model:
    """A small CNN for 28x28x1 images (Fashion-MNIST's shape), about 1.2M parameters.

    Two 3x3 convolutions back to back (32 then 64 channels), one max-pooling, and two
    dense layers. Most of its work is the second convolution, a matrix product large
    enough for the CPU to run near its peak, so the device profiles and
    `benchmarks/cpu_path.py` measure the hardware rather than per-op overhead.

    Example:

    >>> model = reference_cnn()
    >>> model.output_shape
    (None, 10)
    """
    return keras.Sequential([
        keras.Input((28, 28, 1)),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.Conv2D(64, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(10, activation="softmax"),
    ], name="reference_cnn")

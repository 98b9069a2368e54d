"""A CNN on Fashion-MNIST, trained on a local cluster through the parameter server.

Run it with the launcher, which starts the parameter server and the workers:

    omnikeras launch --workers 4 --groups 2 examples/fashion_mnist.py --epochs 2

Every worker runs this same script; the chief (worker 0) shows the progress bar, runs
validation and prints the test accuracy.
"""

import argparse

import keras

import omnikeras


def build_model() -> keras.Model:
    return keras.Sequential([
        keras.Input((28, 28, 1)),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(64, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(10, activation="softmax"),
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64, help="examples per update (default: %(default)s)")
    parser.add_argument("--learning-rate", type=float, default=0.05)
    parser.add_argument("--momentum", type=float, default=0.6)
    parser.add_argument("--examples", type=int, help="train on the first N images only")
    args = parser.parse_args()

    (x_train, y_train), (x_test, y_test) = omnikeras.datasets.fashion_mnist()
    if args.examples:
        x_train, y_train = x_train[: args.examples], y_train[: args.examples]

    strategy = omnikeras.GroupedAsyncStrategy()
    with strategy.scope():
        model = build_model()
        model.compile(
            optimizer=keras.optimizers.SGD(args.learning_rate, momentum=args.momentum),
            loss="sparse_categorical_crossentropy",
            metrics=["accuracy"],
        )
    model.fit(
        x_train, y_train, batch_size=args.batch_size, epochs=args.epochs,
        validation_data=(x_test, y_test), verbose=2,
    )
    if strategy.config.is_chief:
        _, accuracy = model.evaluate(x_test, y_test, verbose=0)
        print(f"test accuracy: {accuracy:.4f}")


if __name__ == "__main__":
    main()

"""A CNN on Fashion-MNIST, trained on a local cluster through the parameter server, with
OmnivoreCallback choosing the number of groups, the momentum and the learning rate.

Run it with the launcher, which starts the parameter server and the workers:

    omnikeras launch --workers 1 examples/fashion_mnist.py --epochs 5

On one CPU machine one worker process is the fastest layout: the tuner then tunes the
momentum and the learning rate (there are no groups to choose among). On several devices
(GPUs, hosts, or an emulated cluster: `--emulate cpu-cluster-1gbit`) it chooses the number
of groups too. Every worker runs this same script; the chief (worker 0) shows the progress
bar, runs validation, prints each tuning phase's choice and the test accuracy. The study
is left in runs/omnivore.db: `omnikeras report sqlite:///runs/omnivore.db --out
runs/report` draws it. With `--fixed`, the settings given on the command line are kept
instead.
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
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64, help="examples per update (default: %(default)s)")
    parser.add_argument("--learning-rate", type=float, default=0.01, help="until the tuner's first choice")
    parser.add_argument("--momentum", type=float, default=0.9, help="until the tuner's first choice")
    parser.add_argument("--examples", type=int, help="train on the first N images only")
    parser.add_argument("--target-loss", type=float, default=0.3, help="the training loss the tuner aims for")
    parser.add_argument("--fixed", action="store_true", help="keep the groups, momentum and learning rate given")
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
    callbacks = [] if args.fixed else [omnikeras.OmnivoreCallback(target_loss=args.target_loss)]
    model.fit(
        x_train, y_train, batch_size=args.batch_size, epochs=args.epochs,
        validation_data=(x_test, y_test), callbacks=callbacks, verbose=2,
    )
    if strategy.config.is_chief:
        _, accuracy = model.evaluate(x_test, y_test, verbose=0)
        print(f"test accuracy: {accuracy:.4f}")


if __name__ == "__main__":
    main()

"""Step time of training through `omnikeras launch --workers 1`, against plain Keras.

What users compare: the same script's model, data and batch, trained by plain Keras
`fit` in one process, or launched on a local cluster of one worker and one parameter
server (the launcher's defaults: on this host the worker exchanges with the server
through shared memory). Two models: the main job's CNN (`examples/fashion_mnist.py`,
about 225K parameters) and the reference CNN (`omnikeras.profiles.reference_cnn`, about
1.2M), both with SGD(0.01, momentum 0.9); the main job's CNN with Keras' default Adam
(its moments on the server, against plain Keras' Adam); and a deep MLP of 64 small dense
layers with SGD (`step_time_worker.deep_mlp`: 128 variables, where the server's cost by
variable shows). Each run is a fresh process (`step_time_worker.py`) that trains on Fashion-MNIST
with batch 64 and times its steps after a warm-up. Each runs with the threads users get:
plain Keras TensorFlow's defaults, the launched worker what the launcher chooses (two
inter-op threads at least: the exchange holds one while backpropagation goes on). In each
round, a plain and a launched run start together, warm up, and then take turns on the
machine (`turns.py`), 9 turns of 40 steps each, the one waiting idle; which goes first
alternates with the turn. Each figure is the median over the rounds of launched mean step
time / plain mean step time. On a shared machine whose speed drifts over seconds, turns of
a fraction of a second put both runs in the same phases of it, where whole runs one after
the other did not (single rounds of the main CNN read from 0.69 to 1.55 that way).

Whole epochs as users run them, too: the main job's script, `examples/fashion_mnist.py
--fixed` with its metrics, validation and progress line, launched with `--workers 1
--groups 1`, against the same script in plain Keras (`epoch_time_worker.py --plain`), each
run 3 epochs: the first traces the model, and the last 2 are turns, taken likewise; each
figure is the median over the rounds of the ratio of mean epoch times.

The last line of stdout is one JSON object: `{"step_time_vs_plain_keras_main": ..,
"step_time_vs_plain_keras_reference": .., "step_time_vs_plain_keras_adam": ..,
"step_time_vs_plain_keras_deep": .., "epoch_time_vs_plain_keras_main": .., "epoch_after_first_batch_vs_plain_keras_main": ..}`;
the last is the epoch figure from each epoch's first batch on, which leaves out plain
Keras' occasional wait of seconds for an epoch's first batch (see docs/benchmarks.md).
Progress goes to stderr. `--quick` runs one short round, for a correctness check.

    .venv/bin/python benchmarks/strategy_overhead.py [--quick | --rounds 5]
"""

import argparse
import json
import os
import pathlib
import statistics
import sys
import tempfile

from turns import run_in_turns

from omnikeras.profiles.thread_cache import cached_thread_settings

WORKER_SCRIPT = pathlib.Path(__file__).with_name("step_time_worker.py")
EPOCH_SCRIPT = pathlib.Path(__file__).with_name("epoch_time_worker.py")
MAIN_JOB = pathlib.Path(__file__).resolve().parent.parent / "examples" / "fashion_mnist.py"
# Figure name -> the model and optimizer it times.
CASES = {"main": ("main", "sgd"), "reference": ("reference", "sgd"), "adam": ("main", "adam"), "deep": ("deep", "sgd")}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one short round, for a correctness check")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of the full run (default: %(default)s)")
    args = parser.parse_args()
    rounds, warmup, turn_steps, turns = (1, 4, 4, 2) if args.quick else (args.rounds, 40, 40, 9)
    steps = warmup + turns * turn_steps

    worker_threads = cached_thread_settings(log).for_worker()
    # The environment users run both in: no thread settings exported.
    env = {k: v for k, v in os.environ.items() if not k.startswith("TF_NUM_")} | {"TF_CPP_MIN_LOG_LEVEL": "2"}
    log(f"threads: plain Keras TensorFlow's defaults, the launched worker {worker_threads.intra_op} intra-op and "
        f"{worker_threads.inter_op} inter-op (the launcher's choice); batch 64, {steps} steps a run, timed after {warmup}")
    ratios: dict[str, list[float]] = {case: [] for case in CASES}
    epoch_ratios: list[float] = []
    epoch_ratios_after_first_batch: list[float] = []
    epochs = 2 if args.quick else 3
    epoch_args = ["--fixed", "--epochs", str(epochs), *(["--examples", "1024"] if args.quick else [])]
    with tempfile.TemporaryDirectory() as log_dir:
        for round_index in range(rounds):
            for case, (model, optimizer) in CASES.items():
                worker = [
                    str(WORKER_SCRIPT), "--model", model, "--optimizer", optimizer,
                    "--steps", str(steps), "--warmup", str(warmup), "--turn-steps", str(turn_steps),
                ]
                plain, launched = plain_and_launched(
                    [sys.executable, *worker, "--plain"],
                    [
                        sys.executable, "-m", "omnikeras", "launch", "--workers", "1", "--groups", "1",
                        "--log-dir", os.path.join(log_dir, f"{case}-{round_index}"), *worker,
                    ],
                    round_index, turns, env, log_dir,
                )
                if launched["steps"] != steps or plain["steps"] != steps:
                    raise RuntimeError(f"expected {steps} steps, got {launched['steps']} and {plain['steps']}")
                ratios[case].append(launched["mean_step_s"] / plain["mean_step_s"])
                log(
                    f"round {round_index + 1}/{rounds}, {model} model with {optimizer} ({plain['parameters']:,} parameters): "
                    f"plain {plain['mean_step_s'] * 1e3:.2f} ms/step (median {plain['median_step_s'] * 1e3:.2f}), "
                    f"launched {launched['mean_step_s'] * 1e3:.2f} ms/step (median {launched['median_step_s'] * 1e3:.2f}, "
                    f"{'shared memory' if launched['shared_memory'] else 'gRPC'}), ratio {ratios[case][-1]:.3f}"
                )
            whole, after_first_batch = time_epochs(round_index, rounds, epochs, epoch_args, log_dir, env)
            epoch_ratios.append(whole)
            epoch_ratios_after_first_batch.append(after_first_batch)
    figures = {f"step_time_vs_plain_keras_{case}": round(statistics.median(ratios[case]), 3) for case in CASES}
    figures["epoch_time_vs_plain_keras_main"] = round(statistics.median(epoch_ratios), 3)
    figures["epoch_after_first_batch_vs_plain_keras_main"] = round(statistics.median(epoch_ratios_after_first_batch), 3)
    print(json.dumps(figures))
    return 0


def plain_and_launched(
    plain_command: list[str], launched_command: list[str], round_index: int, turns: int, env: dict[str, str], log_dir: str
) -> tuple[dict, dict]:
    """The results of a plain and a launched run taking `turns` turns; which goes first
    alternates with the round, which cancels a drift within a turn."""
    commands = {"plain": plain_command, "launched": launched_command}
    order = ["plain", "launched"] if round_index % 2 == 0 else ["launched", "plain"]
    results = run_in_turns({name: commands[name] for name in order}, turns, env, log_dir)
    return results["plain"], results["launched"]


def time_epochs(
    round_index: int, rounds: int, epochs: int, epoch_args: list[str], log_dir: str, env: dict[str, str]
) -> tuple[float, float]:
    """One round of the main job's epochs, plain and launched, each with the environment
    users run it in (the launcher chooses the worker's threads; plain Keras takes
    TensorFlow's defaults), taking turns of an epoch after the first; the ratio of their
    mean epoch times after the first, whole and from each epoch's first batch on (plain
    Keras' first batch of an epoch sometimes waits seconds for `tf.data`'s autotuning:
    see docs/benchmarks.md)."""
    plain_command = [sys.executable, str(EPOCH_SCRIPT), "--plain", str(MAIN_JOB), *epoch_args]
    launched_command = [
        sys.executable, "-m", "omnikeras", "launch", "--workers", "1", "--groups", "1",
        "--log-dir", os.path.join(log_dir, f"epochs-{round_index}"), str(EPOCH_SCRIPT), str(MAIN_JOB), *epoch_args,
    ]
    plain, launched = plain_and_launched(plain_command, launched_command, round_index, epochs - 1, env, log_dir)
    plain_s, launched_s = statistics.fmean(plain["epoch_s"][1:]), statistics.fmean(launched["epoch_s"][1:])
    plain_rest_s, launched_rest_s = (
        statistics.fmean(e - f for e, f in zip(times["epoch_s"][1:], times["first_batch_s"][1:]))
        for times in (plain, launched)
    )
    # Launched, a pass leaves out the short last batch, which plain Keras trains: 937
    # steps against 938 for Fashion-MNIST at batch 64.
    log(
        f"round {round_index + 1}/{rounds}, the main job's epochs (validation included): "
        f"plain {plain_s:.2f} s ({plain['steps'][-1]} steps), launched {launched_s:.2f} s "
        f"({launched['steps'][-1]} steps), ratio {launched_s / plain_s:.3f}; first batches plain "
        f"{_seconds(plain['first_batch_s'][1:])}, launched {_seconds(launched['first_batch_s'][1:])}; "
        f"validations plain {_seconds(plain['validation_s'][1:])}, launched {_seconds(launched['validation_s'][1:])}; "
        f"after the first batch, ratio {launched_rest_s / plain_rest_s:.3f}"
    )
    return launched_s / plain_s, launched_rest_s / plain_rest_s


def _seconds(times: list[float]) -> str:
    return "/".join(f"{t:.2f}" for t in times) + " s"


if __name__ == "__main__":
    sys.exit(main())

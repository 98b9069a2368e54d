"""An epoch is one pass over the data under the strategy, also when the groups change in
the middle of one: across the workers, each example is read once per pass, from arrays,
a `keras.utils.PyDataset` or a Python generator."""

import collections
import json
import pathlib
import subprocess
import sys

import pytest

SCRIPT = pathlib.Path(__file__).with_name("epoch_script.py")
EXAMPLES, BATCHES_PER_PASS = 600, 30
pytestmark = pytest.mark.slow


def _launch(tmp_path: pathlib.Path, *script_args: str) -> list[dict]:
    run = subprocess.run(
        [sys.executable, "-m", "omnikeras", "launch", "--log-dir", str(tmp_path / "logs"), "--no-merge",
         "--workers", "3", "--groups", "3", str(SCRIPT), "--out", str(tmp_path), *script_args],
        capture_output=True, text=True, timeout=600,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    workers = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("worker-*.json"))]
    assert len(workers) == 3
    return workers


def _passes(workers: list[dict]) -> tuple[dict[int, collections.Counter[int]], set[int]]:
    """Across the workers: how often each example was read in each pass, and the batches read."""
    by_pass: dict[int, collections.Counter[int]] = collections.defaultdict(collections.Counter)
    batches_read: set[int] = set()
    for worker in workers:
        for batch, ids in worker["read"].items():
            by_pass[int(batch) // BATCHES_PER_PASS].update(ids)
            batches_read.add(int(batch))
    return by_pass, batches_read


def test_each_example_is_read_once_per_pass_across_a_regrouping(tmp_path) -> None:
    workers = _launch(tmp_path, "--epochs", "3")
    chief = next(w for w in workers if "epochs" in w)
    assert chief["epochs"] == 3
    assert chief["layouts"][:2] == [3, 3] and chief["layouts"][-1] == 2, "regrouped within the second epoch"
    by_pass, batches_read = _passes(workers)
    # The last pass may end with batches handed out that nobody read: the chief stopped.
    for number in range(3):
        counts = by_pass[number]
        assert set(counts.values()) == {1}, f"pass {number}: read twice: {[i for i, c in counts.items() if c > 1][:10]}"
        if number < 2:
            assert set(range(number * BATCHES_PER_PASS, (number + 1) * BATCHES_PER_PASS)) <= batches_read
            assert sorted(counts) == list(range(EXAMPLES)), f"pass {number}: examples missing"


def test_the_others_wait_for_a_slow_chief_so_that_its_epochs_are_the_passes(tmp_path) -> None:
    # The chief sleeps as it starts and at each epoch's end: the other groups, which would
    # read on into passes the fit did not ask for, wait for it at each pass instead.
    workers = _launch(tmp_path, "--epochs", "3", "--slow-chief")
    chief = next(w for w in workers if "epochs" in w)
    assert chief["epochs"] == 3
    by_pass, batches_read = _passes(workers)
    assert max(batches_read) < 3 * BATCHES_PER_PASS, f"passes read: {sorted(by_pass)}"
    # As the chief stops, the last pass may have batches handed out that nobody read.
    for number in range(3):
        assert set(by_pass[number].values()) == {1}, f"pass {number}: read twice"
        if number < 2:
            assert sorted(by_pass[number]) == list(range(EXAMPLES)), f"pass {number}: examples missing"
    assert all(len(w["read"]) > 0 for w in workers), "every worker trained"


@pytest.mark.parametrize("source, epochs", [("py_dataset", 3), ("generator", 1)])
def test_a_py_dataset_and_a_generator_are_read_once_per_pass_across_three_workers(tmp_path, source: str, epochs: int) -> None:
    # The PyDataset's epochs are its passes; the generator yields three passes and ends.
    # As the chief stops, the last pass may have batches handed out that nobody read. Each
    # worker counts its epochs from its first step, and the chief's end ends training: a
    # chief whose first step came passes late (its start on a busy machine is longer than
    # a pass of this tiny model) reads its three passes from there, and the others read
    # into a fourth of them at most, until the chief's stop reaches them.
    workers = _launch(tmp_path, "--input", source, "--epochs", str(epochs))
    chief = next(w for w in workers if "epochs" in w)
    assert chief["epochs"] == epochs
    chief_first_pass = min(int(batch) for batch in chief["read"]) // BATCHES_PER_PASS
    by_pass, batches_read = _passes(workers)
    assert sum(len(w["read"]) > 0 for w in workers) == 3, f"every worker trained: {[len(w['read']) for w in workers]}"
    for number, counts in by_pass.items():
        assert set(counts.values()) == {1}, f"pass {number}: read twice: {[i for i, c in counts.items() if c > 1][:10]}"
        if number < 2:
            assert sorted(counts) == list(range(EXAMPLES)), f"pass {number}: examples missing"
    # The generator's three passes are all it has.
    last_pass = chief_first_pass + 3 if source == "py_dataset" else 2
    spans = [(min(map(int, w["read"]), default=None), max(map(int, w["read"]), default=None)) for w in workers]
    assert max(batches_read) < (last_pass + 1) * BATCHES_PER_PASS, f"batches each worker read, first to last: {spans}"

"""An epoch is one pass over the data under the strategy, also when the groups change in
the middle of one: across the workers, each example is read once per pass."""

import collections
import json
import pathlib
import subprocess
import sys

import pytest

SCRIPT = pathlib.Path(__file__).with_name("epoch_script.py")
EXAMPLES, BATCHES_PER_PASS = 600, 30
pytestmark = pytest.mark.slow


def test_each_example_is_read_once_per_pass_across_a_regrouping(tmp_path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "omnikeras", "launch", "--log-dir", str(tmp_path / "logs"), "--no-merge",
         "--workers", "3", "--groups", "3", str(SCRIPT), "--out", str(tmp_path), "--epochs", "3"],
        capture_output=True, text=True, timeout=600,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    workers = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("worker-*.json"))]
    assert len(workers) == 3
    chief = next(w for w in workers if "epochs" in w)
    assert chief["epochs"] == 3
    assert chief["layouts"][:2] == [3, 3] and chief["layouts"][-1] == 2, "regrouped within the second epoch"

    by_pass: dict[int, collections.Counter[int]] = collections.defaultdict(collections.Counter)
    batches_read: set[int] = set()
    for worker in workers:
        for batch, ids in worker["read"].items():
            by_pass[int(batch) // BATCHES_PER_PASS].update(ids)
            batches_read.add(int(batch))
    # The last pass may end with batches handed out that nobody read: the chief stopped.
    for number in range(3):
        counts = by_pass[number]
        assert set(counts.values()) == {1}, f"pass {number}: read twice: {[i for i, c in counts.items() if c > 1][:10]}"
        if number < 2:
            assert set(range(number * BATCHES_PER_PASS, (number + 1) * BATCHES_PER_PASS)) <= batches_read
            assert sorted(counts) == list(range(EXAMPLES)), f"pass {number}: examples missing"

"""What the training scripts of the end-to-end tests print and save."""

import json
import pathlib

import numpy as np


def result_of(output: str) -> dict:
    """The last `RESULT {json}` line a test script printed."""
    lines = [line for line in output.splitlines() if line.startswith("RESULT ")]
    assert lines, output[-3000:]
    return json.loads(lines[-1].removeprefix("RESULT "))


def saved_weights(path: pathlib.Path) -> list[np.ndarray]:
    """The weights a test script saved with `np.savez(path, *model.get_weights())`."""
    with np.load(path) as saved:
        return [saved[f"arr_{i}"] for i in range(len(saved.files))]

"""The Ray launcher against the local launcher: what running on Ray costs per step.

One figure, printed as the last line of stdout, one JSON object:

* `ray_over_local_steps_per_s`: updates per second of the digits model (a small CNN on
  8x8 digits, batches of 64) through `omnikeras launch --ray-address` on a real Ray
  cluster of two nodes on this machine (Ray's own `cluster_utils`: a head with 2 logical
  CPUs, the parameter server's and one worker's, and a node with 1), over the same
  through plain `omnikeras launch` (no Ray), same layout: 2 workers in 2 groups, one
  intra-op thread each, every other setting the launchers' defaults. Goal: at least 0.95.

Each rate is the cluster's updates per second seen by the chief from the end of its first
step to the end of `fit` (`ray_overhead_worker.py`), so the start-up of Ray's actors and of
TensorFlow is not counted. The launchers take turns, round after round; the figure is the
median of the rounds' ratios. `--quick` runs one short round, for a correctness check.

    .venv/bin/python benchmarks/ray_overhead.py [--quick]
"""

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile

# Before Ray is imported: the cluster, and every process that joins it, on loopback.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"

from ray.cluster_utils import Cluster

SCRIPT = pathlib.Path(__file__).with_name("ray_overhead_worker.py")


def updates_per_s(where: list[str], epochs: int, log_dir: pathlib.Path) -> float:
    env = dict(os.environ, TF_NUM_INTRAOP_THREADS="1", TF_NUM_INTEROP_THREADS="1")
    run = subprocess.run(
        [sys.executable, "-m", "omnikeras", "launch", *where, "--groups", "2", "--log-dir", str(log_dir),
         str(SCRIPT), "--epochs", str(epochs)],
        capture_output=True, text=True, timeout=900, env=env,
    )
    if run.returncode != 0:
        raise SystemExit(f"launch {' '.join(where)} failed:\n{run.stderr[-3000:]}")
    line = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")][-1]
    return float(json.loads(line.removeprefix("RESULT "))["updates_per_s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one short round, for a correctness check")
    args = parser.parse_args()
    rounds, epochs = (1, 3) if args.quick else (4, 30)

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    ratios = []
    try:
        with tempfile.TemporaryDirectory(prefix="omnikeras-ray-overhead-") as runs:
            for number in range(rounds):
                ray = updates_per_s(["--ray-address", cluster.address], epochs, pathlib.Path(runs) / f"ray-{number}")
                local = updates_per_s(["--workers", "2"], epochs, pathlib.Path(runs) / f"local-{number}")
                ratios.append(ray / local)
                print(f"round {number + 1}: Ray {ray:.1f} updates/s, local {local:.1f} updates/s, "
                      f"ratio {ray / local:.3f}", file=sys.stderr, flush=True)
    finally:
        cluster.shutdown()
    print(json.dumps({"ray_over_local_steps_per_s": round(statistics.median(ratios), 3)}))


if __name__ == "__main__":
    main()

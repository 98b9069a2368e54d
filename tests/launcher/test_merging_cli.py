"""`omnikeras launch` decides on merging before it starts the cluster, and says so.

The worker script only reports what the launcher gave it, so these launches take a few
seconds; a real parameter server starts each time.
"""

import json
import os
import pathlib
import stat
import subprocess
import sys

import pytest

from omnikeras.profiles import ClusterProfile, DeviceProfile

REPORT = """
import json, os
print("WORKER " + json.dumps({
    "config": json.loads(os.environ["OMNIKERAS_CONFIG"]),
    "intra": os.environ.get("TF_NUM_INTRAOP_THREADS"),
    "inter": os.environ.get("TF_NUM_INTEROP_THREADS"),
    "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
}), flush=True)
"""


@pytest.fixture
def profile_file(tmp_path) -> pathlib.Path:
    path = tmp_path / "profile.json"
    ClusterProfile("m:f", 10, (
        DeviceProfile("/CPU:0", "CPU", (16, 64), (300.0, 900.0), 2, 2),
        DeviceProfile("/GPU:0", "GPU", (16, 64), (1000.0, 2700.0)),
    ), 0.001).save(path)
    return path


def _launch(tmp_path: pathlib.Path, *options: str, gpus: int = 0) -> tuple[subprocess.CompletedProcess[str], list[dict]]:
    script = tmp_path / "report.py"
    script.write_text(REPORT)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TF_NUM_", "CUDA_VISIBLE"))}
    # Nothing to measure in these tests: a profile or a cache file gives the threads.
    env["OMNIKERAS_CACHE_DIR"] = str(tmp_path / "empty-cache")
    if gpus:
        fake = tmp_path / "bin" / "nvidia-smi"
        fake.parent.mkdir()
        fake.write_text("#!/bin/sh\n" + "".join(f"echo 'GPU {i}: Fake (UUID: GPU-{i})'\n" for i in range(gpus)))
        fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
        env["PATH"] = f"{fake.parent}{os.pathsep}{env['PATH']}"
    log_dir = tmp_path / "logs"
    run = subprocess.run(
        [sys.executable, "-m", "omnikeras", "launch", "--log-dir", str(log_dir), *options, str(script)],
        capture_output=True, text=True, timeout=120, env=env,
    )
    # Every worker's output, the chief's included, is in its log.
    outputs = [p.read_text() for p in sorted(log_dir.glob("worker-*.log"))]
    workers = [json.loads(line.removeprefix("WORKER ")) for out in outputs for line in out.splitlines() if line.startswith("WORKER ")]
    return run, workers


def test_a_cpu_host_merges_each_groups_workers_into_one_process(tmp_path, profile_file) -> None:
    run, workers = _launch(tmp_path, "--workers", "4", "--groups", "2", "--profile", str(profile_file))
    assert run.returncode == 0, run.stderr
    assert "the 4 workers of 2 groups run as 2 processes" in run.stderr
    assert len(workers) == 2
    assert all(w["config"]["num_workers"] == 2 and w["config"]["throughputs"] is None for w in workers)
    # The profile's 2 intra-op threads, shared by the two processes.
    assert {(w["intra"], w["inter"]) for w in workers} == {("1", "2")}
    assert not (tmp_path / "empty-cache").exists()


def test_no_merge_starts_one_process_per_worker(tmp_path, profile_file) -> None:
    run, workers = _launch(tmp_path, "--workers", "4", "--groups", "2", "--no-merge", "--profile", str(profile_file))
    assert run.returncode == 0, run.stderr
    assert "merged batch" not in run.stderr
    assert sorted(w["config"]["worker_index"] for w in workers) == [0, 1, 2, 3]
    # Four workers on the one CPU share it alike.
    assert all(w["config"]["throughputs"] == [225.0] * 4 for w in workers)


def test_a_gpu_host_is_not_merged_and_the_profile_places_the_workers(tmp_path, profile_file) -> None:
    run, workers = _launch(tmp_path, "--workers", "2", "--groups", "1", "--profile", str(profile_file), gpus=1)
    assert run.returncode == 0, run.stderr
    assert "merged batch" not in run.stderr
    by_index = {w["config"]["worker_index"]: w for w in workers}
    assert (by_index[0]["cuda"], by_index[1]["cuda"]) == ("0", "-1")
    assert by_index[0]["config"]["throughputs"] == [2700.0, 900.0]

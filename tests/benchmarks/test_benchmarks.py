"""The benchmarks run and print their figures; their timings are not asserted here."""

import json
import pathlib
import subprocess
import sys

import pytest

from omnikeras.emulation import ClusterSpec, missing_requirements

MISSING = missing_requirements(ClusterSpec.load("mixed"))
BENCHMARKS = pathlib.Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.mark.slow
@pytest.mark.parametrize(
    "script, keys",
    [
        ("ps_roundtrip.py", {"roundtrip_vs_echo_1M", "roundtrip_vs_echo_25M", "same_host_roundtrip_vs_echo_25M", "pushes_per_s_8x100K"}),
        pytest.param("strategy_overhead.py", {
            "step_time_vs_plain_keras_main", "step_time_vs_plain_keras_reference", "step_time_vs_plain_keras_adam",
            "step_time_vs_plain_keras_deep", "epoch_time_vs_plain_keras_main", "epoch_after_first_batch_vs_plain_keras_main",
        }, marks=pytest.mark.benchmark_run),
        ("step_breakdown.py", {
            "plain_ms", "hook_only_ms", "grpc_ms", "shared_memory_ms", "grpc_exchange_ms", "shared_memory_exchange_ms",
            "shared_memory_copy_in_ms", "shared_memory_wait_ms", "server_update_ms",
        }),
        pytest.param("time_to_accuracy.py", {
            "plain_sgd_s", "plain_adam_s", "omnikeras_adam_s", "sync_s", "async_s", "omnivore_s", "omnivore_over_best_host",
            "omnikeras_adam_over_plain_adam",
            *(() if MISSING else (
                "emulated_sync_s", "emulated_async_s", "emulated_compensated_s", "emulated_omnivore_s",
                "emulated_default_over_omnivore", "emulated_compensated_over_sync_updates",
            )),
        }, marks=pytest.mark.benchmark_run),
        pytest.param(
            "cpu_path.py", {"merged_vs_4_processes", "merged_vs_plain_keras", "flops_fraction_of_matmul"},
            marks=pytest.mark.benchmark_run,
        ),
        pytest.param("ray_overhead.py", {"ray_over_local_steps_per_s"}, marks=pytest.mark.benchmark_run),
        pytest.param(
            "emulated_cluster.py", {"link_mb_s", "spu_by_groups", "async_over_sync_updates_per_s"},
            marks=[
                pytest.mark.benchmark_run,
                pytest.mark.skipif(bool(MISSING), reason=f"cannot emulate here: {'; '.join(MISSING)}"),
            ],
        ),
    ],
)
def test_quick_mode_prints_its_figures_last(script: str, keys: set[str]) -> None:
    run = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), "--quick"], capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr[-3000:]
    figures = json.loads(run.stdout.strip().splitlines()[-1])
    assert set(figures) == keys
    assert all(value > 0 for value in _numbers(figures))


def _numbers(figures: dict) -> list[float]:
    return [n for value in figures.values() for n in (_numbers(value) if isinstance(value, dict) else [value])]

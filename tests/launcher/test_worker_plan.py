"""The launcher's plan: merged on CPU hosts, one process per worker otherwise."""

import pytest

from omnikeras.emulation.spec import ClusterSpec
from omnikeras.launcher.worker_plan import plan_emulated_workers, plan_workers
from omnikeras.profiles import ClusterProfile, DeviceProfile
from omnikeras.profiles.threads import ThreadSettings


def _profile(*devices: DeviceProfile) -> ClusterProfile:
    return ClusterProfile("m:f", 10, devices, 0.001)


CPU = DeviceProfile("/CPU:0", "CPU", (16, 64), (300.0, 900.0), 4, 2)
GPU0 = DeviceProfile("/GPU:0", "GPU", (16, 64), (1000.0, 2700.0))
GPU1 = DeviceProfile("/GPU:1", "GPU", (16, 64), (1000.0, 1800.0))


def test_a_cpu_host_runs_one_process_per_group_and_says_so() -> None:
    plan = plan_workers(4, 2, gpus=0, cores=8, threads=ThreadSettings(8, 1))
    assert (plan.num_workers, plan.merged, plan.throughputs) == (2, True, None)
    assert plan.environments == ({"TF_NUM_INTRAOP_THREADS": "4", "TF_NUM_INTEROP_THREADS": "2"},) * 2
    assert "the 4 workers of 2 groups run as 2 processes" in plan.message
    assert "--no-merge" in plan.message


@pytest.mark.parametrize(
    "plan",
    [
        lambda: plan_workers(2, 2, gpus=0, cores=8, threads=ThreadSettings(8, 1)),
        lambda: plan_workers(2, 2, gpus=0, cores=8),
        lambda: plan_workers(4, 2, gpus=0, cores=8, merge=False, threads=ThreadSettings(8, 1)),
        lambda: plan_workers(2, 1, gpus=1, cores=2),
        lambda: plan_emulated_workers(ClusterSpec.load("mixed"), None, groups=1),
    ],
    ids=["merged", "merged-unmeasured", "one-per-worker", "gpu-host", "emulated"],
)
def test_every_worker_gets_two_inter_op_threads_at_least(plan) -> None:
    # Its exchange holds one while backpropagation goes on.
    assert {e["TF_NUM_INTEROP_THREADS"] for e in plan().environments} == {"2"}


def test_the_profiles_thread_settings_win_over_the_cached_ones() -> None:
    plan = plan_workers(3, 1, gpus=0, cores=8, profile=_profile(CPU), threads=ThreadSettings(1, 1))
    assert plan.num_workers == 1
    assert plan.environments[0] == {"TF_NUM_INTRAOP_THREADS": "4", "TF_NUM_INTEROP_THREADS": "2"}


def test_no_merge_runs_one_process_per_worker_sharing_the_cores() -> None:
    plan = plan_workers(4, 2, gpus=0, cores=8, merge=False)
    assert (plan.num_workers, plan.merged, plan.message) == (4, False, None)
    assert plan.environments[0]["TF_NUM_INTRAOP_THREADS"] == "2"


def test_a_gpu_host_is_never_merged() -> None:
    plan = plan_workers(4, 2, gpus=1, cores=8)
    assert (plan.num_workers, plan.merged) == (4, False)


def test_on_a_gpu_host_the_profile_places_workers_and_sizes_their_shares() -> None:
    plan = plan_workers(4, 2, gpus=2, cores=8, profile=_profile(CPU, GPU0, GPU1))
    # GPUs first, then the CPU; the fourth worker shares GPU 0 with the first.
    assert [e["CUDA_VISIBLE_DEVICES"] for e in plan.environments] == ["0", "1", "-1", "0"]
    assert plan.throughputs == (1350.0, 1800.0, 900.0, 1350.0)


def test_explicit_throughputs_win_over_the_profile() -> None:
    plan = plan_workers(2, 1, gpus=1, cores=2, throughputs=[1.0, 3.0], profile=_profile(CPU, GPU0))
    assert plan.throughputs == (1.0, 3.0)


def test_a_profile_of_another_host_is_refused() -> None:
    with pytest.raises(ValueError, match="none of the profile's devices"):
        plan_workers(2, 1, gpus=0, cores=2, merge=False, profile=_profile(GPU0))

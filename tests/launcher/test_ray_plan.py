"""Where the Ray launcher places servers and workers: plain planning over fake nodes."""

import pytest

from omnikeras.launcher.ray_plan import SERVER_CPUS, RayNode, plan_ray_cluster
from omnikeras.profiles import ClusterProfile, DeviceProfile


def test_one_merged_worker_per_cpu_node_with_what_the_server_leaves() -> None:
    plan = plan_ray_cluster([RayNode("head", 8, 0), RayNode("b", 4, 0)], None, groups=2, ps_shards=1)
    assert [(s.node_id, s.num_cpus) for s in plan.servers] == [("head", SERVER_CPUS)]
    assert [(s.node_id, s.num_cpus, s.num_gpus) for s in plan.workers] == [("head", 7.0, 0), ("b", 4.0, 0)]
    # Unlike CPU workers get shares in proportion to their CPUs, and threads for them.
    assert plan.throughputs == (7.0, 4.0)
    assert [e["TF_NUM_INTRAOP_THREADS"] for e in plan.environments] == ["7", "4"]
    assert "2 workers (1 with 7 CPUs, 1 with 4 CPUs) in 2 groups" in plan.message


def test_one_worker_per_gpu_first_and_servers_on_cpu_nodes() -> None:
    nodes = [RayNode("gpus", 8, 2), RayNode("cpu", 4, 0)]
    plan = plan_ray_cluster(nodes, 2, groups=1, ps_shards=2, throughputs=[100.0, 100.0])
    # Shards spread over the nodes, CPU nodes first; the GPU workers share what is left.
    assert [s.node_id for s in plan.servers] == ["cpu", "gpus"]
    assert [(s.node_id, s.num_gpus, s.num_cpus) for s in plan.workers] == [("gpus", 1, 3.5), ("gpus", 1, 3.5)]
    assert plan.throughputs == (100.0, 100.0)


def test_alike_workers_get_equal_shares() -> None:
    plan = plan_ray_cluster([RayNode("a", 3, 0), RayNode("b", 2, 0)], None, groups=1, ps_shards=1)
    assert [s.num_cpus for s in plan.workers] == [2.0, 2.0]
    assert plan.throughputs is None


def test_without_merge_a_cpu_node_runs_one_worker_per_cpu() -> None:
    plan = plan_ray_cluster([RayNode("a", 5, 0)], None, groups=2, ps_shards=1, merge=False)
    assert [(s.node_id, s.num_cpus) for s in plan.workers] == [("a", 1.0)] * 4


def test_fewer_workers_take_the_largest_places() -> None:
    plan = plan_ray_cluster([RayNode("small", 2, 0), RayNode("big", 9, 0)], 1, groups=1, ps_shards=1)
    assert [s.node_id for s in plan.workers] == ["big"]
    assert plan.servers[0].node_id == "big"


@pytest.mark.parametrize(
    ("nodes", "workers", "groups", "shards", "message"),
    [
        ([], None, 1, 1, "no node with CPUs or GPUs"),
        ([RayNode("a", 0, 0)], None, 1, 1, "no node with CPUs or GPUs"),
        ([RayNode("a", 2, 0)], 3, 1, 1, "room for 1 worker .*3 asked for"),
        ([RayNode("a", 2, 0), RayNode("b", 2, 0)], None, 3, 1, "3 groups need at least as many workers"),
        ([RayNode("a", 1.5, 0)], None, 1, 2, "2 parameter servers need 1 CPU each; node a has 0.5 left"),
        ([RayNode("g", 4, 1), RayNode("c", 4, 0)], None, 1, 1, "mix GPUs and CPUs: give each one's examples/s"),
        ([RayNode("a", 2, 0)], 0, 1, 1, "must be at least 1"),
    ],
)
def test_plans_that_cannot_run_are_refused_with_the_reason(nodes, workers, groups, shards, message) -> None:
    with pytest.raises(ValueError, match=message):
        plan_ray_cluster(nodes, workers, groups, shards)


def test_throughputs_must_name_every_worker() -> None:
    with pytest.raises(ValueError, match="1 throughputs for 2 workers"):
        plan_ray_cluster([RayNode("a", 3, 0), RayNode("b", 2, 0)], None, 1, 1, throughputs=[1.0])


def _profile(cpu: float, gpu: float | None = None) -> ClusterProfile:
    devices = [DeviceProfile("/CPU:0", "CPU", (64,), (cpu,))]
    if gpu is not None:
        devices.append(DeviceProfile("/GPU:0", "GPU", (64,), (gpu,)))
    return ClusterProfile("m:f", 1, tuple(devices), 0.001)


def test_gpu_and_cpu_workers_get_shares_from_one_profile_per_kind_of_node() -> None:
    nodes = [RayNode("g1", 4, 1, "gpu box"), RayNode("g2", 4, 1, "gpu box"), RayNode("c", 9, 0, "cpu box")]
    asked: list[str] = []

    def profile_of(node: RayNode) -> ClusterProfile:
        asked.append(node.kind)
        return _profile(100.0, 900.0) if node.kind == "gpu box" else _profile(250.0)

    plan = plan_ray_cluster(nodes, None, groups=1, ps_shards=1, profile_of=profile_of)
    assert [(s.node_id, s.num_gpus) for s in plan.workers] == [("g1", 1), ("g2", 1), ("c", 0)]
    assert plan.throughputs == (900.0, 900.0, 250.0)
    assert sorted(asked) == ["cpu box", "gpu box"]
    assert "batch shares by their devices' profiles" in plan.message


def test_a_profile_without_the_device_is_refused() -> None:
    nodes = [RayNode("g", 4, 1, "gpu box"), RayNode("c", 4, 0, "cpu box")]
    with pytest.raises(ValueError, match="the profile of nodes of gpu box has no GPU"):
        plan_ray_cluster(nodes, None, 1, 1, profile_of=lambda node: _profile(100.0))


def test_a_node_kind_is_measured_once_and_read_from_the_cache_after(tmp_path) -> None:
    on_ray = pytest.importorskip("omnikeras.launcher.on_ray")
    measured: list[str] = []

    def measure(node: RayNode) -> str:
        measured.append(node.node_id)
        return _profile(123.0).to_json()

    path = tmp_path / "profiles.json"
    node = RayNode("a", 4, 0)
    assert on_ray.NodeProfiles(path, measure)(node).cpu.peak_throughput == 123.0
    # Another run, another node of the same kind: nothing measured.
    assert on_ray.NodeProfiles(path, measure)(RayNode("b", 4, 0)).cpu.peak_throughput == 123.0
    assert measured == ["a"]
    on_ray.NodeProfiles(path, measure)(RayNode("c", 8, 0))
    assert measured == ["a", "c"]

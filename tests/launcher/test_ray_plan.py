"""Where the Ray launcher places servers and workers: plain planning over fake nodes."""

import pytest

from omnikeras.launcher.ray_plan import MIN_WORKER_CPUS, SERVER_CPUS, RayNode, plan_ray_cluster
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


def test_two_groups_share_a_machine_of_two_cpus_as_the_local_launcher_runs_them() -> None:
    # `omnikeras launch --ray --workers 2 --groups 2` on a machine of 2 CPUs.
    plan = plan_ray_cluster([RayNode("laptop", 2, 0)], 2, groups=2, ps_shards=1)
    assert [(s.node_id, s.num_cpus) for s in plan.servers] == [("laptop", SERVER_CPUS)]
    assert [(s.node_id, s.num_cpus) for s in plan.workers] == [("laptop", 0.5)] * 2
    assert plan.throughputs is None
    assert [e["TF_NUM_INTRAOP_THREADS"] for e in plan.environments] == ["1", "1"]
    assert "1 parameter server, 2 workers (2 with 0.5 CPUs) in 2 groups" in plan.message


def test_workers_default_to_one_per_group_at_least() -> None:
    plan = plan_ray_cluster([RayNode("a", 2, 0)], None, groups=3, ps_shards=1)
    # What Ray counts: steps of 1/10000, never more than the node has.
    assert [s.num_cpus for s in plan.workers] == [0.3333] * 3


def test_more_workers_go_where_each_keeps_the_most_cpus() -> None:
    plan = plan_ray_cluster([RayNode("head", 8, 0), RayNode("b", 4, 0)], 4, groups=4, ps_shards=1)
    # The head keeps 7 CPUs beside the server: 3.5 each for two, then 2.3333 each for three.
    assert [(s.node_id, s.num_cpus) for s in plan.workers] == [("b", 4.0)] + [("head", 2.3333)] * 3
    assert plan.throughputs == (4.0, 2.3333, 2.3333, 2.3333)
    assert [e["TF_NUM_INTRAOP_THREADS"] for e in plan.environments] == ["4", "2", "2", "2"]


def test_with_merge_a_node_takes_one_worker_per_group_and_more_run_merged() -> None:
    plan = plan_ray_cluster([RayNode("a", 2, 0)], 4, groups=2, ps_shards=1)
    assert [s.num_cpus for s in plan.workers] == [0.5, 0.5]
    assert "2 workers (2 with 0.5 CPUs) in 2 groups; the 4 workers asked for run merged as 2" in plan.message
    unmerged = plan_ray_cluster([RayNode("a", 2, 0)], 4, groups=2, ps_shards=1, merge=False)
    assert [s.num_cpus for s in unmerged.workers] == [0.25] * 4


def test_a_node_of_one_cpu_gives_the_server_half() -> None:
    plan = plan_ray_cluster([RayNode("a", 1, 0)], None, groups=1, ps_shards=1)
    assert [s.num_cpus for s in plan.servers] == [0.5]
    assert [s.num_cpus for s in plan.workers] == [0.5]


def test_the_least_a_shared_node_gives_a_worker() -> None:
    plan = plan_ray_cluster([RayNode("a", 2, 0)], 10, groups=10, ps_shards=1)
    assert [s.num_cpus for s in plan.workers] == [MIN_WORKER_CPUS] * 10
    assert sum(s.num_cpus for s in plan.workers) + plan.servers[0].num_cpus <= 2


@pytest.mark.parametrize(
    ("nodes", "workers", "groups", "shards", "message"),
    [
        ([], None, 1, 1, "no node with CPUs or GPUs"),
        ([RayNode("a", 0, 0)], None, 1, 1, "no node with CPUs or GPUs"),
        ([RayNode("g", 4, 2)], 3, 1, 1, r"room for 2 workers \(2 with 1 GPU and 1.5 CPUs\); 3 asked for$"),
        # Twelve workers on the CPU the server leaves would hold less than a tenth each.
        ([RayNode("a", 2, 0)], 12, 12, 1, r"room for 10 workers \(10 with 0.1 CPUs\); 12 asked for .*0.1 CPU each"),
        # Two servers fill a node of 1.5 CPUs, half each.
        ([RayNode("a", 1.5, 0)], None, 1, 2, "room for 0 workers; 1 needed, one per group"),
        ([RayNode("g", 4, 2)], None, 3, 1, "room for 2 workers .*; 3 needed, one per group$"),
        ([RayNode("a", 2, 0), RayNode("b", 2, 0)], 2, 3, 1, "3 groups need at least as many workers, got 2"),
        ([RayNode("a", 2, 0)], None, 1, 3, "3 parameter servers need 1 CPU each; node a has 0 left"),
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

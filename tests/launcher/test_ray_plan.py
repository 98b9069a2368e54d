"""Where the Ray launcher places servers and workers: plain planning over fake nodes."""

import pytest

from omnikeras.launcher.ray_plan import SERVER_CPUS, RayNode, plan_ray_cluster


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

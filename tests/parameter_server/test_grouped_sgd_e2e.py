"""Grouped asynchronous SGD through a real server process."""

import threading

import numpy as np

from omnikeras import Hyperparameters, ParameterServerClient

SIZE = 64


def _gradient(worker: int, step: int) -> np.ndarray:
    # Multiples of 4: halves and quarters of their sums stay exact in float32, whatever the
    # order in which the server adds them.
    return np.full(SIZE, 4.0 * ((worker + step) % 5 + 1), np.float32)


def _run_workers(address: str, workers: int, steps: int, during=None) -> tuple[list[ParameterServerClient], np.ndarray]:
    """Each worker pushes known gradients; returns the clients and the exact expected
    weights, computed from how many members each push was combined with."""
    clients = [ParameterServerClient([address]) for _ in range(workers)]
    ids = [c.register().worker_id for c in clients]
    # The compiled rule as it is: these tests check its arithmetic across groups.
    clients[0].init_model({"w": np.zeros(SIZE, np.float32)}, Hyperparameters(1.0, compensate_asynchrony=False))
    expected = [np.zeros(SIZE, np.float64) for _ in range(workers)]
    errors: list[BaseException] = []

    def work(index: int) -> None:
        try:
            for step in range(1, steps + 1):
                gradient = _gradient(ids[index], step)
                result = clients[index].push(gradient_dict(gradient), step=step, example_count=1)
                expected[index] -= gradient / result.members_combined
                if during is not None and index == 0:
                    during(step)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    return clients, sum(expected)


def gradient_dict(gradient: np.ndarray) -> dict[str, np.ndarray]:
    return {"w": gradient}


def test_eight_clients_in_four_groups_reach_the_exact_weights(start_server) -> None:
    server = start_server("--groups", "4")
    clients, expected = _run_workers(server.address, workers=8, steps=200)
    stats = clients[0].stats()[0]
    assert [len(g.members) for g in stats.groups] == [2, 2, 2, 2]
    assert stats.updates_applied == 4 * 200
    assert stats.pushes_received == 8 * 200
    np.testing.assert_array_equal(clients[0].pull().weights["w"], expected)
    # With both members of every group pushing each step, each update averages two.
    np.testing.assert_array_equal(
        expected,
        -sum(_gradient(w, s) for w in range(1, 9) for s in range(1, 201)).astype(np.float64) / 2,
    )
    # Four groups racing each other: some updates were computed on stale weights.
    assert any(lag > 0 for g in stats.groups for lag in g.staleness_histogram)


def test_one_group_applies_the_weighted_mean_of_its_members_once(start_server) -> None:
    server = start_server("--groups", "1")
    clients = [ParameterServerClient([server.address]) for _ in range(3)]
    for client in clients:
        client.register()
    start = np.linspace(-1, 1, SIZE).astype(np.float32)
    clients[0].init_model({"w": start}, Hyperparameters(0.5))
    gradients = [np.full(SIZE, g, np.float32) for g in (1.0, 2.0, 3.0)]
    counts = [10, 20, 70]
    results = [None] * 3

    def push(i: int) -> None:
        results[i] = clients[i].push_pull({"w": gradients[i]}, step=1, example_count=counts[i])

    threads = [threading.Thread(target=push, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    mean = sum(g * n for g, n in zip(gradients, counts)) / sum(counts)
    for push_result, pulled in results:
        assert push_result.model_version == 1
        assert push_result.members_combined == 3
        np.testing.assert_allclose(pulled.weights["w"], start - 0.5 * mean, rtol=1e-6)
    assert clients[0].stats()[0].updates_applied == 1


def test_regrouping_mid_run_loses_no_update(start_server) -> None:
    server = start_server("--groups", "1")
    control = ParameterServerClient([server.address])
    seen_groups: list[int] = []

    def regroup(step: int) -> None:
        if step == 20:
            seen_groups.append(len(set(control.set_groups(num_groups=2).values())))
        if step == 40:
            seen_groups.append(len(set(control.set_groups(num_groups=4).values())))

    clients, expected = _run_workers(server.address, workers=4, steps=60, during=regroup)
    assert seen_groups == [2, 4]
    stats = clients[0].stats()[0]
    assert len(stats.groups) == 4
    assert stats.pushes_received == 4 * 60
    # A step flushed by the regrouping may combine three members, whose mean float32
    # cannot hold exactly.
    np.testing.assert_allclose(clients[0].pull().weights["w"], expected, rtol=1e-6)


def test_pull_only_if_newer_sends_nothing_when_current(start_server) -> None:
    server = start_server()
    client = ParameterServerClient([server.address])
    client.register()
    client.init_model({"w": np.ones(SIZE, np.float32)}, Hyperparameters(0.1))
    assert client.pull(only_if_newer=True).weights == {}
    client.push({"w": np.ones(SIZE, np.float32)}, step=1, example_count=1)
    newer = client.pull(only_if_newer=True)
    assert newer.model_version == 1
    np.testing.assert_allclose(newer.weights["w"], np.full(SIZE, 0.9), rtol=1e-6)


def test_later_workers_wait_for_the_chief_and_pull_its_weights(start_server) -> None:
    server = start_server()
    chief, follower = ParameterServerClient([server.address]), ParameterServerClient([server.address])
    assert not follower.register().model_initialized
    chief.register()
    pulled: dict = {}
    waiter = threading.Thread(target=lambda: pulled.update(follower.pull(wait_for_model=30).weights))
    waiter.start()
    weights = {"w": np.arange(SIZE, dtype=np.float32)}
    assert chief.init_model(weights, Hyperparameters(0.1, momentum=0.5))
    waiter.join(30)
    np.testing.assert_array_equal(pulled["w"], weights["w"])
    # A second initialisation is ignored; the caller is told to pull instead.
    assert not follower.init_model({"w": np.zeros(SIZE, np.float32)}, Hyperparameters(0.1))
    assert follower.describe().hyperparameters.momentum == 0.5

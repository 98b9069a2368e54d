"""Variables spread over several server processes, hidden behind one client."""

import threading

import numpy as np

from omnikeras import Hyperparameters, ParameterServerClient

WEIGHTS = {
    "conv/kernel": np.ones((3, 3, 1, 32), np.float32),
    "conv/bias": np.zeros(32, np.float32),
    "dense/kernel": np.ones((800, 10), np.float32),
    "dense/bias": np.zeros(10, np.float32),
}


def test_two_shards_train_like_one_server(start_server) -> None:
    shards = [start_server("--groups", "1"), start_server("--groups", "1")]
    addresses = [s.address for s in shards]
    clients = [ParameterServerClient(addresses) for _ in range(2)]
    ids = [c.register().worker_id for c in clients]
    assert ids == [1, 2]
    clients[0].init_model(WEIGHTS, Hyperparameters(0.5))
    # Balanced by bytes: the big dense kernel alone on one shard, the rest on the other.
    held = [{v.name for v in ParameterServerClient([a]).describe().variables} for a in addresses]
    assert {frozenset(h) for h in held} == {frozenset({"dense/kernel"}), frozenset(WEIGHTS) - {"dense/kernel"}}

    gradients = [{n: np.full(w.shape, g, np.float32) for n, w in WEIGHTS.items()} for g in (1.0, 3.0)]
    results: list = [None, None]

    def push(i: int) -> None:
        results[i] = clients[i].push_pull(gradients[i], step=1, example_count=1)

    threads = [threading.Thread(target=push, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for push_result, pulled in results:
        assert push_result.members_combined == 2
        assert pulled.model_version == 1
        assert set(pulled.weights) == set(WEIGHTS)
        for name, weight in WEIGHTS.items():
            np.testing.assert_array_equal(pulled.weights[name], weight - 0.5 * 2.0)
    assert [s.model_version for s in clients[1].stats()] == [1, 1]
    assert sum(s.parameter_count for s in clients[1].stats()) == sum(w.size for w in WEIGHTS.values())

"""Checkpoints: written atomically, on request and on a timer; a restarted server resumes."""

import time

import grpc
import numpy as np
import pytest

from omnikeras import Hyperparameters, ParameterServer, ParameterServerClient

WEIGHTS = {"kernel": np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4), "bias": np.zeros(4, np.float32)}


def _gradients(step: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(step)
    return {name: rng.normal(size=w.shape).astype(np.float32) for name, w in WEIGHTS.items()}


def _train(client: ParameterServerClient, steps: range) -> None:
    for step in steps:
        client.push(_gradients(step), step=step, example_count=8)


@pytest.mark.parametrize(
    "hyperparameters",
    [
        # Uncompensated: the 2-group server follows the 1-group reference's rule to the bit.
        Hyperparameters(0.05, momentum=0.9, settings={"nesterov": 1.0}, compensate_asynchrony=False),
        # Adam's moments and iteration count (its bias correction) come back too.
        Hyperparameters(0.01, momentum=0.9, optimizer="Adam", settings={"amsgrad": 1.0}, compensate_asynchrony=False),
        # Muon's choice of AdamW for the bias comes back with its state.
        Hyperparameters(
            0.01, momentum=0.95, optimizer="Muon", weight_decay=0.01, adamw_variables=frozenset({"bias"}),
            compensate_asynchrony=False,
        ),
    ],
    ids=["SGD", "Adam", "Muon"],
)
def test_kill_and_restart_continues_with_identical_weights(start_server, tmp_path, hyperparameters) -> None:
    reference = ParameterServer()
    reference.start()
    expected = ParameterServerClient([reference.address])
    expected.register()
    expected.init_model(WEIGHTS, hyperparameters)
    _train(expected, range(1, 11))

    server = start_server("--checkpoint-dir", str(tmp_path), "--groups", "2")
    client = ParameterServerClient([server.address])
    worker = client.register()
    client.init_model(WEIGHTS, hyperparameters)
    _train(client, range(1, 4))
    client.save_snapshot("trial")
    at_snapshot = client.pull().weights
    _train(client, range(4, 6))
    (path,) = client.checkpoint()
    assert path.startswith(str(tmp_path))
    server.kill()

    restarted = start_server("--checkpoint-dir", str(tmp_path))
    client = ParameterServerClient([restarted.address])
    again = client.register(worker_id=worker.worker_id)
    assert again.model_initialized and again.group == worker.group
    assert client.describe().num_groups == 2
    # The worker's own init is ignored: the server kept its restored weights.
    assert not client.init_model(WEIGHTS, Hyperparameters(1.0))
    assert client.pull().model_version == 5
    _train(client, range(6, 11))
    # The optimizer's state survived too, so the trajectories agree to the last bit.
    final, reference_final = client.pull(), expected.pull()
    assert final.model_version == reference_final.model_version == 10
    for name in WEIGHTS:
        np.testing.assert_array_equal(final.weights[name], reference_final.weights[name])
    # A snapshot saved before the checkpoint (a tuner's) is still there to restore.
    client.restore_snapshot("trial")
    restored = client.pull().weights
    for name in WEIGHTS:
        np.testing.assert_array_equal(restored[name], at_snapshot[name])
    reference.stop()


def test_periodic_checkpoints_survive_a_crash(start_server, tmp_path) -> None:
    server = start_server("--checkpoint-dir", str(tmp_path), "--checkpoint-every", "0.2")
    client = ParameterServerClient([server.address])
    client.register()
    client.init_model(WEIGHTS, Hyperparameters(0.1))
    _train(client, range(1, 4))
    before = client.pull()
    time.sleep(1.0)
    server.kill()
    assert not list(tmp_path.glob(".tmp-*"))
    restarted = start_server("--checkpoint-dir", str(tmp_path))
    after = ParameterServerClient([restarted.address]).pull()
    assert after.model_version == 3
    for name in WEIGHTS:
        np.testing.assert_array_equal(after.weights[name], before.weights[name])


def test_weights_a_worker_puts_in_place_are_checkpointed_at_once(start_server, tmp_path) -> None:
    # No timer: only the replacement itself writes the checkpoints the restart resumes.
    server = start_server("--checkpoint-dir", str(tmp_path))
    client = ParameterServerClient([server.address])
    client.register()
    client.init_model(WEIGHTS, Hyperparameters(0.1))
    tuned = {"base/kernel": np.full((2, 2), 0.5, np.float32), **WEIGHTS}
    client.replace_model(tuned, Hyperparameters(0.01, optimizer="Adam"), fresh_optimizer=True)
    client.push(_gradients(1) | {"base/kernel": np.ones((2, 2), np.float32)}, step=1, example_count=8)
    best = {name: np.full_like(w, 2.0) for name, w in tuned.items()}
    client.set_weights(best)
    server.kill()

    restarted = ParameterServerClient([start_server("--checkpoint-dir", str(tmp_path)).address])
    described = restarted.describe()
    assert sorted(spec.name for spec in described.variables) == sorted(tuned)
    assert described.hyperparameters.optimizer == "Adam"
    resumed = restarted.pull().weights
    for name, weight in best.items():
        np.testing.assert_array_equal(resumed[name], weight)


def test_frozen_weights_are_given_back_whole_and_survive_a_restart(start_server, tmp_path) -> None:
    server = start_server("--checkpoint-dir", str(tmp_path))
    client = ParameterServerClient([server.address])
    client.register()
    assert client.frozen_weights() == {}
    client.init_model(WEIGHTS, Hyperparameters(0.1))
    client.set_frozen_weights({"base/kernel": np.ones((2, 2), np.float32), "base/bias": np.zeros(2, np.float32)})
    # Set again: the later set replaces the earlier whole.
    frozen = {"base/kernel": np.arange(6, dtype=np.float32).reshape(2, 3)}
    client.set_frozen_weights(frozen)
    assert client.frozen_weights().keys() == frozen.keys()
    _train(client, range(1, 3))
    server.kill()

    restarted = ParameterServerClient([start_server("--checkpoint-dir", str(tmp_path)).address])
    resumed = restarted.frozen_weights()
    assert resumed.keys() == frozen.keys()
    np.testing.assert_array_equal(resumed["base/kernel"], frozen["base/kernel"])


def test_a_clean_stop_writes_a_last_checkpoint_and_old_ones_are_pruned(start_server, tmp_path) -> None:
    server = start_server("--checkpoint-dir", str(tmp_path))
    client = ParameterServerClient([server.address])
    client.register()
    client.init_model(WEIGHTS, Hyperparameters(0.1))
    for step in range(1, 6):
        _train(client, range(step, step + 1))
        client.checkpoint()
    _train(client, range(6, 7))
    log = server.stop()
    assert "checkpoint of version 6" in log
    kept = sorted(p.name for p in tmp_path.glob("checkpoint-*.npz"))
    assert kept == [f"checkpoint-{v:012d}.npz" for v in (4, 5, 6)]


def test_checkpoint_without_a_directory_is_refused(start_server) -> None:
    server = start_server()
    client = ParameterServerClient([server.address])
    client.register()
    client.init_model(WEIGHTS, Hyperparameters(0.1))
    with pytest.raises(grpc.RpcError) as raised:
        client.checkpoint()
    assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION

"""Each optimizer the server applies follows Keras' own over 200 updates, with a learning
-rate schedule and, where the optimizer has it, weight decay with an exclusion."""

import numpy as np
import pytest

keras = pytest.importorskip("keras")
tf = pytest.importorskip("tensorflow")

from optimizer_cases import KERAS_OPTIMIZERS  # noqa: E402

from omnikeras.parameter_server.model_state import ModelState  # noqa: E402
from omnikeras.parameter_server.optimizers import OPTIMIZERS  # noqa: E402
from omnikeras.strategy.update_rule import server_update_rule  # noqa: E402

STEPS = 200


def test_every_server_optimizer_has_a_parity_case() -> None:
    covered = {make().__class__.__name__ for make in KERAS_OPTIMIZERS.values()}
    assert covered == set(OPTIMIZERS)


@pytest.mark.parametrize("case", sorted(KERAS_OPTIMIZERS))
def test_the_server_follows_keras(case: str) -> None:
    rng = np.random.default_rng(0)
    starts = {
        "dense/kernel": rng.normal(size=(6, 4)).astype("float32"),
        "dense/bias": rng.normal(size=4).astype("float32"),
        "output/kernel": rng.normal(size=(4, 3)).astype("float32"),
    }
    steps = [{name: rng.normal(size=w.shape).astype("float32") for name, w in starts.items()} for _ in range(STEPS)]

    optimizer = KERAS_OPTIMIZERS[case]()
    variables = {}
    for name, w in starts.items():
        layer, variable = name.split("/")
        # Under the layer's name, as the server names them: Muon picks by path.
        with keras.name_scope(layer):
            variables[name] = keras.Variable(w.copy(), name=variable)
    optimizer.exclude_from_weight_decay(var_names=["bias"])
    optimizer.build(list(variables.values()))
    rule = server_update_rule(optimizer, list(variables.values()))
    # As `fit` applies it: in a graph.
    apply = tf.function(lambda grads: optimizer.apply_gradients(zip(grads, variables.values())))
    for gradients in steps:
        apply([tf.constant(gradients[n]) for n in variables])

    state = ModelState(rule)
    state.initialize({name: w.copy() for name, w in starts.items()})
    for gradients in steps:
        state.apply({name: g.copy() for name, g in gradients.items()})

    for name, variable in variables.items():
        np.testing.assert_allclose(state.weights[name], keras.ops.convert_to_numpy(variable), rtol=1e-5, atol=1e-5)
        # The weights moved: the comparison says something.
        assert not np.allclose(state.weights[name], starts[name], atol=1e-3)

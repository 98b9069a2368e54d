"""The server's weights and optimizer state in one buffer each, laid out as the
shared-memory segment (`BufferLayout`), so that an update where every variable follows
one rule is a few passes over whole buffers.

By variable, each variable of a push costs its own calls into BLAS (three for SGD with
momentum, nine for Adam), its own bound and its own lookups, about 5 µs for SGD and 9 for
Adam: milliseconds a push for a model of a few hundred variables. Over one buffer they
are three and nine calls in all, the copy of the weights into a worker's segment is one,
and the cost no longer grows with the number of variables.

The last bit of an update depends on where each variable lies: BLAS rounds the last
elements of a call apart from its vector loop. A model's updates are the same over shared
memory and over gRPC (both go over buffers of one layout), with gradients written ahead
or not; a model whose variables are named, and so sorted, otherwise may differ in the
last bit.

`ModelState` keeps its mappings of arrays by name; here they are bound to views of the
buffers. Any code that puts another array in their place unbinds them (`binds` says
whether they still are), and the next update over the buffers copies them back in.
"""

from collections.abc import Mapping

import numpy as np

from omnikeras.parameter_server.buffer_layout import BufferLayout, FlatArrays
from omnikeras.parameter_server.optimizers.base import Slots
from omnikeras.parameter_server.server_state import OptimizerState


class FlatState:
    """The buffers of one model's variables, all of `layout`'s one dtype.

    Args:
        layout: The variables' layout; it must have one dtype (`BufferLayout.dtype`).
    """

    def __init__(self, layout: BufferLayout) -> None:
        assert layout.dtype is not None, "variables of several dtypes share no buffer"
        self.layout = layout
        self.weights = self._buffer()
        # Gradients that arrive in arrays of their own are copied here; its padding stays 0.
        self.gradients = self._buffer()
        self.slots: dict[str, FlatArrays] = {}
        self._trained: dict[frozenset[str], tuple[frozenset[str], list[slice]]] = {}

    def _buffer(self) -> FlatArrays:
        buffer = np.zeros(self.layout.region_bytes, np.uint8)
        return self.layout.arrays(buffer)

    def bind(
        self, weights: dict[str, np.ndarray], slots: OptimizerState, trained: frozenset[str], names: set[str]
    ) -> None:
        """Puts views of the buffers in place of `weights` and, for the `trained`
        variables, of their state `names` (zeros where a variable has none yet), with
        their values."""
        for name, view in self.weights.items():
            if weights[name] is not view:
                np.copyto(view, weights[name])
                weights[name] = view
        for slot in names - self.slots.keys():
            self.slots[slot] = self._buffer()
        for name in trained:
            state = slots.get(name, {})
            bound: Slots = {}
            for slot in names:
                view = self.slots[slot][name]
                if slot in state and state[slot] is not view:
                    np.copyto(view, state[slot])
                elif slot not in state:
                    view.fill(0)
                bound[slot] = view
            slots[name] = bound

    def binds(self, weights: Mapping[str, np.ndarray], slots: OptimizerState, trained: frozenset[str]) -> bool:
        """Whether `weights` and the state of the `trained` variables are this state's
        views, every trained variable with the same state."""
        if weights.keys() != self.weights.keys() or any(weights[n] is not v for n, v in self.weights.items()):
            return False
        for name in trained:
            state = slots.get(name)
            if state is None or state.keys() != self.slots.keys():
                return False
            if any(array is not self.slots[slot][name] for slot, array in state.items()):
                return False
        return True

    def trained(self, statistics: frozenset[str]) -> tuple[frozenset[str], list[slice]]:
        """The variables other than the `statistics`, and the elements they cover
        (`BufferLayout.spans`)."""
        if statistics not in self._trained:
            trained = frozenset(self.weights) - statistics
            self._trained[statistics] = (trained, self.layout.spans(trained))
        return self._trained[statistics]

    def gradient_region(self, gradients: Mapping[str, np.ndarray]) -> np.ndarray:
        """`gradients` as one array of the layout: their own buffer's where they are
        views of one laid out alike (its padding zeroed, since it is the sender's), or
        this state's, with the gradients copied in."""
        region = gradients.region_as(self.layout) if isinstance(gradients, FlatArrays) else None
        if region is not None:
            if self.layout.padding.size:
                region[self.layout.padding] = 0
            return region
        for name, view in self.gradients.items():
            np.copyto(view, gradients[name])
        assert self.gradients.region is not None
        return self.gradients.region

"""The weights the server holds, the optimizer's state, version, iteration count and
update rule.

Not thread-safe on its own: `GroupCoordinator` calls it under its lock.

An update that would make a weight or the optimizer's state NaN or Inf is refused, and
both stay as they were. Under SGD and Adam (with a positive epsilon), finite weights,
optimizer state and gradients can only produce NaN or Inf by overflowing, so the state
keeps a bound on every array's largest magnitude, carried from update to update with the
gradients' sums of magnitudes (which the server's finiteness check measures as they
arrive; see `Optimizer.bounds_after`); only an update whose bound comes near the dtype's
limit is measured exactly and, if still near it, tried on copies first. The other
optimizers' updates are computed into new arrays and checked before they are put in
place.

Where every variable has one dtype and one rule applies to all (no constraint, moving
average, gradient accumulation or weight decay left out of some, one optimizer), and two
variables or more are trained, the update runs over the weights and state as whole
buffers (see `flat_state`), its bound carried for all of them at once.
"""

import dataclasses
import functools
import math
import threading
import time
from collections.abc import Iterator, Mapping

import numpy as np

from omnikeras.parameter_server import parallel, tensors
from omnikeras.parameter_server.buffer_layout import BufferLayout, FlatArrays
from omnikeras.parameter_server.errors import FailedPrecondition, NonFinite
from omnikeras.parameter_server.flat_state import FlatState
from omnikeras.parameter_server.optimizers import Step
from omnikeras.parameter_server.optimizers.base import Bounds, Optimizer, Slots, blas_for, decayed
from omnikeras.parameter_server.optimizers.sgd import apply_weight_decay
from omnikeras.parameter_server.server_state import Arrays, OptimizerState
from omnikeras.parameter_server.update_rule import Hyperparameters
from omnikeras.v1 import parameter_server_pb2 as pb

# Each variable's state beside its optimizer's: Keras' moving average of the weight
# (`use_ema`) and its accumulated gradients (`gradient_accumulation_steps`).
_KEPT_BESIDE_THE_OPTIMIZER = frozenset({"average", "gradient_accumulator"})


class ModelState:
    def __init__(self, hyperparameters: Hyperparameters) -> None:
        self._hyperparameters = hyperparameters
        self.weights: dict[str, np.ndarray] = {}
        # The optimizer's state of each variable, by Keras' names: SGD's "momentum",
        # Adam's "momentum" and "velocity", ...
        self.slots: OptimizerState = {}
        self.specs: dict[str, tensors.VariableSpec] = {}
        self.version = 0
        # Steps taken, as Keras' optimizer counts them: schedules read it, and bias
        # corrections the updates it counts (`updates`). Unlike the version, a restored
        # snapshot puts it back.
        self.iterations = 0
        self.apply_seconds_total = 0.0
        self._pull_cache: _EncodedWeights | None = None
        # Upper bounds on each variable's largest magnitude, exact when first needed.
        self._bounds: dict[str, Bounds] = {}
        # The buffers of the update over all variables at once, made at its first use, and
        # the bound it carries for all of them, valid at the version it names.
        self._flat: FlatState | None = None
        # Their layout, where the variables share a dtype that BLAS updates in place.
        self._flat_layout: BufferLayout | None = None
        self._flat_bound: tuple[int, Bounds] | None = None

    @property
    def hyperparameters(self) -> Hyperparameters:
        return self._hyperparameters

    @hyperparameters.setter
    def hyperparameters(self, rule: Hyperparameters) -> None:
        """A new rule; another optimizer, or other settings of it (or another choice of
        Muon's AdamW variables), start from fresh state, as a newly compiled Keras
        optimizer does (the state is each optimizer's own)."""
        rule.check_shapes({name: spec.shape for name, spec in self.specs.items()})
        before = self._hyperparameters
        if (rule.optimizer, rule.settings, rule.adamw_variables) != (
            before.optimizer, before.settings, before.adamw_variables
        ):
            self.slots = {}
            self._bounds = {}
            self._flat_bound = None
        self._hyperparameters = rule

    def restart_optimizer(self) -> None:
        """Starts the optimizer afresh, as a newly compiled Keras optimizer: no state, and
        no iteration (a schedule starts over)."""
        self.slots = {}
        self._bounds = {}
        self._flat_bound = None
        self.iterations = 0

    @property
    def updates(self) -> int:
        """The updates applied: the iterations, or under gradient accumulation the steps
        that updated (Keras' `optimizer.iterations`, which its optimizers' updates and
        moving averages read, where its schedules read the steps)."""
        steps = self.hyperparameters.gradient_accumulation_steps
        return self.iterations // steps if steps else self.iterations

    @property
    def initialized(self) -> bool:
        return bool(self.specs)

    @property
    def parameter_count(self) -> int:
        return sum(int(w.size) for w in self.weights.values())

    @property
    def parameter_bytes(self) -> int:
        return sum(int(w.nbytes) for w in self.weights.values())

    def initialize(
        self,
        weights: Mapping[str, np.ndarray],
        version: int = 0,
        slots: OptimizerState | None = None,
    ) -> None:
        """Raises `InvalidArgument`, with nothing changed, where the rule cannot update
        variables of these shapes (see `Hyperparameters.check_shapes`)."""
        self._hyperparameters.check_shapes({name: tuple(w.shape) for name, w in weights.items()})
        self.weights = {name: tensors.little_endian(w) for name, w in weights.items()}
        self.specs = {name: tensors.VariableSpec.of(name, w) for name, w in self.weights.items()}
        self.slots = {name: dict(state) for name, state in (slots or {}).items()}
        self.version = version
        self._pull_cache = None
        self._bounds = {}
        layout = BufferLayout.of(self.specs)
        updatable = layout.dtype is not None and blas_for(np.zeros(0, layout.dtype)) is not None
        self._flat_layout = layout if updatable else None
        self._flat = None
        self._flat_bound = None

    def replace(
        self, weights: Mapping[str, np.ndarray], hyperparameters: Hyperparameters, version: int, fresh_optimizer: bool
    ) -> None:
        """Other variables in place of these, under `hyperparameters`. With
        `fresh_optimizer` the optimizer starts afresh; otherwise the variables kept (same
        name, dtype and shape) keep their state, under the same optimizer and settings.
        Raises `InvalidArgument`, with nothing changed, where the rule cannot update
        variables of these shapes."""
        hyperparameters.check_shapes({name: tuple(w.shape) for name, w in weights.items()})
        before = self._hyperparameters
        same_optimizer = not fresh_optimizer and (
            (hyperparameters.optimizer, hyperparameters.settings, hyperparameters.adamw_variables)
            == (before.optimizer, before.settings, before.adamw_variables)
        )
        kept = {
            name: state
            for name, state in self.slots.items()
            if same_optimizer and name in weights and tensors.VariableSpec.of(name, weights[name]) == self.specs[name]
        }
        iterations = 0 if fresh_optimizer else self.iterations
        self._hyperparameters = hyperparameters
        self.initialize(weights, version, kept)
        self.iterations = iterations

    def require_initialized(self) -> None:
        if not self.initialized:
            raise FailedPrecondition("the model is not initialised yet: call InitModel first")

    def apply(
        self,
        gradients: Mapping[str, np.ndarray],
        magnitudes: Mapping[str, float] | float | None = None,
        learning_rate: float | None = None,
        momentum: float | None = None,
    ) -> None:
        """Applies one update; the gradient arrays are consumed as scratch space.

        `magnitudes` bound each gradient's largest magnitude (sums of magnitudes, as the
        server's finiteness check measures them), or all of them at once (their sum);
        what the update needs and was not given is measured here.
        `learning_rate` and `momentum` (the momentum-like setting) replace the rule's
        (compensated asynchrony); None applies the rule's. Raises `NonFinite`, with
        nothing changed, when the update would make a weight or the optimizer's state NaN
        or Inf.
        """
        started = time.perf_counter()
        rule = self.hyperparameters
        steps = rule.gradient_accumulation_steps
        if steps and (self.iterations + 1) % steps:
            self._accumulate(gradients)
            self.apply_seconds_total += time.perf_counter() - started
            return
        if steps:
            gradients = self._with_accumulated(gradients, steps)
            magnitudes = None
        if rule.clipping:
            rule.clipping.apply({name: g for name, g in gradients.items() if name not in rule.statistics})
            magnitudes = None
        step = Step(
            rule.learning_rate_at(self.iterations) if learning_rate is None else learning_rate,
            rule.momentum if momentum is None else momentum,
            self.updates,
        )
        if rule.rule.carries_bounds:
            if not self._apply_flat(gradients, magnitudes, step):
                self._apply_bounded(gradients, magnitudes, step)
        else:
            self._apply_checked(gradients, step)
        if rule.overwrites_with_average(step.iteration):
            # The weights took their averages, which the carried bounds do not follow.
            self._bounds = {}
        if steps:
            for state in self.slots.values():
                state.pop("gradient_accumulator", None)
        self.version += 1
        self.iterations += 1
        self.apply_seconds_total += time.perf_counter() - started

    def add_statistics(self, changes: Mapping[str, np.ndarray]) -> None:
        """Adds `changes` to the statistics they name, and nothing else: the update of a
        skipped step (see `GroupCoordinator.push`), which the iterations do not count.
        Raises `NonFinite`, with nothing changed, when a statistic would hold NaN or Inf."""
        if not changes:
            return
        with np.errstate(over="ignore", invalid="ignore"):
            updated = {name: self.weights[name] + change for name, change in changes.items()}
        for name, weight in updated.items():
            if not math.isfinite(tensors.abs_sum(weight)):
                raise NonFinite("update of", name)
        self._finish_pulls()
        for name, weight in updated.items():
            self.weights[name] = weight
            # Measured afresh when SGD's next update needs it.
            self._bounds.pop(name, None)
        self.version += 1

    def _apply_bounded(
        self, gradients: Mapping[str, np.ndarray], magnitudes: Mapping[str, float] | float | None, step: Step
    ) -> None:
        """The update in place, for optimizers whose bounds on the magnitudes are cheap to
        carry: only an update whose bound comes near the dtype's limit (or that has no
        bound) is tried on copies first."""
        if not isinstance(magnitudes, Mapping):
            magnitudes = {name: tensors.abs_sum(gradient) for name, gradient in gradients.items()}
        bounds = {name: self._bounds_after(name, magnitudes[name], step) for name in gradients}
        near_limit = [name for name, bound in bounds.items() if not self._within(name, bound)]
        for name in near_limit:
            # The carried bounds only ever grow: measured afresh, they may be far lower.
            self._bounds[name] = Bounds.exact(self.weights[name], self.slots.get(name, {}))
            bounds[name] = self._bounds_after(name, magnitudes[name], step)
        tried = {name: self._updated(name, gradients[name], step) for name in near_limit if not self._within(name, bounds[name])}
        self._finish_pulls()
        for name, weight in self.weights.items():
            if name in tried:
                updated, slots = tried[name]
                np.copyto(weight, updated)
                self.slots[name] = slots
                bounds[name] = Bounds.exact(updated, slots)
            else:
                self._update(name, weight, gradients[name], step)
        # Every bound is set by now: within the limit, or measured after the update.
        self._bounds = {name: bound for name, bound in bounds.items() if bound is not None}

    def _apply_flat(
        self, gradients: Mapping[str, np.ndarray], magnitudes: Mapping[str, float] | float | None, step: Step
    ) -> bool:
        """The update over whole buffers, where one rule applies to every variable and
        the bound it carries for all of them stays within the dtype's limit; False, with
        nothing changed, where it does not apply (the update then goes by variable)."""
        rule = self.hyperparameters
        flat = self._flat_state()
        if flat is None:
            return False
        trained, spans = flat.trained(rule.statistics)
        # One variable has no calls to merge: the buffers' checks would cost more than
        # they save.
        if len(trained) < 2 or not _one_rule(rule, trained):
            return False
        optimizer = rule.rule
        region = flat.gradient_region(gradients)
        change = tensors.total_magnitude(magnitudes) if magnitudes is not None else tensors.abs_sum(region)
        if not math.isfinite(change):
            return False
        bound = self._flat_bound
        before = bound[1] if bound is not None and bound[0] == self.version else self._summed_bound(trained)
        decay = rule.weight_decay_of(next(iter(trained)))
        decayed = Bounds(before.weight * abs(1 - step.learning_rate * decay), before.slots) if decay else before
        after = optimizer.bounds_after(decayed, change, step, region.dtype)
        if after is None:
            return False
        # The statistics take their changes as they are.
        after = Bounds(max(after.weight, before.weight + change), after.slots)
        if not after.within(region.dtype):
            return False
        names = set(flat.slots) | _slot_names(optimizer, step.momentum != 0)
        self._finish_pulls()
        if not flat.binds(self.weights, self.slots, trained) or not names <= flat.slots.keys():
            names |= {slot for name in trained for slot in self.slots.get(name, {})}
            flat.bind(self.weights, self.slots, trained, names)
        weights = flat.weights.region
        assert weights is not None
        for span in spans:
            if decay:
                apply_weight_decay(weights[span], step.learning_rate * decay)
            optimizer.update_in_place(weights[span], region[span], _spanned(flat.slots, span), step)
        for name in rule.statistics & self.weights.keys():
            self.weights[name] += gradients[name]
        self._bounds = {}
        # `apply` counts the update next.
        self._flat_bound = (self.version + 1, after)
        return True

    def _flat_state(self) -> FlatState | None:
        """The buffers for the update over all variables, where they share one dtype that
        BLAS updates in place."""
        if self._flat is None and self._flat_layout is not None:
            self._flat = FlatState(self._flat_layout)
        return self._flat

    def _summed_bound(self, trained: frozenset[str]) -> Bounds:
        """A bound for every variable at once, from their sums of magnitudes."""
        weight = max(tensors.abs_sum(w) for w in self.weights.values())
        slots: dict[str, float] = {}
        for name in trained:
            for slot, array in self.slots.get(name, {}).items():
                slots[slot] = max(slots.get(slot, 0.0), tensors.abs_sum(array))
        return Bounds(weight, slots)

    def copy_weights_into(self, out: Mapping[str, np.ndarray]) -> None:
        """Copies the weights into `out` (arrays of the model's specs, by name): in one
        pass where both are buffers laid out alike."""
        flat = self._flat
        if flat is not None and isinstance(out, FlatArrays):
            region = out.region_as(flat.layout)
            if region is not None and all(self.weights[name] is view for name, view in flat.weights.items()):
                assert flat.weights.region is not None
                parallel.copy(region, flat.weights.region)
                return
        for name, array in out.items():
            parallel.copy(array, self.weights[name])

    def _apply_checked(self, gradients: Mapping[str, np.ndarray], step: Step) -> None:
        """Any other optimizer's update, computed into new arrays and put in place only
        when every weight and every array of the optimizer's state is finite."""
        updated = {name: self._updated(name, gradient, step) for name, gradient in gradients.items()}
        self._finish_pulls()
        for name, (weight, slots) in updated.items():
            self.weights[name] = weight
            self.slots[name] = slots

    def _finish_pulls(self) -> None:
        if self._pull_cache is not None:
            # Pulls of the version about to be replaced may still be reading it.
            self._pull_cache.finish()

    def _within(self, name: str, bound: Bounds | None) -> bool:
        return bound is not None and bound.within(self.weights[name].dtype)

    def _update(self, name: str, weight: np.ndarray, gradient: np.ndarray, step: Step) -> None:
        """The update of `weight` and its optimizer state, in place."""
        rule = self.hyperparameters
        if name in rule.statistics:
            weight += gradient
            return
        weight_decay = rule.weight_decay_of(name)
        if weight_decay:
            apply_weight_decay(weight, step.learning_rate * weight_decay)
        optimizer = rule.optimizer_of(name)
        slots = self.slots[name] = self._started_state(name, weight, step)
        optimizer.update_in_place(weight, gradient, slots, step)
        self._after_update(name, weight, slots, step.iteration)

    def _updated(self, name: str, gradient: np.ndarray, step: Step) -> tuple[np.ndarray, Slots]:
        """The weight and optimizer state of `name` after the update, as new arrays (the
        optimizer's state created on the variable's first update); raises `NonFinite`
        if any holds NaN or Inf."""
        rule = self.hyperparameters
        weight = self.weights[name]
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            if name in rule.statistics:
                weight, slots = weight + gradient, self.slots.get(name, {})
            else:
                slots = self._started_state(name, weight, step)
                weight_decay = rule.weight_decay_of(name)
                if weight_decay:
                    weight = decayed(weight, step.learning_rate * weight_decay)
                weight, slots = rule.optimizer_of(name).update(weight, gradient, slots, step)
                average = self.slots.get(name, {}).get("average")
                if average is not None:
                    slots["average"] = average.copy()
                self._after_update(name, weight, slots, step.iteration)
        for array in (weight, *slots.values()):
            if not math.isfinite(tensors.abs_sum(array)):
                raise NonFinite("update of", name)
        return weight, slots

    def _accumulate(self, gradients: Mapping[str, np.ndarray]) -> None:
        """A step of Keras' gradient accumulation that updates nothing: each gradient is
        added to its variable's accumulated ones (its state "gradient_accumulator"),
        while the statistics take their changes, and the average and the constraints
        move as Keras moves them at every step; the iterations count the step. Raises
        `NonFinite`, with nothing changed, where a statistic would hold NaN or Inf."""
        rule = self.hyperparameters
        self.add_statistics({name: gradient for name, gradient in gradients.items() if name in rule.statistics})
        changed = rule.overwrites_with_average(self.updates) or bool(rule.constraints)
        if changed:
            self._finish_pulls()
        for name, gradient in gradients.items():
            if name in rule.statistics:
                continue
            slots = self.slots.setdefault(name, {})
            accumulated = slots.get("gradient_accumulator")
            if accumulated is None:
                # A copy: the gradient's buffer is the server's again after this step.
                slots["gradient_accumulator"] = gradient.copy()
            else:
                accumulated += gradient
            self._after_update(name, self.weights[name], slots, self.updates)
        if changed:
            self._bounds = {}
            self.version += 1
        self.iterations += 1

    def _with_accumulated(self, gradients: Mapping[str, np.ndarray], steps: int) -> dict[str, np.ndarray]:
        """The gradients of an update under Keras' gradient accumulation: the mean of
        those accumulated since the last update and these, in these gradients' buffers."""
        statistics = self.hyperparameters.statistics
        averaged = dict(gradients)
        for name, gradient in averaged.items():
            if name in statistics:
                continue
            accumulated = self.slots.get(name, {}).get("gradient_accumulator")
            if accumulated is not None:
                gradient += accumulated
            gradient /= gradient.dtype.type(steps)
        return averaged

    def _started_state(self, name: str, weight: np.ndarray, step: Step) -> Slots:
        """The variable's state, with its optimizer's as the optimizer starts it where it
        has none yet (its average or accumulated gradients may come first); a new dict
        only then."""
        slots = self.slots.get(name, {})
        if slots.keys() - _KEPT_BESIDE_THE_OPTIMIZER:
            return slots
        return {**slots, **self.hyperparameters.optimizer_of(name).slots(weight, step)}

    def _after_update(self, name: str, weight: np.ndarray, slots: Slots, iteration: int) -> None:
        """What Keras does to a variable after its optimizer's step, in place: its moving
        average follows it, then its constraint applies."""
        self._follow_average(weight, slots, iteration)
        constraint = self.hyperparameters.constraints.get(name)
        if constraint is not None:
            constraint.apply(weight)

    def _follow_average(self, weight: np.ndarray, slots: Slots, iteration: int) -> None:
        """Keras' `use_ema` after an update, in place: the weight's moving average (its
        state "average") follows the weight, which takes the average every
        `ema_overwrite_frequency` updates. A convex combination of finite weights, the
        average cannot overflow where they do not."""
        rule = self.hyperparameters
        if rule.ema_momentum is None:
            return
        # Keras' average starts as the weight itself, at the first update.
        momentum = weight.dtype.type(rule.ema_momentum if iteration else 0.0)
        average = slots.get("average")
        if average is None:
            average = slots["average"] = np.zeros_like(weight)
        average *= momentum
        average += (weight.dtype.type(1) - momentum) * weight
        if rule.overwrites_with_average(iteration):
            np.copyto(weight, average)

    def finalize_averages(self) -> None:
        """Puts each weight's moving average in its place, as Keras' optimizer does when
        `fit` ends (`finalize_variable_values`); nothing where none is kept."""
        averages = {name: state["average"] for name, state in self.slots.items() if "average" in state}
        if not averages:
            return
        self._finish_pulls()
        for name, average in averages.items():
            np.copyto(self.weights[name], average)
            self._bounds.pop(name, None)
        self.version += 1

    def _bounds_after(self, name: str, change: float, step: Step) -> Bounds | None:
        """Bounds on `name`'s largest magnitudes once the optimizer applies a gradient
        whose magnitudes are bounded by `change`; None where it carries none."""
        weight = self.weights[name]
        if name not in self._bounds:
            self._bounds[name] = Bounds.summed(weight, self.slots.get(name, {}))
        before = self._bounds[name]
        rule = self.hyperparameters
        if name in rule.statistics:
            return dataclasses.replace(before, weight=before.weight + change)
        weight_decay = rule.weight_decay_of(name)
        if weight_decay:
            before = dataclasses.replace(before, weight=before.weight * abs(1 - step.learning_rate * weight_decay))
        after = rule.optimizer_of(name).bounds_after(before, change, step, weight.dtype)
        constraint = rule.constraints.get(name)
        if after is None or constraint is None:
            return after
        if not constraint.norms_stay_finite(after.weight, weight.size, weight.dtype):
            # Tried on a copy and checked instead.
            return None
        return dataclasses.replace(after, weight=constraint.bound_after(after.weight))

    def weight_chunks(self) -> "_EncodedWeights":
        """The current weights as serialized `PullReply` chunk messages, encoded once per
        version and shared by every caller that pulls it. The caller may iterate over them
        after releasing the lock (see `_EncodedWeights`)."""
        if self._pull_cache is None or self._pull_cache.version != self.version:
            self._pull_cache = _EncodedWeights(self.version, self.weights)
        return self._pull_cache

    def snapshot(self) -> Arrays:
        """Copies of the weights and the optimizer's state, for a checkpoint."""
        return (
            {name: w.copy() for name, w in self.weights.items()},
            {name: {slot: a.copy() for slot, a in slots.items()} for name, slots in self.slots.items()},
        )


def _one_rule(rule: Hyperparameters, trained: frozenset[str]) -> bool:
    """Whether `rule` updates the `trained` variables alike, each with nothing of its own
    after the optimizer's step."""
    decays_some = rule.weight_decay and bool(rule.no_weight_decay & trained)
    return not (
        rule.adamw_variables
        or rule.constraints
        or rule.ema_momentum is not None
        or rule.gradient_accumulation_steps
        or decays_some
    )


@functools.lru_cache(maxsize=8)
def _slot_names(optimizer: Optimizer, momentum: bool) -> frozenset[str]:
    """The names of the state `optimizer` starts a variable with, where the step matters
    only by whether `momentum` is on (SGD's). The update over buffers asks at every push,
    and building the state to read its names cost about a tenth of Adam's update there."""
    return frozenset(optimizer.slots(np.zeros(0, np.float32), Step(0.0, 1.0 if momentum else 0.0, 0)))


def _spanned(slots: Mapping[str, FlatArrays], span: slice) -> Slots:
    spanned = {}
    for name, buffer in slots.items():
        assert buffer.region is not None
        spanned[name] = buffer.region[span]
    return spanned


class _EncodedWeights:
    """One version of the weights as serialized `PullReply` chunk messages, encoded as
    they are first read rather than all before the first one is sent: a pull's first
    chunks are on their way while the rest are encoded (for 100 MB, encoding takes 12 ms).

    Reading happens outside the coordinator's lock, so `ModelState.apply` calls `finish`
    before it changes the weights in place; from then on, the chunks are read from here
    only. (`ModelState.initialize` puts new arrays in place of the old ones, which stay as
    they are for the readers of their version.)
    """

    def __init__(self, version: int, weights: Mapping[str, np.ndarray]) -> None:
        self.version = version
        self._lock = threading.Lock()
        self._chunks: list[bytes] = []
        self._unread: Iterator[bytes] | None = tensors.encode_messages(pb.PullReply, dict(weights))

    def __iter__(self) -> Iterator[bytes]:
        index = 0
        while True:
            with self._lock:
                if index == len(self._chunks):
                    chunk = next(self._unread, None) if self._unread is not None else None
                    if chunk is None:
                        self._unread = None
                        return
                    self._chunks.append(chunk)
                chunk = self._chunks[index]
            yield chunk
            index += 1

    def finish(self) -> None:
        """Encodes what no reader has reached yet."""
        with self._lock:
            if self._unread is not None:
                self._chunks.extend(self._unread)
                self._unread = None

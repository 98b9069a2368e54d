"""Hardware efficiency: predicted seconds per update for any number of groups.

Each worker is a device with a measured throughput (its profile). With `g` groups, group
`j` holds workers `j, j + g, ...`; a group step takes as long as its slowest member needs
for its share of the batch, plus one push_pull. Workers that share a device (co-located
processes on one CPU) share its throughput. Groups run side by side, so updates arrive at
the sum of the groups' rates, until the server, which applies them one at a time, is busy
all the time:

    seconds per update = max(1 / sum_j (1 / step_j), server seconds per update)

Measurements taken while training correct the prediction: the model keeps the ratio of
measured to predicted time and scales later predictions by its median.
"""

import statistics
from collections import Counter
from collections.abc import Sequence

from omnikeras.profiles import DeviceProfile, batch_shares


class HardwareModel:
    """Predicts seconds per update from device profiles and the server's measured costs.

    Args:
        workers: The profile of each worker's device, in worker order. Workers whose
            profiles are the same object share that device.
        batch_size: Examples per update (one group step).
        push_pull_seconds: Time of one push_pull of the model through the server.
        server_seconds_per_update: Time the server spends applying one update; updates
            cannot arrive faster than that. Defaults to 0.

    Example:

    >>> cpu = DeviceProfile("/CPU:0", "CPU", (16, 64), (400.0, 800.0))
    >>> model = HardwareModel([cpu] * 4, batch_size=64, push_pull_seconds=0.01)
    >>> round(model.seconds_per_update(1), 3)
    0.17
    """

    def __init__(
        self,
        workers: Sequence[DeviceProfile],
        batch_size: int,
        push_pull_seconds: float,
        server_seconds_per_update: float = 0.0,
    ) -> None:
        if not workers:
            raise ValueError("at least one worker is needed")
        self.workers = list(workers)
        self.batch_size = batch_size
        self.push_pull_seconds = push_pull_seconds
        self.server_seconds_per_update = server_seconds_per_update
        self._ratios: list[float] = []

    @property
    def num_workers(self) -> int:
        return len(self.workers)

    def predict(self, num_groups: int) -> float:
        """Seconds per update with `num_groups` groups, from the profiles alone."""
        if not 1 <= num_groups <= self.num_workers:
            raise ValueError(f"num_groups must be in [1, {self.num_workers}], got {num_groups}")
        sharers = Counter(id(device) for device in self.workers)
        rate = 0.0
        for group in range(num_groups):
            members = self.workers[group::num_groups]
            shares = batch_shares([d.throughput(self.batch_size / len(members)) for d in members], self.batch_size)
            compute = max(
                share * sharers[id(device)] / device.throughput(share)
                for device, share in zip(members, shares)
                if share > 0
            )
            rate += 1.0 / (compute + self.push_pull_seconds)
        return max(1.0 / rate, self.server_seconds_per_update)

    def seconds_per_update(self, num_groups: int) -> float:
        """The prediction, corrected by what was measured so far."""
        return self.predict(num_groups) * self.correction

    @property
    def correction(self) -> float:
        return statistics.median(self._ratios) if self._ratios else 1.0

    def observe(self, num_groups: int, measured_seconds_per_update: float) -> float:
        """Records a measurement; returns the prediction's relative error before it."""
        predicted = self.seconds_per_update(num_groups)
        self._ratios.append(measured_seconds_per_update / self.predict(num_groups))
        return (predicted - measured_seconds_per_update) / measured_seconds_per_update

"""TensorFlow's CPU thread settings, and the search for the ones that train fastest."""

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class ThreadSettings:
    """TensorFlow's intra-op threads (those that split one operation, a convolution or a
    matrix product) and inter-op threads (those that run independent operations at once).

    They take effect only before TensorFlow's runtime starts, so a process receives them
    through its environment (`TF_NUM_INTRAOP_THREADS`, `TF_NUM_INTEROP_THREADS`).

    Example:

    >>> ThreadSettings(intra_op=4, inter_op=1).environment()
    {'TF_NUM_INTRAOP_THREADS': '4', 'TF_NUM_INTEROP_THREADS': '1'}
    """

    intra_op: int
    inter_op: int

    def __post_init__(self) -> None:
        if self.intra_op < 1 or self.inter_op < 1:
            raise ValueError(f"thread counts must be at least 1, got {self}")

    def environment(self) -> dict[str, str]:
        return {"TF_NUM_INTRAOP_THREADS": str(self.intra_op), "TF_NUM_INTEROP_THREADS": str(self.inter_op)}

    def for_worker(self) -> "ThreadSettings":
        """These settings for a worker that trains through the parameter server: at least
        two inter-op threads. The worker's exchange runs in `tf.numpy_function`s, each
        holding an inter-op thread while it runs, and the one that hands over the later
        layers' gradients runs during backpropagation: with a single inter-op thread the
        rest of the step waits for it.

        >>> ThreadSettings(4, 1).for_worker()
        ThreadSettings(intra_op=4, inter_op=2)
        """
        return ThreadSettings(self.intra_op, max(2, self.inter_op))

    def shared_by(self, processes: int) -> "ThreadSettings":
        """The settings for each of `processes` processes that run at once on the cores
        these settings were measured on: the intra-op threads are divided among them, so
        that together they keep the cores busy without oversubscribing them.

        >>> ThreadSettings(8, 2).shared_by(3)
        ThreadSettings(intra_op=2, inter_op=2)
        """
        return ThreadSettings(max(1, self.intra_op // processes), self.inter_op)


def candidate_settings(cores: int | None = None) -> list[ThreadSettings]:
    """The settings worth measuring on `cores` cores (default: this machine's): intra-op
    threads of every power of two up to the core count, and the core count itself, each
    with one or two inter-op threads.

    >>> candidate_settings(6)
    [ThreadSettings(intra_op=1, inter_op=1), ThreadSettings(intra_op=1, inter_op=2), ...,
     ThreadSettings(intra_op=6, inter_op=2)]
    """
    cores = cores or len(os.sched_getaffinity(0))
    intra = sorted({1 << power for power in range(cores.bit_length()) if 1 << power <= cores} | {cores})
    return [ThreadSettings(i, inter) for i in intra for inter in (1, 2)]

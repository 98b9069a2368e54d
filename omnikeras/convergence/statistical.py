"""Statistical efficiency: how many more updates the loss needs to reach the target.

Every trial of a tuning phase starts from the same snapshot of the weights, whose loss on
a fixed probe batch of training data is measured once; each trial's final weights are
measured on the same batch, the same way. Between the two, the loss is taken to fall
geometrically, by the same factor per update, so

    rate = ln(start loss / end loss) / updates
    updates to target = ln(end loss / target loss) / rate

Every trial is scored on the same data whatever its number of groups or batch shares,
which the running loss of a worker's own batches is not.
"""

import math


def updates_to_target(start_loss: float, end_loss: float, updates: int, target_loss: float) -> float:
    """Predicted updates after the trial until the probe loss reaches `target_loss`.

    Negative when the trial went past the target: by the same geometric fall, that many
    updates before its end it was there, so trials that all pass the target are still
    ranked by how soon they did. `inf` if the loss did not fall, is not finite, or no
    update was applied.

    >>> round(updates_to_target(2.0, 1.0, 10, 0.25), 6)
    20.0
    >>> round(updates_to_target(2.0, 0.5, 10, 1.0), 6)
    -5.0
    """
    if target_loss <= 0:
        raise ValueError(f"target_loss must be positive, got {target_loss}")
    if not (math.isfinite(start_loss) and math.isfinite(end_loss)) or end_loss <= 0 or start_loss <= 0:
        return math.inf
    if updates <= 0 or end_loss >= start_loss:
        return math.inf
    rate = math.log(start_loss / end_loss) / updates
    return math.log(end_loss / target_loss) / rate

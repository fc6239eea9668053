"""Top-1 accuracy of class scores against integer labels, for deploy's conversion check.

The metrics of every task live in `zoo_stages.lib.tasks`; this is its accuracy of a scores
output, under the name deploy's `conversion_check` imports.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zoo_stages.lib import tasks

if TYPE_CHECKING:
    import numpy as np


def accuracy(scores: "np.ndarray", labels: "np.ndarray") -> float:
    """Top-1 accuracy of `scores` (samples, classes) against integer `labels` (samples,).

    InvalidInput when a label names a class the scores do not have (model.num_classes and the
    dataset disagree).
    """
    return tasks.classification_metrics(labels, scores=scores)["accuracy"]

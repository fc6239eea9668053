"""Figures of classifiers: top-1 accuracy of class scores against integer labels."""

from __future__ import annotations

from typing import TYPE_CHECKING

from zoo.errors import InvalidInput

if TYPE_CHECKING:
    import numpy as np


def accuracy(scores: "np.ndarray", labels: "np.ndarray") -> float:
    """Top-1 accuracy of `scores` (samples, classes) against integer `labels` (samples,).

    InvalidInput when a label names a class the scores do not have (model.num_classes and the
    dataset disagree).
    """
    import numpy as np

    labels = np.asarray(labels)
    if len(labels) == 0:
        return 0.0
    scores = np.asarray(scores).reshape(len(scores), -1)
    if int(np.max(labels)) >= scores.shape[1]:
        raise InvalidInput(f"the dataset has label {int(np.max(labels))} but the model outputs {scores.shape[1]} classes",
                           hint="check model.num_classes against the dataset")
    return float((scores.argmax(axis=1) == labels).mean())

"""Edge cases of the classification accuracy in zoo_stages.lib.quality.tasks."""

from __future__ import annotations

import numpy as np
import pytest

from zoo.errors import InvalidInput
from zoo_stages.lib.quality import tasks


def accuracy(scores, labels):
    return tasks.classification_metrics(labels, scores=scores)["accuracy"]


def test_accuracy_on_known_values_and_labels_beyond_the_classes():
    scores = np.array([[1.0, 0.0], [0.0, 2.0], [3.0, 4.0]])
    assert accuracy(scores, np.array([0, 1, 0])) == pytest.approx(2 / 3)
    assert accuracy(scores, np.array([0, 1, 1])) == 1.0
    assert accuracy(scores[:0], np.array([], dtype=np.int64)) == 0.0
    with pytest.raises(InvalidInput, match="label 5 but the model outputs 2 classes"):
        accuracy(scores, np.array([0, 1, 5]))

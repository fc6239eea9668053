"""Test helpers for the datasets module."""

from zoo_stages.lib.data.datasets import Split


def xy(split: Split):
    """(features, labels) of a single-feature split, as the image sources give."""
    return split.single("the test"), split.labels

"""The data's splits as a recipe's own training function gets them (torch's ``config.entry``, and
Keras' and JAX's: `zoo_stages.lib.models.entry_models`)."""

from __future__ import annotations

from zoo_stages.lib.data.datasets import Split


class TrainingSplit(Split):
    """A split as a custom training function gets it: `Split` (named features, labels), and
    for single-feature data also ``x, y = split`` (the arrays), as entry functions always had."""

    def __iter__(self):
        yield self.single("unpacking the split as (x, y)")
        yield self.labels

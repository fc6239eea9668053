"""Around a recipe's own training function (Keras' and JAX's `fit`): Python's and numpy's global
generators seeded with the stage's seed, and what the function prints sent to stderr, so its
progress bars never mix with ``zoo run --json``."""

from __future__ import annotations

import contextlib
import random
import sys


@contextlib.contextmanager
def user_code(seed: int):
    """Around a recipe's function: global generators seeded, its prints sent to stderr."""
    import numpy as np

    random.seed(seed)
    np.random.seed(seed % 2**32)
    with contextlib.redirect_stdout(sys.stderr):
        yield

"""The fixed train/held-out split (documented because releases depend on it).

Every sample gets the sort key ``sha256(f"{split_seed}:{index}")``; samples are ordered by that
key (a shuffle that is identical on every machine and numpy version), ``limit`` keeps the
first ``limit`` of that order, then ``ceil(val_fraction * N)`` samples are held out:

- classification data (stratified): the held-out samples are shared among classes by largest
  remainder (ties to the lower class index), and each class gives its first samples (in
  shuffled order) to the held-out split;
- regression and label-less data: the first samples in shuffled order are held out.

Both splits keep the shuffled order.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import TYPE_CHECKING

from zoo_stages.lib.data.errors import DataError

if TYPE_CHECKING:
    import numpy as np


def shuffle_order(n: int, seed: int) -> "np.ndarray":
    """A permutation of range(n) fixed by `seed`, the same on every machine and numpy version."""
    import numpy as np

    keys = [hashlib.sha256(f"{seed}:{i}".encode()).digest() for i in range(n)]
    return np.array(sorted(range(n), key=keys.__getitem__), dtype=np.int64)


def split_indices(n: int, classes: "np.ndarray | None", val_fraction: float, seed: int,
                  limit: int | None) -> tuple["np.ndarray", "np.ndarray"]:
    """(train, held-out) sample indices; stratified when `classes` (class index per sample) is given."""
    import numpy as np

    order = shuffle_order(n, seed)
    if limit is not None:
        order = order[:limit]
    n = len(order)
    n_val = math.ceil(val_fraction * n)
    if n < 2 or n_val >= n:
        raise DataError(f"the dataset has {n} samples: too few to hold out {val_fraction:.0%} and still train",
                        hint="raise data.limit, lower data.val_fraction or add data")
    is_val = np.zeros(n, dtype=bool)
    if classes is None:
        is_val[:n_val] = True
        return order[~is_val], order[is_val]
    labels = classes[order]
    kinds = np.unique(labels)
    counts = np.array([(labels == c).sum() for c in kinds])
    exact = counts * (n_val / n)  # each class's ideal share; the shares sum to n_val
    share = np.floor(exact).astype(int)
    rest = n_val - int(share.sum())
    # largest remainder; stable sort keeps the lower class index first on ties
    for j in np.argsort(-(exact - share), kind="stable")[:rest]:
        share[j] += 1
    for c, k in zip(kinds, share):
        members = np.flatnonzero(labels == c)  # already in shuffled order
        is_val[members[:k]] = True
    return order[~is_val], order[is_val]


def digest_indices(idx: "np.ndarray") -> str:
    return hashlib.sha256(json.dumps([int(i) for i in idx], separators=(",", ":")).encode()).hexdigest()

"""`Loaded`: every sample a source read (before `limit` and the split), and what the labels are."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import numpy as np

LabelKind = Literal["classes", "values"] | None


@dataclass
class Loaded:
    """All samples of a source, before `limit` and the split.

    `samples` holds per-sample arrays (samples along axis 0) that the source's modality turns
    into model features per split; `facts` are source facts for the preprocessing record.
    """

    samples: dict[str, Any]
    labels: "np.ndarray | None"
    label_kind: LabelKind
    class_names: list[str] | None = None
    facts: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        first = next(iter(self.samples.values()), None)
        return 0 if first is None else len(first)

    @property
    def num_classes(self) -> int:
        """Classes for classification data (names, else the largest index + 1); 0 otherwise."""
        if self.label_kind != "classes" or self.labels is None:
            return 0
        if self.class_names is not None:
            return len(self.class_names)
        return int(self.labels.max()) + 1 if len(self.labels) else 0


def class_labels(values: "np.ndarray", where: str) -> tuple["np.ndarray", LabelKind, list[str] | None]:
    """Labels from stored values: integers are class indices, strings classes (sorted names),
    floats regression values. DataError naming `where` for anything else."""
    import numpy as np

    from zoo_stages.lib.data.errors import DataError

    values = np.asarray(values)
    if values.ndim != 1:
        raise DataError(f"{where} has shape {values.shape}: labels are one value per sample")
    if values.dtype == bool:
        return values.astype(np.int64), "classes", ["False", "True"]
    if np.issubdtype(values.dtype, np.integer):
        if len(values) and values.min() < 0:
            raise DataError(f"{where} holds negative labels", hint="integer labels are class indices 0..K-1")
        return values.astype(np.int64), "classes", None
    if np.issubdtype(values.dtype, np.floating):
        if not np.isfinite(values).all():
            raise DataError(f"{where} holds NaN or infinite values", hint="drop or fill the samples without a label")
        return values.astype(np.float32), "values", None
    if values.dtype.kind in ("U", "S", "O"):
        texts = [str(v) for v in values]
        names = sorted(set(texts))
        index = {n: i for i, n in enumerate(names)}
        return np.array([index[t] for t in texts], dtype=np.int64), "classes", names
    raise DataError(f"{where} has type {values.dtype}, which is not a label",
                    hint="labels are integer class indices, class names (strings) or float values")

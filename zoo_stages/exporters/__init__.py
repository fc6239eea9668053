"""zoo's built-in exporters, one module per framework (torch, sklearn, lightgbm, xgboost, transformers, keras, jax), each a
`zoo.exporters` entry point of zoo's distribution; the contract is `zoo_stages.exporters.base`.

The export stage finds an exporter through its entry point (`zoo.engine.exporter_loader`), a
computed name that the cache key's import reader does not follow: `BUILTIN` names the built-in
ones here so their code enters the export kind's key (editing one reruns exports), and so
tests can go over each. A third-party exporter's code is its own distribution's business.
"""

from __future__ import annotations

from zoo_stages.exporters import jax, keras, lightgbm, sklearn, torch, transformers, xgboost

BUILTIN = {cls.name: cls for cls in (torch.TorchExporter, sklearn.SklearnExporter, lightgbm.LightGBMExporter,
                                     xgboost.XGBoostExporter, transformers.TransformersExporter, keras.KerasExporter,
                                     jax.JaxExporter)}

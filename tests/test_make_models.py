"""The ONNX files recipes import are exactly what scripts/make_models.py writes."""

import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def test_committed_models_match_the_script():
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "make_models.py"), "--check"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_sobel_model_finds_a_vertical_edge_and_nothing_on_flat_images():
    import onnxruntime as ort

    session = ort.InferenceSession(str(ROOT / "recipes" / "models" / "sobel-edges.onnx"),
                                   providers=["CPUExecutionProvider"])
    step = np.zeros((1, 1, 5, 8), np.float32)
    step[..., 4:] = 1.0
    edges = session.run(None, {"image": step})[0]
    assert edges.shape == step.shape
    np.testing.assert_allclose(edges[0, 0, :, 3:5], 4.0)  # |gx| = 1 + 2 + 1 on both sides of the step
    assert np.all(np.delete(edges[0, 0], [3, 4], axis=1) == 0)
    assert np.all(session.run(None, {"image": np.full((2, 1, 7, 3), 0.5, np.float32)})[0] == 0)

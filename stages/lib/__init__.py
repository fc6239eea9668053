"""Helpers shared by the built-in kinds (datasets, architectures, ONNX utilities)."""

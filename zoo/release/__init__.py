"""Reproducible releases: ``ship`` (`zoo release`: run under the lockfile, check gates, push,
tag), ``repro`` (`zoo repro --check`: rebuild without the cache and compare with the lockfile)
and ``onnxdiff`` (the first difference between two ONNX files).
"""

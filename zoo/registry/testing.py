"""Test and benchmark helpers: tiny staging folders and real servers on 127.0.0.1.

Used by tests/test_registry_*.py and bench/bench_registry.py; nothing here is used at run time.
Servers (moto S3, wsgidav WebDAV, olah as a Hugging Face endpoint plus a small Hub write API)
listen on loopback only and are stopped by their context managers.
"""

from __future__ import annotations

import json
from pathlib import Path

from zoo.registry.manifest import Build, Lineage, Manifest, Port


def tiny_onnx(path: Path, *, scale: float = 2.0, external: str | None = None, big_bytes: int = 0) -> Path:
    """Write a tiny valid ONNX model (y = x * scale + w), ir_version 13.

    `external` stores the weight as external data at that location (unchecked: tests use it to
    write hostile locations); `big_bytes` pads the weight to about that many bytes.
    """
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    n = max(4, big_bytes // 4)
    w = np.full((n,), scale, dtype=np.float32)
    init = numpy_helper.from_array(w, "w")
    if external is not None:
        init.ClearField("raw_data")
        init.data_location = TensorProto.EXTERNAL
        for k, v in (("location", external), ("offset", "0"), ("length", str(w.nbytes))):
            e = init.external_data.add()
            e.key, e.value = k, v
    node = helper.make_node("Add", ["x", "w"], ["y"])
    graph = helper.make_graph([node], "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n])], [init])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="zoo-tests")
    model.ir_version = 13
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model.SerializeToString())
    return path


def make_staging(root: Path, name: str = "tiny", version: str = "1.0.0", *,
                 builds: dict[str, dict] | None = None, scale: float = 2.0, card: str | None = "# tiny\n",
                 big_bytes: int = 0, task: str = "regression", description: str = "a tiny test model") -> Path:
    """A staging folder for `LocalZoo.publish`: one tiny ONNX model per build plus a model card.

    `builds` maps build name -> extra Build fields (metrics, execution_providers, requires...).
    """
    from zoo.registry.staging import file_ref, write_manifest

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    builds = builds if builds is not None else {"cpu-fp32": {"metrics": {"latency_p50_ms": 1.5, "accuracy": 0.9}}}
    built = {}
    for i, (bname, extra) in enumerate(builds.items()):
        rel = f"builds/{bname}/model.onnx"
        tiny_onnx(root / rel, scale=scale + i, big_bytes=big_bytes)
        built[bname] = Build(name=bname, file=file_ref(root, rel), opset=17,
                             inputs=[Port(name="x", dtype="float32", shape=[4])],
                             outputs=[Port(name="y", dtype="float32", shape=[4])], **extra)
    card_ref = None
    if card is not None:
        (root / "README.md").write_text(card)
        card_ref = file_ref(root, "README.md")
    manifest = Manifest(name=name, version=version, description=description, task=task, license="mit",
                        builds=built, card=card_ref,
                        lineage=Lineage(recipe={"name": name, "digest": "0" * 64}, tools={"onnx": "1.23"}))
    write_manifest(root, manifest)
    return root


def manifest_json(root: Path) -> dict:
    return json.loads((Path(root) / "zoo-manifest.json").read_text())

"""Provenance helpers that need no torch: reading metadata_props off the wire, and the license and
attribution a known host gives a source. The provenance of a whole chain (export from torch
weights onwards) is in test_provenance.py, which skips without the torch extra."""

from __future__ import annotations

import pytest

from zoo.errors import InvalidInput
from zoo_stages.lib.release import provenance


def test_read_metadata_refuses_a_file_that_is_not_protobuf(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff")
    with pytest.raises(InvalidInput, match="not a readable ONNX model"):
        provenance.read_metadata(bad)


def test_known_hosts_give_a_default_license_that_the_recipe_can_override():
    url = "https://download.pytorch.org/models/alexnet-owt-7be5be79.pth"
    rec = provenance.source_attribution("weights", url=url, sha256="7be5be79")
    assert rec["license"] == "BSD-3-Clause" and "torchvision" in rec["attribution"] and rec["uri"] == url
    own = provenance.source_attribution("weights", url=url, license="CC-BY-NC-4.0", attribution="me")
    assert (own["license"], own["attribution"]) == ("CC-BY-NC-4.0", "me")
    assert "license" not in provenance.source_attribution("weights", url="https://example.org/w.pt")

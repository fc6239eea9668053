"""`open_remote`: the `RemoteZoo` backend that serves a configured remote.

Apart from `zoo.registry.remote` (the interface), which the backends import: the interface never
imports a backend, so no backend's import leads back to itself. The backends are imported when
a remote of theirs is opened (the Hub's client is heavy).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zoo.registry.remote import RemoteZoo

if TYPE_CHECKING:
    from zoo.registry.config import RemoteConfig


def open_remote(config: "RemoteConfig") -> RemoteZoo:
    """The RemoteZoo for a configured remote (imports its backend lazily)."""
    if config.scheme == "hf":
        from zoo.registry.hf import HfRemoteZoo

        return HfRemoteZoo(config)
    if config.scheme == "oci":
        from zoo.registry.oci import OciRemoteZoo

        return OciRemoteZoo(config)
    from zoo.registry.fsremote import FsRemoteZoo

    return FsRemoteZoo(config)

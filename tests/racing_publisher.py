"""One of two publisher *processes* racing to publish the same version (run by the tests as
``python tests/racing_publisher.py MODE ...``); prints one JSON line: what happened.

The race is forced, not hoped for: each process, at the step given below, touches its own file
in BARRIER_DIR and waits until the other one's file is there too, so both have checked "not
there yet" before either writes. What settles the race is then only the create-exclusive write.

    publish ZOO_ROOT STAGING BARRIER_DIR ME   LocalZoo.publish; waits at its first `get`
    push ZOO_ROOT BARRIER_DIR ME KIND         `zoo push tiny@1.0.0 --to origin`; waits at the
                                              create-exclusive step (the backend class's create, or
                                              HfApi.create_tag of the version for KIND hf, the
                                              OCI client's put_manifest of the version tag for oci)
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

WAIT_LIMIT_S = 60  # only bounds a wait for a partner that died; never part of a verdict


def barrier(folder: Path, me: str) -> None:
    (folder / me).touch()
    give_up = time.monotonic() + WAIT_LIMIT_S
    while len(list(folder.iterdir())) < 2:
        if time.monotonic() > give_up:
            print(json.dumps({"outcome": "no partner"}), flush=True)
            sys.exit(3)
        time.sleep(0.01)


def publish(root: Path, staging: Path, folder: Path, me: str) -> dict:
    from zoo.errors import Conflict
    from zoo.registry.store import LocalZoo

    zoo = LocalZoo(root)
    real_get = zoo.get
    first = [True]

    def get_after_barrier(name, version):
        if first[0]:
            first[0] = False
            barrier(folder, me)
            return None  # "not there yet", as both processes saw it
        return real_get(name, version)

    zoo.get = get_after_barrier
    try:
        m = zoo.publish(staging)
    except Conflict as e:
        return {"outcome": "conflict", "message": e.message}
    return {"outcome": "won", "sha256": m.builds["cpu-fp32"].file.sha256}


def push(root: Path, folder: Path, me: str, kind: str) -> dict:
    from zoo.errors import Conflict
    from zoo.registry import api
    from zoo.registry.store import LocalZoo

    if kind == "hf":
        from huggingface_hub import HfApi as owner

        attr = "create_tag"
    elif kind == "oci":
        from zoo.storage.oci_client import OciClient as owner

        attr = "put_manifest"
    else:
        from remote_fixtures import backend_class

        owner, attr = backend_class(kind), "create"
    real = getattr(owner, attr)

    def racing(self, *args, **kwargs):
        if attr == "create" or kwargs.get("tag", "") == "1.0.0" or (attr == "put_manifest" and args[1] == "1.0.0"):
            barrier(folder, me)
        return real(self, *args, **kwargs)

    setattr(owner, attr, racing)
    try:
        result = api.push("tiny@1.0.0", "origin", zoo=LocalZoo(root))
    except Conflict as e:
        return {"outcome": "conflict", "message": e.message}
    return {"outcome": "won" if result["created"] else "same content"}


if __name__ == "__main__":
    mode, *args = sys.argv[1:]
    if mode == "publish":
        out = publish(Path(args[0]), Path(args[1]), Path(args[2]), args[3])
    else:
        out = push(Path(args[0]), Path(args[1]), args[2], args[3])
    print(json.dumps(out), flush=True)

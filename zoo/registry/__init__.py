"""The model zoo: local store, manifests, remotes, pull and push.

Modules (one job each): ``manifest`` (the format), ``codec`` (manifest bytes), ``refs``
(``name@version|tag``, version order), ``blobs`` (content-addressed store), ``index`` (SQLite
index), ``store`` (`LocalZoo`), ``staging`` (building a staging folder), ``config``
(named remotes: the user's ``$ZOO_CONFIG_DIR/remotes.json``, and an older zoo's own; a remote
option's name, folder or URL resolved), ``remote`` (the `RemoteZoo` interface every backend implements),
``remote_factory`` (``open_remote``: the backend for a configured remote), ``fsremote`` (the
remote zoo layout, with mirrors, on `zoo.storage`'s byte-level backends: folder, S3, GCS, Azure,
WebDAV, SSH, HTTP), ``hf`` (Hugging Face Hub), ``oci`` (an OCI registry: a repository per model, a
tag per version, ModelPack layers; bytes through `zoo.storage.oci_client`), ``select`` (best build for this host), ``pull``,
``api`` (what the CLI calls), ``attachments`` (a version's signature and bill of materials, beside
its manifest), ``bom`` (the bill of materials: a CycloneDX ML-BOM made from the version's manifest,
zoo.lock and provenance statement), ``signing`` (a version's signature made and checked with
model_signing), ``anchors`` (the trusted keys and root certificates), ``trust`` (whose anchors count
where, whether a signature is demanded), ``verify`` (`zoo verify`), ``zoo_config`` (the user's and a
project's ``config.yaml``, read once for the registry and the engine), ``bundle`` (air-gapped tar bundles: export, verified import),
``fsck`` (checking and repairing a local zoo); the servers tests and benchmarks run on 127.0.0.1
are `tests/registry_servers.py`. File writes, links and hashes are `zoo.files`; path and ONNX external-data checks
`zoo.pathsafety`.

Local zoo layout (``$ZOO_HOME``, default ``~/.local/share/zoo``)::

    remotes.json                                  older remotes config {"schema_version": 1, "remotes": [...]}:
                                                  still read; `zoo remote add` writes the user's
                                                  $ZOO_CONFIG_DIR/remotes.json, which wins on a name
    index.sqlite                                  derived index (versions, tags, build metrics, blob refs);
                                                  rebuilt from the files below when missing or damaged
    index-pending/<name>                          a writer of <name> has not finished updating the index:
                                                  the next reader re-syncs that model from its files
    blobs/sha256/<aa>/<sha256>                    every file, once, by content; read-only; verified by
                                                  sha256 before it is served
    blobs/verified/<aa>/<sha256>                  "dev ino size mtime_ns ctime_ns" of the blob when it last
                                                  hashed right (a re-check is a stat while it matches)
    blobs/partial/<sha256>.<host>.<pid>.<random>.incomplete
                                                  a download in progress, one file per download
                                                  (`zoo.download`); an interrupted one is resumed
    models/<name>/versions/<version>/zoo-manifest.json
                                                  the version's manifest, written last and create-exclusive
    models/<name>/versions/<version>/<path>       materialized files: hard links to blobs (a snapshot, so
                                                  this folder is itself a valid staging folder); `--to`
                                                  folders get independent copies instead
    models/<name>/tags/<tag>                      one line: the version the tag points at (`latest`, `prod`…)
    models/<name>/attachments/<version>/<file>    what the version carries beside its manifest: its signature
                                                  and bill of materials (`attachments`), create-exclusive
    tmp/                                          scratch space

Rules: a version is visible only once its manifest exists, and its manifest is written only
after all its blobs (publishing is atomic and resumable); the same version with different
bytes is a Conflict; `latest` follows the highest version (a pre-release never displaces a
release). Resolving ``name@1.2.0`` reads one manifest file; ``name@tag`` reads one tag file
first; listing and searching query the index, never every manifest.

Remote layout: see `zoo.registry.fsremote` (fsspec backends), `zoo.registry.hf` (Hub) and
`zoo.registry.oci` (OCI registries);
downloads into the blob store go through `zoo.download`, the one downloader.

Safety: every path in a manifest is relative and stays inside its version (validated on
load); staging files reached through symbolic links out of the staging folder are refused;
an ONNX build whose external data points outside its version, or at a file the manifest does
not list, is refused at publish and again at materialize (read with ``onnx.load(...,
load_external_data=False)``, nothing run). Every byte is checked against its sha256 before it
becomes visible; a mismatch raises IntegrityError (exit 4) and installs nothing.
**A pulled model never runs code**: no code path imports, unpickles or executes a pulled file;
pulling only copies bytes, hashes them, and parses ONNX protobuf headers for the check above.
"""

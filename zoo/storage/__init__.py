"""Bytes at a remote location, for both remote zoos (`zoo.registry`) and the remote run cache
(`zoo.engine.cache_store`), each of which keeps its own format on top.

Modules: ``urls`` (`scheme_of`: what kind of remote a URL names), ``fsbackend`` (`FsBackend`
through fsspec: a folder, WebDAV, read-only HTTP(S); paths kept inside the remote's root; each
scheme's atomic write and create-exclusive primitive; `open_backend` picks the scheme's class),
``backend_s3``, ``backend_gcs``, ``backend_azure``, ``backend_ssh`` (the schemes with a class of
their own), ``metered`` (a backend whose uploads report every byte, for progress bars),
``oci_client`` (an OCI registry's distribution API: blobs, manifests, tags; remote zoos only).

This package knows nothing of manifests, versions or cache entries: it imports only zoo's
infrastructure (`zoo.download`'s error sorting, `zoo.files`, `zoo.pathsafety`, `zoo.errors`).
"""

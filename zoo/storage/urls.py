"""What kind of remote a URL names (`scheme_of`): the one reading of a remote's URL, shared by the
byte-level backends (`zoo.storage.fsbackend.open_backend` picks one by it), the registry's remotes
config and the remote run cache's setting."""

from __future__ import annotations

from zoo.errors import InvalidInput


def scheme_of(url: str) -> str:
    """The kind of remote a URL names: file, s3, gcs, azure, ssh, webdav, http, hf or oci."""
    low = url.lower()
    if low.startswith("s3://"):
        return "s3"
    if low.startswith(("ssh://", "sftp://")):
        return "ssh"
    if low.startswith(("gs://", "gcs://")):
        return "gcs"
    if low.startswith(("az://", "abfs://", "abfss://")):
        return "azure"
    if low.startswith(("webdav+http://", "webdav+https://")):
        return "webdav"
    if low.startswith(("http://", "https://")):
        return "http"
    if low.startswith("hf://"):
        return "hf"
    if low.startswith("oci://"):
        return "oci"
    if low.startswith("file://") or url.startswith(("/", "~", ".")):
        return "file"
    raise InvalidInput(f"unsupported remote URL {url!r}",
                       hint="use a folder path, file://, s3://bucket/prefix, gs://bucket/prefix, az://container/prefix, webdav+https://host/path, ssh://[user@]host[:port]/abs/path, https://… (read-only), hf://namespace or oci://host[:port]/prefix")

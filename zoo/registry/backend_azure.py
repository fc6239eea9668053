"""A remote on Azure Blob Storage (``az://container/prefix``, also ``abfs://`` and ``abfss://``)
through adlfs.

The primitives the store promises rest on (zoo/engine/cache_store.py):

- create-exclusive: ``upload_blob(overwrite=False)`` sends ``If-None-Match: *`` (adlfs does for
  ``pipe_file(..., mode="create")``); when the blob exists the service answers 409
  BlobAlreadyExists or 412 ConditionNotMet, both ResourceExistsError in the SDK and
  FileExistsError from adlfs: someone else created it first;
- absent-or-complete: a blob appears only when its single Put Blob completes, or when the block
  list of a chunked upload is committed (staged blocks are invisible), never in part;
- ranged reads: ``cat_file(start, end)`` is one Get Blob with a byte range (FsBackend's
  `_iter_ranges`), so an interrupted download resumes where it stopped.

Credentials come from the environment, never from zoo's files: a connection string in
AZURE_STORAGE_CONNECTION_STRING (or the variable named by ``-o connection_string_env=``), or
AZURE_STORAGE_ACCOUNT_NAME / ``-o account_name=`` with AZURE_STORAGE_ACCOUNT_KEY or
AZURE_STORAGE_SAS_TOKEN, else Azure's default credential chain; ``-o anon=true`` for a public
container. adlfs is imported when a backend is opened, never at module import.
"""

from __future__ import annotations

import os

from zoo.errors import AccessDenied, InvalidInput
from zoo.registry.fsbackend import ObjectStoreBackend, credentials_hint

# an unreachable remote should fall back to the local cache in seconds: the Azure SDK retries a
# failed request 3 times, the first after 15 s; our own transfers resume anyway
RETRIES = 2
BACKOFF_S = 0.5


class AzureBackend(ObjectStoreBackend):
    """A `FsBackend` on one Azure Blob container and prefix."""

    def _open(self):
        try:
            from adlfs import AzureBlobFileSystem
        except ImportError as e:
            raise InvalidInput("Azure Blob Storage remotes need adlfs", hint="pip install 'zoo-onnx[azure]'") from e
        o = self.options
        kwargs: dict = {"use_listings_cache": False, "connection_timeout": 10, "read_timeout": 60}
        env = o.get("connection_string_env")
        if env:
            if not os.environ.get(env):
                raise AccessDenied(f"{self.url}: ${env} is not set", hint=credentials_hint(self.scheme, o))
            kwargs["connection_string"] = os.environ[env]
        if o.get("account_name"):
            kwargs["account_name"] = o["account_name"]
        if "anon" in o:
            kwargs["anon"] = bool(o["anon"])
        try:
            fs = AzureBlobFileSystem(**kwargs)
        except ValueError as e:  # adlfs: "Must provide either a connection_string or account_name with credentials"
            raise AccessDenied(f"{self.url}: no Azure storage account or credentials were found ({e})",
                               hint=credentials_hint(self.scheme, o)) from e
        _quick_retries(fs)
        return fs, self.url.split("://", 1)[1].rstrip("/")


def _quick_retries(fs) -> None:
    """Fewer, shorter retries on the service client's pipeline (every blob client shares its policies)."""
    for policy in getattr(getattr(fs.service_client, "_pipeline", None), "_impl_policies", []):
        if hasattr(policy, "total_retries") and hasattr(policy, "connect_retries"):
            policy.total_retries = policy.connect_retries = policy.read_retries = RETRIES
            if hasattr(policy, "initial_backoff"):
                policy.initial_backoff = BACKOFF_S
                policy.increment_base = 2

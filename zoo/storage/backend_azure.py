"""A remote on Azure Blob Storage through adlfs, in the URL forms adlfs itself accepts
(`parse_azure_url`), with ``az://``, ``abfs://`` or ``abfss://`` alike:

- ``az://container/prefix``: the account comes from the credentials (below);
- ``abfss://container@account.dfs.core.windows.net/prefix`` (or ``….blob.core.windows.net``):
  the account is the host's first label;
- ``abfss://account.dfs.core.windows.net/container/prefix``: the same, container first in the path.

An account named by the URL must agree with ``-o account_name=`` and with the account of the
connection string in use (a connection string would otherwise silently win over the URL).

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
import re
from urllib.parse import unquote, urlsplit

from zoo.errors import AccessDenied, InvalidInput
from zoo.storage.fsbackend import ObjectStoreBackend, credentials_hint

# an unreachable remote should fall back to the local cache in seconds: the Azure SDK retries a
# failed request 3 times, the first after 15 s; our own transfers resume anyway
RETRIES = 2
BACKOFF_S = 0.5
JITTER_S = 0.2

# the account host of Azure's public cloud, as adlfs recognises it (a container name has no dots)
_ACCOUNT_HOST = re.compile(r"^(?P<account>[a-z0-9]+)\.(dfs|blob)\.core\.windows\.net$")
URL_FORMS = ("az://container/prefix, abfss://container@account.dfs.core.windows.net/prefix or "
             "abfss://account.dfs.core.windows.net/container/prefix (abfs:// and az:// alike)")


def parse_azure_url(url: str) -> tuple[str | None, str]:
    """(storage account or None, ``container/prefix``) of an ``az://``, ``abfs://`` or ``abfss://`` URL."""
    parts = urlsplit(url)
    if parts.password is not None:
        raise InvalidInput("an Azure URL holds no password or key (not shown here)",
                           hint="credentials come from the environment: " + credentials_hint("azure", {}))
    host = (parts.hostname or "").lower()  # urlsplit drops a user part from hostname
    container = unquote(parts.username) if parts.username else None
    path = unquote(parts.path).strip("/")
    account = None
    if "." in host:
        match = _ACCOUNT_HOST.fullmatch(host)
        if match is None:
            raise InvalidInput(f"{url!r}: {host!r} is neither a container nor an Azure storage account host",
                               hint=f"write {URL_FORMS}")
        account = match["account"]
        if container is None:  # account host first, then the container in the path
            container, _, path = path.partition("/")
    elif container is not None:
        raise InvalidInput(f"{url!r}: after the @ comes the storage account's host",
                           hint=f"write {URL_FORMS}")
    else:
        container = parts.netloc
    if not container:
        raise InvalidInput(f"{url!r} names no Azure container", hint=f"write {URL_FORMS}")
    return account, f"{container}/{path}".rstrip("/")


def _connection_string_account(connection_string: str) -> str | None:
    """The AccountName of a connection string (its only part read here: the rest is secret)."""
    for part in connection_string.split(";"):
        key, _, value = part.partition("=")
        if key.strip().lower() == "accountname":
            return value.strip()
    return None


class AzureBackend(ObjectStoreBackend):
    """A `FsBackend` on one Azure Blob container and prefix."""

    def _open(self):
        try:
            from adlfs import AzureBlobFileSystem
        except ImportError as e:
            raise InvalidInput("Azure Blob Storage remotes need adlfs", hint="pip install 'zoo-onnx[azure]'") from e
        o = self.options
        url_account, root = parse_azure_url(self.url)
        kwargs: dict = {"use_listings_cache": False, "connection_timeout": 10, "read_timeout": 60}
        env = o.get("connection_string_env")
        if env:
            if not os.environ.get(env):
                raise AccessDenied(f"{self.url}: ${env} is not set", hint=credentials_hint(self.scheme, o))
            kwargs["connection_string"] = os.environ[env]
        account = o.get("account_name") or url_account
        if url_account and o.get("account_name") and o["account_name"] != url_account:
            raise InvalidInput(f"{self.url} names storage account {url_account!r}, the option account_name "
                               f"{o['account_name']!r}", hint="drop one of them, or make them agree")
        if account:
            kwargs["account_name"] = account
        # adlfs prefers a connection string (also AZURE_STORAGE_CONNECTION_STRING) to the account
        connection_string = kwargs.get("connection_string") or os.environ.get("AZURE_STORAGE_CONNECTION_STRING")
        in_use = _connection_string_account(connection_string) if connection_string else None
        if url_account and in_use and in_use.lower() != url_account:
            where = f"${env}" if env else "$AZURE_STORAGE_CONNECTION_STRING"
            raise InvalidInput(f"{self.url} names storage account {url_account!r}, but the connection string in "
                               f"{where} is for account {in_use!r}",
                               hint="set the connection string of the account the URL names, or name no account in the URL")
        if "anon" in o:
            kwargs["anon"] = bool(o["anon"])
        try:
            fs = AzureBlobFileSystem(**kwargs)
        except ValueError as e:  # adlfs: "Must provide either a connection_string or account_name with credentials"
            raise AccessDenied(f"{self.url}: no Azure storage account or credentials were found ({e})",
                               hint=credentials_hint(self.scheme, o)) from e
        _quick_retries(fs)
        return fs, root


def _quick_retries(fs) -> None:
    """Fewer, shorter retries on the service client's pipeline (every blob client shares its policies)."""
    for policy in getattr(getattr(fs.service_client, "_pipeline", None), "_impl_policies", []):
        if hasattr(policy, "total_retries") and hasattr(policy, "connect_retries"):
            policy.total_retries = policy.connect_retries = policy.read_retries = RETRIES
            if hasattr(policy, "initial_backoff"):
                # the SDK waits initial + base**n before retry n: base 0 makes it a constant
                # BACKOFF_S (with base 2, the second wait alone was 4.5 s)
                policy.initial_backoff = BACKOFF_S
                policy.increment_base = 0
            if hasattr(policy, "random_jitter_range"):
                # and adds up to ±3 s of jitter to each: an unreachable remote took up to 9 s to give
                # up on, not the second or so a fallback to the cache should take
                policy.random_jitter_range = JITTER_S

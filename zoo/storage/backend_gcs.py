"""A remote on Google Cloud Storage (``gs://bucket/prefix``, also ``gcs://``) through gcsfs.

The primitives the store promises rest on (zoo/engine/cache_store.py):

- create-exclusive: a single-request upload with the ``ifGenerationMatch=0`` precondition (gcsfs
  sends it for ``pipe_file(..., mode="create")``); GCS answers 412 when the object exists, which
  gcsfs raises as FileExistsError: someone else created it first;
- absent-or-complete: an object appears only when its upload is finalised (a single request, or
  the last chunk of a resumable upload), so a reader never sees part of one;
- ranged reads: ``cat_file(start, end)`` is one GET with a ``Range`` header (FsBackend's
  `_iter_ranges`), so an interrupted download resumes where it stopped.

Credentials come from Google's default chain (GOOGLE_APPLICATION_CREDENTIALS, gcloud's
application-default login, the metadata server on Google Cloud), from the service-account key
file named by ``-o credentials_file=PATH`` (gcsfs ``token=PATH``; zoo stores the path, never the
key), or none at all with ``-o anon=true``; zoo never stores them. ``-o endpoint_url=`` (or STORAGE_EMULATOR_HOST) points
at an emulator. gcsfs is imported when a backend is opened, never at module import.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os

from zoo.errors import AccessDenied, InvalidInput
from zoo.storage.fsbackend import ObjectStoreBackend, credentials_hint

# an unreachable remote should fall back to the local cache in seconds: gcsfs retries a failed
# request 6 times with up to 32 s between tries; our own transfers resume anyway
RETRIES = 2


@functools.cache
def _filesystem_class():
    """gcsfs's JSON API filesystem, retrying a failed request RETRIES times.

    (`gcsfs.GCSFileSystem` may be the experimental zonal-bucket class, which asks each bucket over
    gRPC what it is before a write; the JSON API class is the one whose uploads carry the
    ifGenerationMatch precondition.) One class for the process, so fsspec reuses its instances."""
    try:
        from gcsfs.core import GCSFileSystem
        from gcsfs.retry import retry_request
    except ImportError as e:
        raise InvalidInput("Google Cloud Storage remotes need gcsfs", hint="pip install 'zoo-onnx[gcs]'") from e

    class QuickGcsFileSystem(GCSFileSystem):
        _request = retry_request(retries=RETRIES)(GCSFileSystem._request.__wrapped__)

    return QuickGcsFileSystem


class GcsBackend(ObjectStoreBackend):
    """A `FsBackend` on one GCS bucket and prefix."""

    def _open(self):
        cls = _filesystem_class()
        o = self.options
        kwargs = {"token": self._token(), "use_listings_cache": False, "requests_timeout": 30}
        if o.get("endpoint_url"):
            kwargs["endpoint_url"] = o["endpoint_url"]
        if o.get("project"):
            kwargs["project"] = o["project"]
        with self._errors("connect"):
            fs = cls(**kwargs)
        root = self.url.split("://", 1)[1].rstrip("/")
        return fs, root

    def _token(self) -> str:
        """gcsfs's ``token``: "anon", the path of a service-account key file, or Google's default chain."""
        o = self.options
        if not o.get("credentials_file"):
            return "anon" if o.get("anon") else "google_default"
        if o.get("anon"):
            raise InvalidInput(f"{self.url}: the options anon and credentials_file contradict each other",
                               hint="drop one: anon=true reads a public bucket without credentials")
        path = os.path.expanduser(str(o["credentials_file"]))
        # checked here: gcsfs takes a `token` naming no file for an access token itself
        try:
            with open(path, "rb") as f:
                kind = json.load(f).get("type")
        except FileNotFoundError:
            raise AccessDenied(f"{self.url}: the credentials file {path} does not exist",
                               hint=credentials_hint(self.scheme, o)) from None
        except (OSError, ValueError, AttributeError) as e:
            raise AccessDenied(f"{self.url}: cannot read the credentials file {path} as a key file ({type(e).__name__})",
                               hint="download a service account's JSON key (IAM > Service accounts > Keys) and name it "
                                    "with -o credentials_file=PATH") from None
        if kind not in ("service_account", "authorized_user"):
            raise AccessDenied(f"{self.url}: {path} is not a service-account key file (its type is {kind!r})",
                               hint="download a service account's JSON key (IAM > Service accounts > Keys) and name it "
                                    "with -o credentials_file=PATH")
        return path

    @contextlib.contextmanager
    def _errors(self, what: str):
        try:
            with super()._errors(what):
                yield
        except AccessDenied:
            raise
        except Exception as e:
            # google-auth's "no credentials found" and gcsfs's 403 (an OSError "Forbidden: …")
            # carry no HTTP status the shared rules read
            cause = e.__cause__ or e
            name = type(cause).__name__
            if (name in ("DefaultCredentialsError", "RefreshError") or str(cause).startswith("Forbidden")
                    or getattr(cause, "code", None) in (401, 403)):
                raise AccessDenied(f"{self.url} refused access: {name}: {str(cause).splitlines()[0]} ({what})",
                                   hint=credentials_hint(self.scheme, self.options)) from e
            raise

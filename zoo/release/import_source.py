"""What `zoo import SOURCE` imports: the SOURCE text resolved to a pinned, checked file and its provenance.

SOURCE is one of:

- a local ONNX file (``model.onnx``, ``~/models/x.onnx``): pinned by the sha256 of its bytes now;
- ``https://host/path/model.onnx#sha256=<64 hex>`` (or ``http://``): the fragment pins the file;
  a URL without a full sha256 is refused (a download is only as trustworthy as its pin);
- ``hf://org/repo[@revision][/file.onnx]``: a Hugging Face Hub model repo (``HF_ENDPOINT``,
  ``HF_TOKEN``). The revision (default ``main``) is resolved to its commit sha, which the
  recipe pins; the ONNX file is the one named, else the repo's only ``.onnx`` file (several
  without a name: refused, listing them). Its sha256 is the Hub's LFS digest, or, for a file
  kept in git itself, the digest of the bytes at that (immutable) commit. The license comes
  from the repo card's metadata when it states one;
- ``CATALOG:NAME`` (``torchvision:resnet18``): a name in a weights catalog (`zoo.catalog`: zoo's
  own, or one on ``ZOO_CATALOG_PATH``), an architecture with pretrained weights the catalog pins
  by URL and full sha256; the export kind builds it (``weights: torchvision:NAME``). The weights
  are downloaded and checked here, before any stage runs.

`resolve` turns the text into an `ImportSource`; `fetch` puts the file into the run cache's
source store (`zoo.sources`), checking its sha256 first, so a wrong digest fails before any
stage runs and nothing is published.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from zoo.errors import AccessDenied, IntegrityError, InvalidInput, NotFound, SourceUnreachable
from zoo.registry.manifest import NAME_RE, VERSION_RE

FORMS = ("a local .onnx file, https://...#sha256=<64 hex>, hf://org/repo[@revision][/file.onnx] or a catalog "
         "name such as torchvision:resnet18")
DEFAULT_VERSION = "1.0.0"
IMAGENET_INPUT = (3, 224, 224)  # a catalog without preprocessing.input_shape: ImageNet classifiers' input
_DIGEST = re.compile(r"[0-9a-f]{64}")  # fullmatch only: `$` would let a final newline through


@dataclass(frozen=True)
class ImportSource:
    """A SOURCE resolved: where the export stage finds it, pinned, and what it says about itself."""

    text: str  # as the user gave it (not recorded: `pinned` is)
    form: Literal["file", "url", "hf", "catalog"]
    location: str | None  # the export config's `url` (pinned) or `path` (absolute); None for a catalog name
    sha256: str | None  # the file's full digest (a catalog name: its weights' digest)
    name: str  # the default zoo name
    version: str  # the default version
    revision: str | None = None  # hf: the commit sha the revision resolved to
    license: str | None = None  # when the source states one
    attribution: str | None = None
    arch: str | None = None  # a catalog name: the architecture, its classes, input shape and weights' URL
    num_classes: int | None = None
    input_shape: tuple[int, ...] | None = None
    weights_url: str | None = None

    @property
    def is_url(self) -> bool:
        return self.form in ("url", "hf")

    @property
    def pinned(self) -> str:
        """The source as it resolved, however it was spelled: ``hf://org/repo`` and
        ``hf://org/repo@main/model.onnx`` at the same commit are one source, and one version."""
        return self.location if self.location is not None else self.text

    def provenance(self) -> dict[str, Any]:
        """Where the version came from (the manifest's ``extra.import``); only what the source states."""
        out: dict[str, Any] = {"source": self.pinned, "form": self.form}
        for key in ("location", "revision", "sha256", "license", "arch"):
            value = getattr(self, key)
            if value is not None:
                out["url" if key == "location" and self.is_url else "path" if key == "location" else key] = value
        if self.weights_url is not None:
            out["url"] = self.weights_url
        return out


def resolve(text: str) -> ImportSource:
    """`text` as an `ImportSource` (contacts the Hub for hf://; hashes a local file)."""
    text = str(text).strip()
    if text.startswith("hf://"):
        return _hub(text)
    if text.startswith(("https://", "http://")):
        return _url(text)
    if "://" in text:
        raise InvalidInput(f"cannot import {text!r}: unknown scheme {text.split('://', 1)[0]!r}",
                           hint=f"SOURCE is {FORMS}")
    from zoo import catalog

    prefix = text.split(":", 1)[0] if ":" in text else ""
    if not Path(text).expanduser().exists() and (prefix in catalog.known() or catalog.NAME_RE.fullmatch(text)):
        return _catalog(text)  # a catalog's name, or one shaped like it (the error lists the catalogs)
    return _local(text)


def fetch(source: ImportSource, cache_dir: Path | None) -> Path | None:
    """The source file on disk, its sha256 checked (IntegrityError on a mismatch, before anything
    runs); downloads go to the run cache's source store, where the export stage finds them (a
    catalog name's weights too, so a wrong file fails here and nothing is published)."""
    url = source.location if source.location is not None else source.weights_url
    if url is None:
        return None
    from zoo import sources

    return sources.fetch(url, sha256=source.sha256, cache_dir=cache_dir)


def default_name(stem: str) -> str:
    """A zoo model name made from a file or repo name: lower case, other characters as '-'."""
    name = re.sub(r"[^a-z0-9._-]+", "-", stem.lower()).strip("-._")
    if not re.fullmatch(NAME_RE, name):
        raise InvalidInput(f"cannot make a model name from {stem!r}", hint="give one with --name")
    return name[:200]


# ---------------------------------------------------------------------------------------------


def _local(text: str) -> ImportSource:
    from zoo.sources import source_sha256

    path = Path(text).expanduser()
    if not path.is_file():
        why = "is not a file" if path.exists() else "does not exist"
        raise InvalidInput(f"cannot import {text!r}: {path} {why}", hint=f"SOURCE is {FORMS}")
    path = path.resolve()
    return ImportSource(text=text, form="file", location=str(path), sha256=source_sha256(path),
                        name=default_name(_stem(path.name)), version=DEFAULT_VERSION)


def _url(text: str) -> ImportSource:
    url, _, fragment = text.partition("#")
    digest = fragment[len("sha256="):].lower() if fragment.startswith("sha256=") else ""
    if not _DIGEST.fullmatch(digest):
        what = f"its sha256 {digest!r} is not 64 hex digits" if digest else "it has no #sha256=<64 hex digits>"
        raise InvalidInput(f"cannot import {url}: {what}",
                           hint=f"download it once from a source you trust, run `sha256sum FILE` (or `curl -sL "
                                f"{url} | sha256sum`), then: zoo import '{url}#sha256=<the 64 hex digits>'")
    path = url.split("://", 1)[1].partition("/")[2].split("?", 1)[0]
    why = "it holds a backslash" if "\\" in url else \
        "it holds a space or control character" if any(ch.isspace() or not ch.isprintable() for ch in url) else \
        "its path has a '.' or '..' part" if any(p in (".", "..") for p in path.split("/")) else None
    if why:  # the URL is pinned into the recipe and the provenance: it must mean one file, as written
        raise InvalidInput(f"cannot import {url!r}: {why}",
                           hint="give the file's URL as the server names it: https://HOST/PATH#sha256=<64 hex>")
    filename = url.rstrip("/").rsplit("/", 1)[-1].split("?", 1)[0]
    return ImportSource(text=text, form="url", location=url, sha256=digest,
                        name=default_name(_stem(filename) or "model"), version=DEFAULT_VERSION)


def _catalog(text: str) -> ImportSource:
    """A catalog name (``torchvision:resnet18``); InvalidInput names the catalogs or models there are."""
    from zoo import catalog

    prefix = text.split(":", 1)[0]
    if prefix not in catalog.known():
        raise InvalidInput(f"cannot import {text!r}: no weights catalog called {prefix!r} and no such file",
                           hint=f"SOURCE is {FORMS}; catalogs: {', '.join(catalog.known())}")
    try:
        entry = catalog.resolve(text)
    except InvalidInput as e:
        raise InvalidInput(f"cannot import {text!r}: {e.message}", hint=e.hint) from None
    shape = entry["preprocessing"].get("input_shape") or IMAGENET_INPUT
    return ImportSource(text=entry["catalog"], form="catalog", location=None, sha256=entry["sha256"],
                        name=default_name(text.split(":", 1)[1].replace("_", "-")), version=DEFAULT_VERSION,
                        license=entry["license"], attribution=entry["attribution"], arch=entry["arch"],
                        num_classes=entry["num_classes"], input_shape=tuple(int(d) for d in shape),
                        weights_url=entry["url"])


HUB_FORM = "hf://ORG/REPO[@REV]/PATH"
_HUB_HINT = (f"write {HUB_FORM}: PATH relative to the repo's root, its parts separated by '/', "
             "e.g. zoo import hf://org/repo@main/onnx/model.onnx")
# the Hub's own rules for owner and repo names: letters, digits, '-', '_', '.' (no '..', no leading '.')
_HUB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,95}")
# a branch, tag or commit: git's ref characters without anything that reads as a path step or a command
_HUB_REVISION = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,199}")
# a commit id the Hub answers with (sha1, or sha256 for a sha256 repository)
_COMMIT = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")


def parse_hub(text: str) -> tuple[str, str | None, str | None]:
    """``hf://org/repo[@rev][/file]`` -> (repo id, revision or None, file in the repo or None).

    The source is a stranger's text as much as the user's (pasted from a web page, a script):
    owner, repo and revision must be names, and the file a plain relative path (no '..' or '.'
    part, no empty part, not absolute, no backslash, no control character) -- InvalidInput, exit 2,
    before anything is asked of the Hub."""
    parts = text[len("hf://"):].split("/", 2)
    if len(parts) < 2 or not parts[0] or not parts[1] or (len(parts) == 3 and not parts[2]):
        raise InvalidInput(f"cannot import {text!r}: expected {HUB_FORM}", hint=_HUB_HINT)
    repo, _, revision = parts[1].partition("@")
    if not repo or (_ and not revision):
        raise InvalidInput(f"cannot import {text!r}: empty repo or revision", hint=_HUB_HINT)
    for what, value, pattern in (("owner", parts[0], _HUB_NAME), ("repo name", repo, _HUB_NAME),
                                 ("revision", revision, _HUB_REVISION)):
        if value and (not pattern.fullmatch(value) or ".." in value):
            raise InvalidInput(f"cannot import {text!r}: the {what} {value!r} is not a Hub name "
                               "(letters, digits, '-', '_', '.')", hint=_HUB_HINT)
    filename = parts[2] if len(parts) == 3 else None
    if filename is not None:
        why = repo_path_problem(filename)
        if why:
            raise InvalidInput(f"cannot import {text!r}: the path {filename!r} in the repo {why}", hint=_HUB_HINT)
    return f"{parts[0]}/{repo}", revision or None, filename


def repo_path_problem(path: str) -> str | None:
    """Why `path` is not a plain relative path inside a repo (None when it is one)."""
    if path.startswith("/"):
        return "is absolute"
    if "\\" in path:
        return "holds a backslash"
    if any(not ch.isprintable() for ch in path):
        return "holds a control character"
    parts = path.split("/")
    if any(p == "" for p in parts):
        return "has an empty part ('//' or a trailing '/')"
    if any(p in (".", "..") for p in parts):
        return "has a '.' or '..' part"
    return None


def _hub(text: str) -> ImportSource:
    repo_id, revision, filename = parse_hub(text)
    info = _hub_call(lambda api: api.model_info(repo_id, revision=revision or "main"), text, repo_id, revision)
    commit = str(info.sha or "")
    if not _COMMIT.fullmatch(commit):  # it goes into the pinned URL and the recipe: only a commit id will do
        raise IntegrityError(f"the Hub at {_endpoint()} answered {commit[:80]!r} as the commit of {repo_id}"
                             f"@{revision or 'main'}: not a commit id", hint="check HF_ENDPOINT; nothing was imported")
    onnx_files = sorted(s.rfilename for s in info.siblings or () if s.rfilename.endswith(".onnx"))
    if filename is None:
        if not onnx_files:
            raise NotFound(f"{repo_id}@{commit[:12]} has no .onnx file",
                           hint="zoo imports ONNX models; export the model to ONNX first")
        if len(onnx_files) > 1:
            listed = "\n".join(f"  zoo import hf://{repo_id}@{revision or 'main'}/{f}" for f in onnx_files)
            raise InvalidInput(f"{repo_id} has {len(onnx_files)} .onnx files: {', '.join(onnx_files)}; "
                               f"name the one to import", hint=f"one of:\n{listed}")
        filename = onnx_files[0]
        why = repo_path_problem(filename)
        if why:  # a name the Hub listed, not one the user typed: the Hub (or a mirror) is not to be trusted with paths
            raise IntegrityError(f"the Hub lists {filename!r} in {repo_id}@{commit[:12]}: the path {why}",
                                 hint=f"name a file: {HUB_FORM}; nothing was imported")
    elif filename not in {s.rfilename for s in info.siblings or ()}:
        raise NotFound(f"{repo_id}@{commit[:12]} has no file {filename!r}",
                       hint=f"its .onnx files: {', '.join(onnx_files) or 'none'}")
    digest = _hub_sha256(repo_id, filename, commit, text)
    return ImportSource(text=text, form="hf", location=f"hf://{repo_id}@{commit}/{filename}", sha256=digest,
                        name=default_name(repo_id.split("/", 1)[1]), version=_version_of(revision),
                        revision=commit, license=card_license(info.card_data, f"{repo_id}@{commit[:12]}"),
                        attribution=f"{repo_id} on the Hugging Face Hub (commit {commit})")


# a license as a card states it: an SPDX identifier or the Hub's own ids (mit, apache-2.0, cc-by-nc-4.0,
# llama3.1, other's license_name), or an SPDX expression of them (AND, OR, WITH; no parentheses)
_LICENSE_ID = r"[A-Za-z0-9][A-Za-z0-9.+_-]{0,63}"
LICENSE_RE = re.compile(rf"{_LICENSE_ID}(?: (?:AND|OR|WITH) {_LICENSE_ID}){{0,7}}")


def card_license(card: Any, where: str) -> str | None:
    """The license a repo card's metadata states, when it is a license identifier (``mit``,
    ``apache-2.0``, a list of them joined by AND); None when it states none.

    A card is a stranger's text: the value goes into the generated recipe, the build's metadata and
    the version's manifest, so anything that is not a short one-line identifier (a newline, YAML,
    markup, a paragraph) is dropped with a warning line on stderr rather than refused -- the model
    is still importable, and the version claims no license ("unspecified") instead of a wrong one."""
    if not card:
        return None
    value = card.get("license_name") if card.get("license") == "other" else None
    value = value or card.get("license")
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value):
        value = " AND ".join(value)
    if not value:  # none stated (no key, an empty string or list)
        return None
    if isinstance(value, str) and len(value) <= 200 and LICENSE_RE.fullmatch(value):
        return value
    import sys

    shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
    print(f"warning: {where}: the card's license {shown} is not a license identifier (such as mit or "
          "apache-2.0); importing without a license (unspecified)", file=sys.stderr, flush=True)
    return None


def _endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT


def _hub_sha256(repo_id: str, filename: str, commit: str, text: str) -> str:
    """The file's sha256 at `commit`: the Hub's LFS digest; for a file stored in git itself (no LFS
    pointer), the digest of its bytes at that commit, which git's own hashing makes immutable."""
    [info] = _hub_call(lambda api: api.get_paths_info(repo_id, [filename], revision=commit), text, repo_id, commit)
    lfs = getattr(info, "lfs", None)
    if lfs is not None and _DIGEST.fullmatch(str(getattr(lfs, "sha256", ""))):
        return lfs.sha256
    from huggingface_hub import hf_hub_download

    from zoo.sources import source_sha256

    local = _hub_call(lambda api: hf_hub_download(repo_id, filename, revision=commit, endpoint=api.endpoint),
                      text, repo_id, commit)
    return source_sha256(Path(local))


def _hub_call(call, text: str, repo_id: str, revision: str | None):
    """Run a huggingface_hub call, its failures as zoo errors (exit 2 for what does not exist,
    3 for a refusal or an unreachable Hub)."""
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import (GatedRepoError, HfHubHTTPError, OfflineModeIsEnabled,
                                        RepositoryNotFoundError, RevisionNotFoundError)

    if constants.HF_HUB_OFFLINE:
        raise SourceUnreachable(f"cannot resolve {text}: HF_HUB_OFFLINE is set",
                                hint="unset HF_HUB_OFFLINE to reach the Hub")
    try:
        return call(HfApi())
    except GatedRepoError as e:
        raise AccessDenied(f"{repo_id} is gated: {_first_line(e)}",
                           hint="accept its terms on the Hub and set HF_TOKEN") from None
    except RevisionNotFoundError:
        raise NotFound(f"{repo_id} has no revision {revision!r}",
                       hint="give a branch, tag or commit of the repo after '@'") from None
    except RepositoryNotFoundError:
        raise NotFound(f"no Hugging Face model repo {repo_id!r}" + (f" at revision {revision!r}" if revision else ""),
                       hint="check the name and revision; a private repo needs HF_TOKEN") from None
    except OfflineModeIsEnabled:
        raise SourceUnreachable(f"cannot resolve {text}: HF_HUB_OFFLINE is set",
                                hint="unset HF_HUB_OFFLINE to reach the Hub") from None
    except HfHubHTTPError as e:
        status = getattr(getattr(e, "response", None), "status_code", None)
        if status in (401, 403):
            raise AccessDenied(f"the Hub refused {repo_id}: {_first_line(e)}", hint="set HF_TOKEN") from None
        raise SourceUnreachable(f"cannot resolve {text}: {_first_line(e)}", hint="try again later") from None
    except Exception as e:
        from zoo.download import is_connection_error

        # huggingface_hub's HTTP client (httpx or its httpx2 fork) raises its own ConnectError & co.
        if is_connection_error(e):
            raise SourceUnreachable(f"cannot reach the Hub for {text}: {type(e).__name__}: {e}",
                                    hint="check HF_ENDPOINT and the network, then run again") from None
        raise


def _version_of(revision: str | None) -> str:
    """The revision as the zoo version when it is one (``v1.2.0`` -> 1.2.0), else 1.0.0."""
    candidate = (revision or "").removeprefix("v")
    return candidate if re.fullmatch(VERSION_RE, candidate) else DEFAULT_VERSION


def _stem(filename: str) -> str:
    return filename[:-len(".onnx")] if filename.lower().endswith(".onnx") else Path(filename).stem


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]

"""The files a stage reads outside the run cache, shipped to a Dask worker that shares no disk with
the caller (zoo/engine/remote_stage.py).

What a stage reads from the recipe's folder (model code, a training script, a CSV, a tokenizer
folder) and from zoo's own folders (``zoo-home:models/…`` and ``cache:parents/…`` of a `model.from`
parent: its ONNX files and pin, zoo/engine/parents.py; ``cache:dvc/…`` of a DVC pin) is what its kind's `dependencies` names: the list whose digests enter the stage's key
(zoo.engine.keys.code_digests). Shipping exactly that list means nothing the stage reads goes
unshipped and nothing shipped is unkeyed.

Caller (`FileShipper.manifest`): each of those files is uploaded to the remote run cache as an
object named by its sha256 (skipped when the remote has it), and the `FileManifest` maps the file's
key label (`keys.dependency_label`: recipe-relative, ``zoo-home:…``, ``cache:…``; a folder file by
file) to (sha256, size). A dependency outside the recipe's folder and zoo's folders is named by its
absolute path in the key: a worker could only put it at that path of its own disk, so it is refused
before anything is submitted (InvalidInput: move it into the recipe's folder).

Worker (`materialise`, then `check_digests`): every label must stay inside its folder (no '..', no
absolute path, no symbolic link on the way: UnsafePath, exit 4), and each file is downloaded with
its sha256 checked while it streams (zoo.download). Recipe-relative files go into a private project
folder in the worker's cache tmp, and the stage runs with its `RecipeInfo` pointing there, so
relative paths in its config resolve there. Files of zoo's folders go into this worker's own
ZOO_HOME / cache at the same relative paths (where they are content-addressed), each placed by a
rename once verified, and never over a different file. A recipe that lies in zoo's folders (`zoo
import` writes its recipes to ``<cache>/imports/…``) runs at its place in this worker's own, where
the files beside it were put. Absolute paths that the config or the recipe's sections name inside
the recipe's folder or zoo's folders (`FileManifest.paths`, listed by the caller) are rewritten to
this worker's places (`shipped_task`). Then the stage's dependency digests are computed again as
its key's were: any difference is an IntegrityError and the stage does not run.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from zoo.errors import IntegrityError, InvalidInput, UnsafePath

if TYPE_CHECKING:
    from zoo.engine.cache_store import CacheStore
    from zoo.engine.worker import StageTask

ZOO_FOLDERS = ("zoo-home", "cache")  # label prefixes of files in zoo's own folders (keys.dependency_label)


@dataclass(frozen=True)
class FileManifest:
    """The files a shipped stage reads: {label: (sha256, size)}, the labels that are folders (so an
    empty one exists on the worker too), the absolute paths the stage's config and recipe sections
    name inside the shipped folders ({the caller's path as written: its label}: the worker rewrites
    them to where it places that label), and the label of the recipe's folder when it lies in one
    of zoo's folders (``cache:imports/…``, as `zoo import`'s recipes do; "" otherwise: the stage
    runs in a private project folder)."""

    files: dict[str, tuple[str, int]] = field(default_factory=dict)
    folders: tuple[str, ...] = ()
    paths: dict[str, str] = field(default_factory=dict)
    recipe_dir: str = ""


def stage_dependencies(task: "StageTask") -> list[Path]:
    """The files and folders `task`'s kind declares as dependencies: those whose digests are in its key."""
    from zoo.engine import kind_loader, parents
    from zoo.stage import KeyContext

    cls = kind_loader.get(task.kind)
    config = cls.Config.model_validate(task.config)
    # on a worker, after `materialise`: a model its zoo lacks is resolved from the shipped pin
    ctx = KeyContext(recipe=task.recipe, shared=task.shared, matrix=task.matrix,
                     references=parents.StageReferences(task.shared, task.recipe.dir))
    return [Path(dep) for dep in cls().dependencies(config, ctx)]


class FileShipper:
    """The caller's side: upload a stage's dependencies to the remote store, and list them."""

    def __init__(self, store: "CacheStore"):
        self.store = store
        self._known: dict[tuple[str, int, int], tuple[str, int]] = {}  # (path, size, mtime) -> uploaded (sha256, size)

    def manifest(self, task: "StageTask", code: dict[str, str]) -> FileManifest:
        """The manifest of `task`'s dependencies, each file on the remote. `code`: the key's code
        digests, which must name every dependency (else the key and the shipment would differ)."""
        from zoo.engine.hashing import tree_files
        from zoo.engine.keys import dependency_label

        files: dict[str, tuple[str, int]] = {}
        folders: list[str] = []
        recipe_dir = dependency_label(task.recipe.dir, task.recipe.dir)
        for dep in stage_dependencies(task):
            label = dependency_label(dep, task.recipe.dir)
            if _is_absolute(label):
                raise InvalidInput(f"stage {task.stage_id} reads {label}, outside the recipe's folder: a Dask worker "
                                   "that shares no disk with this machine cannot be given it at that path",
                                   hint=f"move it into the recipe's folder ({task.recipe.dir}) and name it by a "
                                        "relative path in the recipe")
            if label not in code:
                raise InvalidInput(f"stage {task.stage_id}: its dependency {label} is not in its key",
                                   hint="the kind lists different dependencies from one call to the next; fix the kind")
            if dep.is_dir() and not dep.is_symlink():
                folders.append(label)
                for path in tree_files(dep):  # regular files only; a symbolic link is refused, as in the key
                    files[f"{label}/{path.relative_to(dep).as_posix()}"] = self._upload(path)
            else:
                tree_files(dep)  # refuses a symbolic link
                files[label] = self._upload(dep)
        return FileManifest(files=files, folders=tuple(folders), paths=named_paths(task),
                            recipe_dir=recipe_dir if _in_zoo_folder(recipe_dir) else "")

    def _upload(self, path: Path) -> tuple[str, int]:
        from zoo.files import sha256_and_size

        st = path.stat()
        memo = (str(path.resolve()), st.st_size, st.st_mtime_ns)
        if memo not in self._known:
            sha256, size = sha256_and_size(path)
            if not self.store.has_object(sha256, size):
                self.store.put_object(path, sha256)
            self._known[memo] = (sha256, size)
        return self._known[memo]


def _is_absolute(label: str) -> bool:
    return label.startswith("/") or Path(label).is_absolute()


def _in_zoo_folder(label: str) -> bool:
    prefix, sep, _ = label.partition(":")
    return bool(sep) and prefix in ZOO_FOLDERS


def _strings(value: Any) -> Iterator[str]:
    """Every string in a config or recipe section (nested mappings and lists)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _strings(item)


def named_paths(task: "StageTask") -> dict[str, str]:
    """{path: label} for the absolute paths `task`'s config and recipe sections name inside the
    recipe's folder or zoo's folders (ZOO_HOME, the run cache): a worker has those files at other
    paths, so it rewrites these strings (`rewrite_paths`). Paths elsewhere are left as written (a
    dependency there is refused by `FileShipper.manifest`, and what is not a dependency is not shipped)."""
    from zoo.engine.keys import dependency_label

    named: dict[str, str] = {}
    for text in _strings([task.config, task.shared]):
        if "\n" in text or not text.startswith(("/", "~")):
            continue
        path = Path(text).expanduser()
        if path.is_absolute() and path.exists():
            label = dependency_label(path, task.recipe.dir)
            if not _is_absolute(label):
                named[text] = label
    return named


def rewrite_paths(value: Any, where: dict[str, str]) -> Any:
    """`value` (a config or recipe section) with every string that is a key of `where` replaced by its value."""
    if isinstance(value, str):
        return where.get(value, value)
    if isinstance(value, dict):
        return {k: rewrite_paths(v, where) for k, v in value.items()}
    if isinstance(value, list):
        return [rewrite_paths(v, where) for v in value]
    return value


def place(label: str, project: Path) -> Path:
    """Where the file of `label` goes on this worker: in the private `project` folder, or in this
    worker's own ZOO_HOME / cache. UnsafePath for a label that would leave its folder."""
    from zoo import paths
    from zoo.pathsafety import safe_join

    root, rel = project, label
    prefix, sep, rest = label.partition(":")
    if sep and prefix in ZOO_FOLDERS:
        root, rel = (paths.zoo_home() if prefix == "zoo-home" else paths.cache_dir()), rest
    return safe_join(root, rel, what="shipped file")


def materialise(manifest: FileManifest, store: "CacheStore", project: Path, *, url: str = "") -> None:
    """Download the files of `manifest` (sha256 checked while they stream) to their `place`s.

    A file of zoo's folders already there is kept when its bytes are the same, refused (IntegrityError)
    when they differ: it is this worker's own, and the stage would read other bytes than its key names."""
    from zoo.download import download
    from zoo.files import sha256_and_size

    project.mkdir(parents=True, exist_ok=True)
    targets = {label: place(label, project) for label in (*manifest.files, *manifest.folders)}
    for label in manifest.folders:
        targets[label].mkdir(parents=True, exist_ok=True)
    for label, (sha256, size) in sorted(manifest.files.items()):
        dest = targets[label]
        if dest.is_symlink() or (dest.exists() and not dest.is_file()):
            raise UnsafePath(f"shipped file {label!r}: {dest} is not a regular file on this worker")
        if dest.exists():
            if sha256_and_size(dest) != (sha256, size):
                raise IntegrityError(f"shipped file {label!r}: this worker's own {dest} holds other bytes than "
                                     "the caller's; the stage was not run",
                                     hint="remove that file from the worker (it is out of date), then run again")
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        download([store.object_source(sha256, size)], dest, sha256=sha256, size=size,
                 what=f"remote cache {url}: the stage's file {label}")


def shipped_task(task: "StageTask", manifest: FileManifest, project: Path) -> "StageTask":
    """`task` as this worker runs it: its recipe in the private `project` folder, or (a recipe of
    zoo's folders) at the same place in this worker's own, so relative paths resolve where the files
    were put; and the absolute paths its config and recipe sections name mapped to this worker's places."""
    home = place(manifest.recipe_dir, project) if manifest.recipe_dir else project
    home.mkdir(parents=True, exist_ok=True)
    where = {text: str(place(label, project)) for text, label in manifest.paths.items()}
    return replace(task, recipe=replace(task.recipe, path=home / task.recipe.path.name),
                   config=rewrite_paths(task.config, where), shared=rewrite_paths(task.shared, where))


def check_digests(task: "StageTask", code: dict[str, str], *, private: bool = True) -> None:
    """IntegrityError unless every dependency of `task` (as materialised here) has the digest its
    key names (`code`: the key's code digests). `private`: the recipe runs in a private project
    folder (not at its place in zoo's folders)."""
    from zoo.engine.hashing import digest_path
    from zoo.engine.keys import dependency_label

    project = task.recipe.dir.resolve()
    for dep in stage_dependencies(task):
        resolved = dep.resolve()
        # the private project lies in this worker's cache: its files are named as the caller named them
        label = resolved.relative_to(project).as_posix() if private and resolved.is_relative_to(project) else \
            dependency_label(dep, project)
        if not dep.exists():
            raise InvalidInput(f"stage {task.stage_id} reads {dep}, which is not on this worker",
                               hint="name files of the recipe's folder by paths relative to the recipe; a file of "
                                    "zoo's folders is shipped only to where this worker's zoo keeps it")
        if code.get(label) != digest_path(dep):
            raise IntegrityError(f"stage {task.stage_id}: the file {label} shipped to this worker does not have "
                                 "the digest in the stage's key; nothing was run or pushed",
                                 hint="a file changed on the caller while the run shipped it, or the remote was "
                                      "tampered with; run again")


def dependency_codes(parts: dict[str, Any]) -> dict[str, str]:
    """The key's digests of the files a stage reads (its `files`)."""
    return dict(parts.get("files") or {})

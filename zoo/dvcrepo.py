"""A DVC repo read with git alone: which commit a pinned revision is, and the digest DVC recorded
there for a tracked file or folder. dvc itself is never imported here (see zoo_stages/lib/data/dvc.py,
which downloads the data), so recipe validation, plans and cached runs stay free of it.

The repo is a local folder (relative to the recipe) or a git URL. A URL is fetched once into a bare
mirror under ``<cache>/dvc/git/`` and fetched again only when the pinned commit is not in it yet.

Why only a full commit sha: a stage's cache key must not depend on a name that moves. A branch moves
with every commit and a tag can be moved (``git tag -f``), so both are refused with the commit they
point at now; a short sha is refused too, since it may become ambiguous. At a full sha everything
DVC recorded is immutable, so its answer is memoised on disk (`out_at`): a cached run reads one small
file, needing neither git nor the network.

Where DVC records a digest: the ``outs`` of a ``.dvc`` file (``dvc add``, ``dvc import``) and of
``dvc.lock`` (pipeline outputs), with paths relative to that file's folder. A folder's digest ends
in ``.dir`` (DVC's digest of its listing).

Every InvalidInput raised here starts its message with the recipe field it is about (``data.repo``,
``data.rev``, ``data.path``), so recipe validation places it at that field's line.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import posixpath
import re
import subprocess
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from zoo.errors import InvalidInput, SourceUnreachable

FULL_SHA = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")  # sha1 and sha256 repos
# what DVC writes as an output's md5: 32 lowercase hex digits, ".dir" for a folder's listing. The
# digest names a folder of zoo's cache (zoo_stages/lib/data/dvc.py), so anything else (a hostile
# repo's `md5: ../../outside`) is refused where it is read
DVC_MD5 = re.compile(r"[0-9a-f]{32}(?:\.dir)?")
OUT_SCHEMA_VERSION = 1
_URL = re.compile(r"^(?:[a-z][a-z0-9+.-]*://|[^/@\s]+@[^/:\s]+:)", re.IGNORECASE)  # scheme:// or user@host:path
_GIT_TIMEOUT_S = 300


@dataclass(frozen=True)
class DvcOut:
    """A file or folder DVC tracks, at one commit: where it is and the digest DVC recorded."""

    repo: str  # a local folder (absolute) or a git URL
    commit: str
    path: str  # posix, relative to the repo's root
    md5: str  # DVC's digest; ends in ".dir" for a folder
    hash: str  # "md5" (DVC 3), "md5-dos2unix" (recorded by DVC 2: text hashed with unix line ends)
    size: int | None
    nfiles: int | None
    recorded_in: str  # the .dvc file or dvc.lock that records it

    @property
    def is_dir(self) -> bool:
        return self.md5.endswith(".dir")

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": OUT_SCHEMA_VERSION, **asdict(self)}


def is_url(repo: str) -> bool:
    """Whether `repo` names a git URL (``https://…``, ``ssh://…``, ``file://…``, ``git@host:path``)."""
    return bool(_URL.match(repo))


def repo_location(repo: str, base_dir: Path) -> str:
    """A URL as given, or the local folder resolved against `base_dir` (the recipe's folder)."""
    if is_url(repo):
        return repo
    p = Path(repo).expanduser()
    return str((p if p.is_absolute() else Path(base_dir) / p).resolve())


def out_at(repo: str, rev: str, path: str, cache_dir: Path) -> DvcOut:
    """The DVC output at `path` in `repo` (from `repo_location`) at the full commit sha `rev`.

    A pin found before is read from its memo without git; otherwise `resolve_commit`, then `find_out`.
    """
    if FULL_SHA.fullmatch(rev):
        known = _read_memo(_out_memo(cache_dir, repo, rev, normalise_path(path)))
        if known is not None:
            return known
    return find_out(repo, resolve_commit(repo, rev, cache_dir), path, cache_dir)


def resolve_commit(repo: str, rev: str, cache_dir: Path) -> str:
    """`rev` checked to be a full commit sha present in `repo` (InvalidInput naming what it is otherwise).

    `repo` comes from `repo_location`. A branch, tag or short sha is refused with the commit it names now.
    """
    git = _Git.of(repo, cache_dir)
    if FULL_SHA.fullmatch(rev):
        if not git.has_commit(rev):
            raise InvalidInput(f"data.rev {rev} is not a commit of the DVC repo {repo}",
                           hint="push that commit to the repo, or pin one it has (`git log`)")
        return rev
    now = git.resolve_name(rev)
    if now is None:
        raise InvalidInput(f"data.rev {rev!r} names no commit of the DVC repo {repo}",
                           hint="pin a full commit sha (`git rev-parse HEAD` in the DVC repo)")
    what, commit = now
    raise InvalidInput(f"data.rev {rev!r} is a {what}; a recipe pins a full commit sha, which never moves",
                       hint=f"rev: {commit}   (what {rev!r} names now)")


def find_out(repo: str, commit: str, path: str, cache_dir: Path) -> DvcOut:
    """The DVC output at `path` in `repo` at `commit` (a full sha from `resolve_commit`).

    Memoised in this process and under ``<cache>/dvc/outs/`` (a commit never changes). NotFound,
    with the outputs DVC tracks there and a did-you-mean, when `path` is not one of them.
    """
    path = normalise_path(path)
    memo = _out_memo(cache_dir, repo, commit, path)
    known = _read_memo(memo)
    if known is not None:
        return known
    out = _find_out(repo, commit, path, str(cache_dir))
    from zoo.files import atomic_write_json

    atomic_write_json(memo, out.to_json(), fsync=False)  # a lost memo is found again
    return out


def normalise_path(path: str) -> str:
    """`path` as a posix path inside the repo; InvalidInput for an absolute path or one leaving it."""
    clean = posixpath.normpath(str(path).replace("\\", "/"))
    if posixpath.isabs(clean) or clean == ".." or clean.startswith("../") or clean in ("", "."):
        raise InvalidInput(f"data.path {path!r} is not a path inside the DVC repo",
                           hint="give the tracked file or folder relative to the repo's root, e.g. data/train.csv")
    return clean


def is_md5(value: object) -> bool:
    """Whether `value` is a digest as DVC writes one (never a path)."""
    return isinstance(value, str) and DVC_MD5.fullmatch(value) is not None


def _read_memo(memo: Path) -> DvcOut | None:
    try:
        raw = json.loads(memo.read_text())
        if raw.pop("schema_version") != OUT_SCHEMA_VERSION:
            return None
        out = DvcOut(**raw)
        return out if is_md5(out.md5) else None  # a memo written before digests were checked: read again
    except (OSError, ValueError, TypeError, KeyError):
        return None


def _out_memo(cache_dir: Path, repo: str, commit: str, path: str) -> Path:
    name = hashlib.sha256(json.dumps([repo, commit, path]).encode()).hexdigest()[:32]
    return Path(cache_dir) / "dvc" / "outs" / f"{name}.json"


@lru_cache(maxsize=64)
def _find_out(repo: str, commit: str, path: str, cache_dir: str) -> DvcOut:
    git = _Git.of(repo, Path(cache_dir))
    direct = f"{path}.dvc"
    text = git.show(commit, direct)
    if text is not None:
        for out in _outs(text, direct):
            if out["path"] == path:
                return _record(repo, commit, out, direct)
    outs: dict[str, tuple[dict, str]] = {}
    for recorded_in in git.list_files(commit):
        name = posixpath.basename(recorded_in)
        if name.endswith(".dvc") or name == "dvc.lock":
            for out in _outs(git.show(commit, recorded_in) or "", recorded_in):
                outs.setdefault(out["path"], (out, recorded_in))
    if path in outs:
        return _record(repo, commit, *outs[path])
    inside = [o for o in outs if path.startswith(o + "/")]
    if inside:
        raise InvalidInput(f"data.path {path!r} is inside the DVC output {inside[0]!r} (at {commit[:12]}), whose files "
                       "DVC records as one folder", hint=f"path: {inside[0]}, with format: folder (or the folder's format)")
    close = difflib.get_close_matches(path, list(outs), n=1)
    listed = ", ".join(sorted(outs)[:10]) + (" …" if len(outs) > 10 else "")
    raise InvalidInput(f"data.path {path!r} is not tracked by DVC in {repo} at {commit[:12]}"
                   + (f" (did you mean {close[0]!r}?)" if close else ""),
                   hint=f"tracked there: {listed}" if outs else "that commit has no .dvc file or dvc.lock outputs")


def _outs(text: str, recorded_in: str) -> list[dict]:
    """The outputs a .dvc file or dvc.lock records, each with its path relative to the repo's root
    (and, under "_field", the key path of its md5, to place an error). InvalidInput for a file past
    the limits of any YAML zoo reads (zoo/yamlio.py); a file that is not YAML records nothing."""
    from zoo import yamlio

    try:
        data = yamlio.safe_load(text)
    except yamlio.LimitExceeded as e:
        at = f"{recorded_in}:{e.line}" if e.line else recorded_in
        raise InvalidInput(f"data.path: the DVC file {at} is refused: {e.reason}",
                           hint=f"zoo reads at most {yamlio.MAX_DEPTH} levels of nesting and {yamlio.MAX_NODES:,} "
                                "values in any YAML file; DVC writes a few levels") from None
    except yamlio.YAMLError:
        return []
    if not isinstance(data, dict):
        return []
    if recorded_in.endswith("dvc.lock"):
        stages = data.get("stages") if isinstance(data.get("stages"), dict) else {}
        lists = [(("stages", name, "outs"), stage.get("outs")) for name, stage in stages.items()
                 if isinstance(stage, dict)]
    else:
        lists = [(("outs",), data.get("outs"))]
    folder = posixpath.dirname(recorded_in)
    found = []
    for where, outs in lists:
        for i, out in enumerate(outs if isinstance(outs, list) else []):
            if isinstance(out, dict) and isinstance(out.get("path"), str) and isinstance(out.get("md5"), str):
                found.append({**out, "path": posixpath.normpath(posixpath.join(folder, out["path"])),
                              "_field": (*where, i, "md5"), "_text": text})
    return found


def _record(repo: str, commit: str, out: dict, recorded_in: str) -> DvcOut:
    def number(key: str) -> int | None:
        value = out.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    if not is_md5(out["md5"]):
        from zoo import yamlio

        field = ".".join(str(k) for k in out["_field"])
        line = yamlio.line_of(out["_text"], out["_field"])
        shown = out["md5"] if len(out["md5"]) <= 80 else out["md5"][:80] + "…"
        raise InvalidInput(f"data.path {out['path']!r}: {recorded_in}:{line}: {field} {shown!r} is not a DVC digest "
                           f"(32 lowercase hex digits, '.dir' for a folder), in the DVC repo {repo} at {commit[:12]}",
                           hint=f"DVC writes only digests there: the file was edited by hand or by someone else; "
                                f"see `git log -p -- {recorded_in}` in the DVC repo, and pin a commit whose "
                                "file DVC wrote")

    return DvcOut(repo=repo, commit=commit, path=out["path"], md5=out["md5"],
                  hash=str(out.get("hash") or "md5-dos2unix"), size=number("size"), nfiles=number("nfiles"),
                  recorded_in=recorded_in)


class _Git:
    """git commands on a local repo, or on a bare mirror of a URL repo kept under the cache."""

    def __init__(self, repo: str, args: list[str], url: str | None):
        self.repo, self.args, self.url = repo, args, url

    @classmethod
    def of(cls, repo: str, cache_dir: Path) -> "_Git":
        if not is_url(repo):
            if not Path(repo).is_dir():
                raise InvalidInput(f"data.repo {repo} is not a folder",
                                   hint="give the DVC repo's folder (relative to the recipe) or its git URL")
            git = cls(repo, ["-C", repo], None)
            if git._run("rev-parse", "--git-dir", check=False).returncode != 0:
                raise InvalidInput(f"data.repo {repo} is not a git repository",
                                   hint="a DVC repo is a git repo with `dvc init` run in it")
            return git
        mirror = Path(cache_dir) / "dvc" / "git" / (hashlib.sha256(repo.encode()).hexdigest()[:24] + ".git")
        if not (mirror / "HEAD").is_file():
            mirror.parent.mkdir(parents=True, exist_ok=True)
            cls(repo, [], repo)._run("init", "-q", "--bare", str(mirror))
        return cls(repo, ["--git-dir", str(mirror)], repo)

    def _run(self, *args: str, check: bool = True, text: bool = True) -> subprocess.CompletedProcess:
        env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_OPTIONAL_LOCKS": "0"}
        try:
            return subprocess.run(["git", *self.args, *args], capture_output=True, text=text, env=env,
                                  timeout=_GIT_TIMEOUT_S, check=check)
        except FileNotFoundError:
            raise InvalidInput("data.repo: reading a DVC repo needs git, which is not on PATH", hint="install git") from None
        except subprocess.CalledProcessError as e:
            raise SourceUnreachable(f"git {' '.join(args[:2])} failed on {self.repo}: {(e.stderr or '').strip()[-500:]}",
                                    hint="check the repo's URL or folder, and the network") from None
        except subprocess.TimeoutExpired:
            raise SourceUnreachable(f"git {args[0]} on {self.repo} took more than {_GIT_TIMEOUT_S} s",
                                    hint="check the network") from None

    def _present(self, commit: str) -> bool:
        return self._run("cat-file", "-e", f"{commit}^{{commit}}", check=False).returncode == 0

    def has_commit(self, commit: str) -> bool:
        if self._present(commit):
            return True
        if self.url is None:
            return False
        # a URL repo: its branches and tags first (any server), then the commit itself (servers that allow it)
        self._run("fetch", "-q", "--no-tags", self.url, "+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*")
        if self._present(commit):
            return True
        self._run("fetch", "-q", self.url, commit, check=False)
        return self._present(commit)

    def resolve_name(self, rev: str) -> tuple[str, str] | None:
        """(what `rev` is: branch, tag or short commit sha; the commit it names now) or None."""
        refs = self._remote_refs() if self.url else self._local_refs()
        for name, what in ((f"refs/heads/{rev}", "branch"), (f"refs/tags/{rev}", "tag")):
            if name in refs:
                return what, refs[name]
        for name, commit in refs.items():  # a remote-tracking branch: refs/remotes/<remote>/<rev>
            if name.startswith("refs/remotes/") and name.split("/", 3)[-1] == rev:
                return "branch", commit
        if rev == "HEAD" and "HEAD" in refs:
            return "branch (HEAD)", refs["HEAD"]
        if re.fullmatch(r"[0-9a-f]{4,63}", rev) and self.url is None:
            found = self._run("rev-parse", "--verify", "-q", f"{rev}^{{commit}}", check=False)
            if found.returncode == 0:
                return "short commit sha", found.stdout.strip()
        return None

    def _local_refs(self) -> dict[str, str]:
        listed = self._run("for-each-ref", "--format=%(refname) %(objectname) %(*objectname)").stdout
        refs = {}
        for line in listed.splitlines():
            name, obj, *peeled = line.split(" ")
            refs[name] = peeled[0] if peeled and peeled[0] else obj
        head = self._run("rev-parse", "-q", "--verify", "HEAD", check=False)
        if head.returncode == 0:
            refs["HEAD"] = head.stdout.strip()
        return refs

    def _remote_refs(self) -> dict[str, str]:
        refs: dict[str, str] = {}
        for line in self._run("ls-remote", self.url).stdout.splitlines():
            obj, _, name = line.partition("\t")
            refs[name.removesuffix("^{}")] = obj  # a tag's peeled line (its commit) comes after the tag's own
        return refs

    def show(self, commit: str, path: str) -> str | None:
        done = self._run("show", f"{commit}:{path}", check=False)
        return done.stdout if done.returncode == 0 else None

    def list_files(self, commit: str) -> list[str]:
        return [p for p in self._run("ls-tree", "-r", "-z", "--name-only", commit).stdout.split("\0") if p]

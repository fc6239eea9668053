"""Real git+DVC repos for the tests: `git init`, `dvc init`, a local DVC remote, `dvc add` and `dvc push`
per version; then the workspace copies and DVC's cache are deleted, so the data can only come from
the remote. The dvc and git commands are the real ones (dvc from this environment)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

DVC = str(Path(sys.executable).with_name("dvc"))


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@localhost", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


def dvc(repo: Path, *args: str) -> str:
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    done = subprocess.run([DVC, *args], cwd=repo, env=env, capture_output=True, text=True)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done.stdout


@dataclass
class DvcRepo:
    path: Path
    remote: Path
    commits: list[str]  # one per version, in order

    def remote_object(self, md5: str) -> Path:
        """The file holding an object in the DVC 3 remote layout."""
        return self.remote / "files" / "md5" / md5[:2] / md5[2:]


def make_dvc_repo(root: Path, versions: list[Callable[[Path], list[str]]]) -> DvcRepo:
    """A git+DVC repo at ``root/repo`` with a local remote at ``root/remote``; each version writes
    its files into the workspace and returns the paths to `dvc add`, which are committed and pushed.
    Afterwards the workspace copies and the DVC cache are gone: reads must go to the remote."""
    repo, remote = root / "repo", root / "remote"
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    dvc(repo, "init", "-q")
    dvc(repo, "remote", "add", "-d", "storage", str(remote))
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "dvc init")
    commits, tracked = [], set()
    for number, write in enumerate(versions, start=1):
        paths = write(repo)
        tracked.update(paths)
        dvc(repo, "add", "-q", *paths)
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", f"data v{number}")
        dvc(repo, "push", "-q")
        commits.append(git(repo, "rev-parse", "HEAD"))
    for path in tracked:
        target = repo / path
        shutil.rmtree(target) if target.is_dir() else target.unlink()
    shutil.rmtree(repo / ".dvc" / "cache", ignore_errors=True)
    return DvcRepo(repo, remote, commits)

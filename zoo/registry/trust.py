"""Whose signatures a command accepts, and whether it demands one (docs/trust.md, "Signed releases").

Trust anchors (`zoo.registry.anchors`) are PEM files the user names: a public key trusts what
that key signed, a root certificate the signing certificates that chain up to it. They come from
the user's own files only:

- ``signing.trust`` in ``$ZOO_HOME/config.yaml``: trusted for every source;
- ``trust`` of a remote in the user's ``remotes.json`` (`zoo remote add NAME URL --trust FILE`):
  trusted for what is pulled from that remote. A version already in the local zoo, or in a
  bundle, remembers no remote, so there every anchor the user configured anywhere counts.

A project's ``.zoo/config.yaml`` comes with a cloned repository, so it may only narrow:
``signing.require: true`` there is honoured; its ``trust`` entries, ``key`` and ``certificate``
are ignored with a note, approved or not (an approval is about a run cache's options), so no
repository can make zoo accept its author's key.

Whether a signature is demanded (`Policy.require`): ``--require-signature``, or, for a version
entering the local zoo from a remote or a bundle, the user's ``signing.require`` or a project's
(a version the local zoo holds came in checked, or is the user's own build: a pull of it, `zoo
verify` and `zoo.load_session` demand a signature only when asked to). Without a demand, a signed
version is checked whenever any anchor applies (and refused if its signature fails: other
content, an untrusted signer); an unsigned one passes, as does a signed one where no anchor is
configured (nothing to check it against).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from zoo.registry.anchors import Anchor, load_anchor

if TYPE_CHECKING:
    from zoo.registry.config import RemoteConfig


@dataclass(frozen=True)
class SigningSettings:
    """The user's ``signing:`` section, paths resolved (zoo.registry.zoo_config)."""

    key: Path | None = None
    certificate: Path | None = None
    certificate_chain: tuple[Path, ...] = ()
    require: bool = False
    trust: tuple[Path, ...] = ()
    origin: str | None = None


def user_settings() -> SigningSettings:
    """The ``signing:`` section of ``$ZOO_HOME/config.yaml`` (empty when there is none)."""
    from zoo.registry import zoo_config

    path = zoo_config.user_config()
    if not path.is_file():
        return SigningSettings()
    section = zoo_config.parse(path, zoo_config.read_bytes(path)).get("signing") or {}

    def p(v: str | None) -> Path | None:
        return zoo_config.resolve_path(v, path) if v else None

    return SigningSettings(key=p(section.get("key")), certificate=p(section.get("certificate")),
                           certificate_chain=tuple(zoo_config.resolve_path(v, path) for v in section.get("certificate_chain", [])),
                           require=bool(section.get("require", False)),
                           trust=tuple(zoo_config.resolve_path(v, path) for v in section.get("trust", [])), origin=str(path))


def project_require(start: Path | None) -> tuple[bool, list[str]]:
    """(whether the nearest project config demands signatures, notes on what of its ``signing:`` was ignored)."""
    from zoo.registry import zoo_config

    path = zoo_config.project_config(Path(start or Path.cwd()).resolve())
    if path is None:
        return False, []
    section = zoo_config.parse(path, zoo_config.read_bytes(path)).get("signing") or {}
    ignored = sorted(k for k in section if k != "require")
    notes = [f"{path}: signing.{', signing.'.join(ignored)} ignored: a project's config may only demand signatures "
             "(signing.require), never choose whose to trust or which key signs; trust keys in your own "
             "$ZOO_HOME/config.yaml or with `zoo remote add NAME URL --trust FILE`"] if ignored else []
    return bool(section.get("require", False)), notes


@dataclass
class Policy:
    """What a command accepts: these anchors; `require` a signature or not; `notes` to print."""

    anchors: list[Anchor] = field(default_factory=list)
    require: bool = False
    notes: list[str] = field(default_factory=list)
    why_required: str = ""

    @property
    def active(self) -> bool:
        """Whether signatures are checked at all (something is trusted, or one is demanded)."""
        return self.require or bool(self.anchors)


def policy(remotes: "list[RemoteConfig]", *, require: bool = False, project_start: Path | None = None,
           entering: bool = True) -> Policy:
    """The policy for a version from `remotes` (one: a pull's source; every configured one: a local
    version or a bundle): the user's global anchors and those remotes' own, deduplicated by
    fingerprint; a signature demanded by `require` (the flag) and, for a version `entering` the local
    zoo (from a remote or a bundle), by the user's or the project's ``signing.require`` — a version
    already here came in checked, or is the user's own build, which no config demands be signed."""
    user = user_settings()
    proj_require, notes = project_require(project_start)
    user_require, proj_require = user.require and entering, proj_require and entering
    why = "--require-signature" if require else (f"signing.require in {user.origin}" if user_require else "")
    if not why and proj_require:
        from zoo.registry import zoo_config

        why = f"signing.require in {zoo_config.project_config(Path(project_start or Path.cwd()).resolve())}"
    anchors: dict[str, Anchor] = {}
    for path in user.trust:
        a = load_anchor(path, f"signing.trust in {user.origin}")
        anchors.setdefault(a.fingerprint, a)
    for r in remotes:
        for path in r.trust:
            a = load_anchor(path, f"trust of remote {r.name}")
            anchors.setdefault(a.fingerprint, a)
    return Policy(list(anchors.values()), bool(why), notes, why)


def all_remotes(zoo_root: Path) -> "list[RemoteConfig]":
    """Every named remote the zoo at `zoo_root` sees (their anchors count for a local version or a bundle)."""
    from zoo.registry.config import RemotesConfig

    return RemotesConfig(zoo_root).list()

"""Why a stage will (re)run: compare its key parts with what the lockfile recorded last time."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from zoo.engine.hashing import digest_json
from zoo.engine.lockfile import StageLock

class ReasonCode(StrEnum):
    """Why a stage runs, is cached or did not run; the README's list of reasons is checked against it.

    A StrEnum, so `--json` output and comparisons with plain strings see the text."""

    NEW = "new"
    FORCED = "forced"
    POLICY = "cache policy"
    KIND_VERSION = "kind version changed"
    CONFIG = "config changed"
    INPUT = "input changed"
    CODE = "code changed"
    RECIPE = "recipe changed"
    TOOLS = "tool version changed"
    MISSING = "output missing"
    UPSTREAM = "upstream reran"
    CACHED = "cached"
    WAITING = "waiting"  # another `zoo run` is computing the same key; this one waits for its result
    NOT_RUN = "not run"  # an upstream failed, or the run stopped before the stage's turn


@dataclass(frozen=True)
class Reason:
    """One reason with its detail (``config changed: lr: 0.1 → 0.2``)."""

    code: ReasonCode
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.code}: {self.detail}" if self.detail else self.code


def compare(parts: dict[str, Any], previous: StageLock | None) -> list[Reason]:
    """Reasons the key differs from the previous run's; [] when the parts are the same."""
    if previous is None:
        return [Reason(ReasonCode.NEW, "no previous run recorded in the lockfile")]
    reasons: list[Reason] = []
    if parts["kind"] != previous.kind or parts["kind_version"] != previous.kind_version:
        reasons.append(Reason(ReasonCode.KIND_VERSION, f"{previous.kind} v{previous.kind_version} → {parts['kind']} v{parts['kind_version']}"))
    changes = (_dict_changes(previous.config, parts["config"], "") + _shared_changes(parts["shared"], previous)
               + _dict_changes(previous.matrix, parts["matrix"], "matrix"))
    if changes:
        more = f" (and {len(changes) - 4} more)" if len(changes) > 4 else ""
        reasons.append(Reason(ReasonCode.CONFIG, ", ".join(changes[:4]) + more))
    changed_inputs = [f"{up}.{name}" for up in sorted(set(parts["inputs"]) | set(previous.inputs))
                      for name in sorted(set(parts["inputs"].get(up, {})) | set(previous.inputs.get(up, {})))
                      if parts["inputs"].get(up, {}).get(name) != previous.inputs.get(up, {}).get(name)]
    if changed_inputs:
        reasons.append(Reason(ReasonCode.INPUT, ", ".join(changed_inputs[:4])))
    files = parts.get("files", {})
    changed_files = sorted(k for k in set(files) | set(previous.files) if files.get(k) != previous.files.get(k))
    if changed_files:
        reasons.append(Reason(ReasonCode.CODE, ", ".join(changed_files[:4])))
    if parts.get("recipe", {}) != previous.recipe:
        changed = [f"{k}: {_short(previous.recipe.get(k))} → {_short(v)}" for k, v in sorted(parts.get("recipe", {}).items())
                   if previous.recipe.get(k) != v]
        reasons.append(Reason(ReasonCode.RECIPE, ", ".join(changed[:3]) or "recipe identity"))
    if parts.get("lineage", {}) != previous.lineage and not changed_inputs:
        moved = sorted(k for k in set(parts.get("lineage", {})) | set(previous.lineage)
                       if parts.get("lineage", {}).get(k) != previous.lineage.get(k))
        reasons.append(Reason(ReasonCode.UPSTREAM, "ancestor keys changed: " + ", ".join(moved[:4])))
    changed_tools = [f"{t} {previous.tools.get(t, 'absent')} → {parts['tools'].get(t, 'absent')}"
                     for t in sorted(set(parts["tools"]) | set(previous.tools))
                     if parts["tools"].get(t) != previous.tools.get(t)]
    if changed_tools:
        reasons.append(Reason(ReasonCode.TOOLS, ", ".join(changed_tools[:4])))
    return reasons


def code_changes(parts: dict[str, Any], before: dict[str, Any]) -> list[Reason]:
    """Why a stage whose record is unchanged has another key than the entry `before` (the parts of
    the last one this cache holds of the same record): the kind's modules that changed, or the
    kind epoch (zoo.stage.KIND_EPOCH); [] when neither did."""
    reasons = []
    now, then = parts.get("code", {}), before.get("code", {})
    changed = sorted(k for k in set(now) | set(then) if now.get(k) != then.get(k))
    if changed:
        more = f" (and {len(changed) - 4} more)" if len(changed) > 4 else ""
        reasons.append(Reason(ReasonCode.CODE, ", ".join(c.removeprefix("kind:") for c in changed[:4]) + more))
    if parts.get("epoch") != before.get("epoch"):
        reasons.append(Reason(ReasonCode.CODE, f"kind epoch {before.get('epoch')} → {parts.get('epoch')}"))
    return reasons


def _shared_changes(shared: dict[str, Any], previous: StageLock) -> list[str]:
    """The recipe-wide fields whose values differ (``data.image_size: 8 → 16``)."""
    if previous.shared is None:  # a version 1 lockfile recorded only the digest of the values
        if digest_json(shared) == previous.shared_digest:
            return []
        return ["recipe-wide sections (the lockfile, written by an older zoo, records no field values)"]
    return _dict_changes(previous.shared, shared, "")


def _dict_changes(old: Any, new: Any, prefix: str) -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in sorted(set(old) | set(new)):
            out += _dict_changes(old.get(k, "<unset>"), new.get(k, "<unset>"), f"{prefix}.{k}" if prefix else k)
        return out
    if old != new:
        return [f"{prefix}: {_short(old)} → {_short(new)}"]
    return []


def _short(value: Any) -> str:
    text = repr(value) if not isinstance(value, str) else value
    return text if len(text) <= 40 else text[:37] + "..."

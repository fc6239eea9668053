"""The DAG: stage instances wired by `needs`, in a topological order.

Rules:
- without `needs`, a stage depends on the stage before it in file order;
- `needs: [a, b]` names stage ids (or one instance, ``quantize[cpu-int8]``);
- needing a matrix stage means all its instances (fan-in), except that an instance which shares
  a matrix axis with it needs only the instances with the same value on that axis.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field

from zoo.errors import PlanError
from zoo.engine.recipe import Instance, Recipe


@dataclass
class Node:
    """One stage instance in the DAG."""

    instance: Instance
    needs: list[str] = field(default_factory=list)
    cache_policy: str = "default"
    # what a Dask worker must offer to run it (recipe `resources:`); not part of the key
    resources: dict[str, float] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return self.instance.id

    @property
    def kind(self) -> str:
        return self.instance.kind


@dataclass
class Dag:
    """Stage instances in topological order (file order among independent ones)."""

    recipe: Recipe
    nodes: dict[str, Node]

    def order(self) -> list[str]:
        return list(self.nodes)

    def ancestors(self, stage_id: str) -> list[str]:
        """Every stage upstream of `stage_id` (transitively), in DAG order."""
        found: set[str] = set()
        frontier = list(self.nodes[stage_id].needs)
        while frontier:
            current = frontier.pop()
            if current not in found:
                found.add(current)
                frontier.extend(self.nodes[current].needs)
        return [nid for nid in self.nodes if nid in found]

    def select(self, names: list[str]) -> set[str]:
        """Instance ids for stage ids or instance ids (for --force / --stage); PlanError if unknown."""
        chosen: set[str] = set()
        for name in names:
            hits = [nid for nid, n in self.nodes.items() if nid == name or n.instance.base_id == name]
            if not hits:
                close = difflib.get_close_matches(name, list(self.nodes) + list(self.recipe.instances), n=1)
                raise PlanError(f"no stage called {name!r} in {self.recipe.path.name}",
                                hint=f"did you mean {close[0]!r}?" if close else f"stages: {', '.join(self.nodes)}")
            chosen.update(hits)
        return chosen


def build(recipe: Recipe) -> Dag:
    """Expand needs into instance edges, detect unknown needs and cycles, order topologically."""
    located = recipe.located
    base_ids = list(recipe.instances)
    all_instances = {inst.id: inst for insts in recipe.instances.values() for inst in insts}
    nodes: dict[str, Node] = {}
    for position, base_id in enumerate(base_ids):
        spec = recipe.spec.stages[base_id]
        if spec.needs is None:
            declared = [(0, base_ids[position - 1])] if position > 0 else []
        else:
            # each need once, with its first index (for errors): `needs: [a, a, …]` repeated
            # 100,000 times would otherwise cost instances x needs x targets
            first: dict[str, int] = {}
            for i, need in enumerate(spec.needs):
                first.setdefault(need, i)
            declared = [(i, need) for need, i in first.items()]
        for inst in recipe.instances[base_id]:
            needs: list[str] = []
            seen: set[str] = set()  # `needs` keeps declaration order; the set keeps adding linear
            for i, need in declared:
                if need in all_instances and need not in recipe.instances:
                    targets = [need]
                elif need in recipe.instances:
                    targets = _matched(inst, recipe.instances[need])
                else:
                    close = difflib.get_close_matches(need, base_ids + list(all_instances), n=1)
                    hint = f"did you mean {close[0]!r}?" if close else f"stages: {', '.join(base_ids)}"
                    raise located.error(("stages", base_id, "needs", i),
                                        f"stage {base_id!r} needs {need!r}, which is not a stage of this recipe",
                                        hint=hint)
                if base_id == need or inst.id in targets:
                    raise located.error(("stages", base_id, "needs", i), f"stage {base_id!r} needs itself",
                                        hint="remove it from its own `needs:`")
                for t in targets:
                    if t not in seen:
                        seen.add(t)
                        needs.append(t)
            nodes[inst.id] = Node(instance=inst, needs=needs, cache_policy=spec.cache,
                                 resources=dict(spec.resources))
    return Dag(recipe=recipe, nodes=_toposort(nodes, recipe))


def _matched(inst: Instance, upstream: list[Instance]) -> list[str]:
    """Instances of a needed stage that `inst` depends on: same value on shared axes, else all."""
    shared = [axis for axis in inst.matrix if upstream and axis in upstream[0].matrix]
    if not shared:
        return [u.id for u in upstream]
    return [u.id for u in upstream if all(u.matrix[a] == inst.matrix[a] for a in shared)]


def _toposort(nodes: dict[str, Node], recipe: Recipe) -> dict[str, Node]:
    """Kahn's algorithm in rounds, keeping file order among ready stages; PlanError naming a cycle.

    Each round takes every stage whose needs are all done, in file order (the order the
    quadratic version produced). Waiting counts and a dependents map keep it linear in the edges:
    a 1,000-stage recipe whose stages each need all earlier ones has 500,000 of them.
    """
    waiting = {nid: len(n.needs) for nid, n in nodes.items()}
    dependents: dict[str, list[str]] = {nid: [] for nid in nodes}
    for nid, n in nodes.items():
        for d in n.needs:
            dependents[d].append(nid)
    position = {nid: i for i, nid in enumerate(nodes)}
    done: dict[str, Node] = {}
    ready = [nid for nid, count in waiting.items() if count == 0]
    while ready:
        unlocked: list[str] = []
        for nid in ready:
            done[nid] = nodes[nid]
            for dep in dependents[nid]:
                waiting[dep] -= 1
                if waiting[dep] == 0:
                    unlocked.append(dep)
        ready = sorted(unlocked, key=position.__getitem__)
    if len(done) < len(nodes):
        remaining = {nid: n for nid, n in nodes.items() if nid not in done}
        cycle = _find_cycle(remaining)
        first = remaining[cycle[0]].instance.base_id
        raise recipe.located.error(("stages", first, "needs"),
                                   "the stages form a cycle: " + " → ".join(cycle + [cycle[0]]),
                                   hint="remove one of these `needs:` so the stages form a DAG")
    return done


def _find_cycle(nodes: dict[str, Node]) -> list[str]:
    """One cycle among `nodes` (each of which is blocked), as a list of ids."""
    start = next(iter(nodes))
    path: list[str] = []
    seen: dict[str, int] = {}
    current = start
    while current not in seen:
        seen[current] = len(path)
        path.append(current)
        current = next(d for d in nodes[current].needs if d in nodes)
    return path[seen[current]:]

"""A layered (Sugiyama-style) layout of a small DAG: every node gets a layer (its longest path from
a source) and a place in it; edges that span layers pass through placeholder nodes, and places are
ordered by barycentres to cut crossings. Pure data: `zoo.site.lineage` turns it into SVG."""

from __future__ import annotations

from dataclasses import dataclass

PLACEHOLDER = "\x00"  # prefix of the nodes an edge passes through between layers (never a stage id)
SWEEPS = 6


@dataclass
class Layered:
    """`layers`: node ids per layer, in drawing order (placeholders included); `chains`: per edge
    kept, the nodes it passes through, its ends included; `dropped`: edges left out because they
    closed a cycle (a lineage has none; the layout still draws one that does)."""

    layers: list[list[str]]
    chains: list[list[str]]
    dropped: list[tuple[str, str]]


def is_placeholder(node: str) -> bool:
    return node.startswith(PLACEHOLDER)


def layered(nodes: list[str], edges: list[tuple[str, str]]) -> Layered:
    """Lay out `nodes` (their order breaks ties) and `edges` (u, v: u before v)."""
    nodes = list(dict.fromkeys(nodes))
    known = set(nodes)
    edges = list(dict.fromkeys((u, v) for u, v in edges if u in known and v in known and u != v))
    kept, dropped = _without_cycles(nodes, edges)
    layer = _longest_path_layers(nodes, kept)
    layers: list[list[str]] = [[] for _ in range(max(layer.values(), default=-1) + 1)]
    for n in nodes:
        layers[layer[n]].append(n)
    chains = []
    for u, v in kept:
        chain = [u]
        for i in range(layer[u] + 1, layer[v]):
            dummy = f"{PLACEHOLDER}{u}\x00{v}\x00{i}"
            layers[i].append(dummy)
            chain.append(dummy)
        chains.append(chain + [v])
    _order(layers, chains)
    return Layered(layers, chains, dropped)


def _without_cycles(nodes: list[str], edges: list[tuple[str, str]]) -> tuple[list, list]:
    """The edges of a depth-first search that close no cycle, and those that do."""
    out: dict[str, list[str]] = {n: [] for n in nodes}
    for u, v in edges:
        out[u].append(v)
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    back: set[tuple[str, str]] = set()
    for root in nodes:
        if root in state:
            continue
        stack = [(root, iter(out[root]))]
        state[root] = 1
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                state[node] = 2
                stack.pop()
            elif state.get(child) == 1:
                back.add((node, child))
            elif child not in state:
                state[child] = 1
                stack.append((child, iter(out[child])))
    return [e for e in edges if e not in back], [e for e in edges if e in back]


def _longest_path_layers(nodes: list[str], edges: list[tuple[str, str]]) -> dict[str, int]:
    incoming: dict[str, list[str]] = {n: [] for n in nodes}
    for u, v in edges:
        incoming[v].append(u)
    layer: dict[str, int] = {}

    def depth(n: str) -> int:
        todo = [n]
        while todo:  # iterative: no recursion limit on a long chain
            top = todo[-1]
            missing = [u for u in incoming[top] if u not in layer]
            if missing:
                todo.extend(missing)
                continue
            layer[top] = max((layer[u] + 1 for u in incoming[top]), default=0)
            todo.pop()
        return layer[n]

    for n in nodes:
        depth(n)
    return layer


def _order(layers: list[list[str]], chains: list[list[str]]) -> None:
    """Reorder each layer in place by the mean place of its neighbours, sweeping down and up;
    the ordering with the fewest crossings wins."""
    up: dict[str, list[str]] = {}
    down: dict[str, list[str]] = {}
    for chain in chains:
        for a, b in zip(chain, chain[1:]):
            down.setdefault(a, []).append(b)
            up.setdefault(b, []).append(a)
    best = [list(layer) for layer in layers]
    best_crossings = crossings(layers, down)
    for sweep in range(SWEEPS):
        downward = sweep % 2 == 0
        indices = range(1, len(layers)) if downward else range(len(layers) - 2, -1, -1)
        for i in indices:
            ref = layers[i - 1] if downward else layers[i + 1]
            where = {n: k for k, n in enumerate(ref)}
            neighbours = up if downward else down

            def barycentre(node: str, k: int) -> float:
                places = [where[m] for m in neighbours.get(node, []) if m in where]
                return sum(places) / len(places) if places else float(k)

            keyed = [(barycentre(n, k), k, n) for k, n in enumerate(layers[i])]
            layers[i][:] = [n for _, _, n in sorted(keyed)]
        now = crossings(layers, down)
        if now < best_crossings:
            best, best_crossings = [list(layer) for layer in layers], now
    layers[:] = best


def crossings(layers: list[list[str]], down: dict[str, list[str]]) -> int:
    """How many pairs of edges between adjacent layers cross."""
    total = 0
    for upper, lower in zip(layers, layers[1:]):
        below = {n: k for k, n in enumerate(lower)}
        segments = [(i, below[m]) for i, n in enumerate(upper) for m in down.get(n, []) if m in below]
        for a in range(len(segments)):
            for b in range(a + 1, len(segments)):
                (a1, a2), (b1, b2) = segments[a], segments[b]
                total += (a1 - b1) * (a2 - b2) < 0
    return total

"""Put an ONNX graph's nodes in an order where every node comes after the nodes it reads from.

ONNX requires it (`onnx.checker`: "Nodes in a graph must be topologically sorted"), onnxruntime
does not, and tools that edit graphs in place do not always keep it: onnxruntime's float16
converter appends the Cast nodes it puts in front of the graph's inputs at the end of the node
list. `sort_graph` reorders such a graph (and every subgraph of an If, Loop or Scan, whose nodes
may also read names of the graphs around them) without changing anything else: among the nodes
that are ready, the one that came first goes first, so an already sorted graph keeps its order
and its bytes.
"""

from __future__ import annotations

import heapq
from typing import Any, Iterable


class CycleError(ValueError):
    """The graph has nodes that wait on one another (or on a name nothing produces)."""


def sort_graph(graph: Any, outer: Iterable[str] = ()) -> bool:
    """Reorder `graph.node` (an onnx.GraphProto, in place) and its subgraphs topologically.

    `outer`: names the enclosing graphs make available (for a subgraph). Returns whether any node
    moved; CycleError names the first node that can never run.
    """
    available = set(outer) | {v.name for v in graph.input} | {t.name for t in graph.initializer}
    available |= {t.name for t in graph.sparse_initializer}
    available.add("")  # an omitted optional input
    nodes = list(graph.node)
    moved = False
    for node in nodes:  # subgraphs first: their own order does not depend on where the node goes
        for attr in node.attribute:
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                moved |= sort_graph(sub, available | _all_outputs(nodes))
    order = _order(nodes, available)
    if order != list(range(len(nodes))):
        del graph.node[:]
        graph.node.extend(nodes[i] for i in order)
        moved = True
    return moved


def _order(nodes: list, available: set[str]) -> list[int]:
    """Indices of `nodes` in a topological order, the earliest ready node first (Kahn's algorithm)."""
    producer = {name: i for i, node in enumerate(nodes) for name in node.output if name}
    waiting: list[set[int]] = []
    readers: dict[int, list[int]] = {}
    for i, node in enumerate(nodes):
        needs = {producer[name] for name in _reads(node) if name not in available and name in producer}
        needs.discard(i)
        unknown = [name for name in _reads(node) if name not in available and name not in producer]
        if unknown:
            raise CycleError(f"node {node.name or node.op_type} (#{i}) reads {unknown[0]!r}, which no node, "
                             "input or initializer of the graph provides")
        waiting.append(needs)
        for p in needs:
            readers.setdefault(p, []).append(i)
    ready = [i for i, needs in enumerate(waiting) if not needs]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for r in readers.get(i, ()):
            waiting[r].discard(i)
            if not waiting[r]:
                heapq.heappush(ready, r)
    if len(order) != len(nodes):
        stuck = min(set(range(len(nodes))) - set(order))
        raise CycleError(f"node {nodes[stuck].name or nodes[stuck].op_type} (#{stuck}) is on a cycle: "
                         "the graph cannot be ordered")
    return order


def _reads(node: Any) -> list[str]:
    """The names `node` reads: its inputs and those its subgraphs read from outside themselves."""
    names = list(node.input)
    for attr in node.attribute:
        for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
            names += sorted(_outer_reads(sub))
    return names


def _outer_reads(graph: Any) -> set[str]:
    """Names a subgraph reads that it does not define itself (the enclosing graphs' values)."""
    defined = {v.name for v in graph.input} | {t.name for t in graph.initializer} | {""}
    defined |= {t.name for t in graph.sparse_initializer} | _all_outputs(graph.node)
    return {name for node in graph.node for name in _reads(node) if name not in defined}


def _all_outputs(nodes: Iterable[Any]) -> set[str]:
    return {name for node in nodes for name in node.output if name}

"""The dependency graph of a program: params, clocks, regions and stages as one networkx DiGraph.

Nodes are `(kind, name)` tuples, kind in {param, clock, region, stage}. Edges point from what a
thing depends on to the thing: a param to the clocks and regions it sizes, a clock to the clocks
derived from it, to the regions on it and to the stages firing on it, a region to the stages that
read it, a stage to the regions it writes. Edge attribute `role` says which (`sizes`, `derives`,
`advances`, `fires`, `read`, `update`, `write`); read/write edges also carry the access. The
interpreter orders stages with it and the renderer draws it.
"""

from __future__ import annotations

import networkx as nx

from duplexcadence.dsl.program import Program


def build(program: Program) -> nx.DiGraph[tuple[str, str]]:
    graph: nx.DiGraph[tuple[str, str]] = nx.DiGraph()
    for name in sorted(program.params):
        graph.add_node(("param", name), kind="param")
    for name, clock in sorted(program.clocks.items()):
        graph.add_node(("clock", name), kind="clock", rate=clock.rate)
        for used in clock.uses:
            if used in program.clocks:
                graph.add_edge(("clock", used), ("clock", name), role="derives")
            elif used in program.params:
                graph.add_edge(("param", used), ("clock", name), role="sizes")
    for name, region in sorted(program.regions.items()):
        graph.add_node(("region", name), kind="region", family=region.family)
        if region.clock is not None:  # a fixed region advances on no clock
            graph.add_edge(("clock", region.clock), ("region", name), role="advances")
        for used in region.uses:
            if used in program.params:
                graph.add_edge(("param", used), ("region", name), role="sizes")
    for name, stage in sorted(program.stages.items()):
        graph.add_node(("stage", name), kind="stage")
        graph.add_edge(("clock", stage.clock), ("stage", name), role="fires")
        for access in stage.accesses:
            if access.kind == "read":
                graph.add_edge(("region", access.region), ("stage", name), role="read", access=access)
            else:
                graph.add_edge(("stage", name), ("region", access.region), role=access.kind, access=access)
    return graph


def instant_graph(program: Program) -> nx.DiGraph[str]:
    """Stages only: an edge A -> B when B reads (without `prev`) a region that A writes or updates.

    A topological order of this graph is the order of stages within one instant.
    """
    writers: dict[str, list[str]] = {}
    for name, stage in program.stages.items():
        for access in stage.writes():
            writers.setdefault(access.region, []).append(name)
    graph: nx.DiGraph[str] = nx.DiGraph()
    graph.add_nodes_from(sorted(program.stages))
    for name, stage in sorted(program.stages.items()):
        for access in stage.accesses:
            if access.kind != "read" or access.prev:
                continue
            for writer in writers.get(access.region, []):
                if writer != name:
                    graph.add_edge(writer, name, region=access.region, span=access.span)
    return graph


def stage_order(program: Program) -> list[str]:
    """Stages in dataflow order (ties broken by name, so the order is deterministic)."""
    return list(nx.lexicographical_topological_sort(instant_graph(program)))

"""Pass 0, pruning: the stages whose work no output sees, and the state only they touch.

What a program is for is what `step()` returns: its output regions. From them the dependency graph
(dsl/depgraph.py) is walked backwards to a fixpoint:

* a region is *observed* when it is an output, or when a kept stage reads it (`read`, `read prev` or
  `update`);
* a stage is *kept* when it writes or updates an observed region;
* a stage that draws random numbers (`rng`) is kept while any kept stage draws too: a session's stages
  draw from one generator state, in firing order, so leaving one out would change the numbers every
  later draw of the others gets. When no kept stage draws, the unobserved ones are pruned like any other.

Every other stage is *unobserved*. With pruning on (the default) the unobserved stages are pruned, and so
is every region that only pruned stages touch: the later passes plan the program without them, so they
never fire, have no graph and no arena bytes. An input that only pruned stages read is pruned too
(`step()` takes it and ignores it). A program without an output region prunes nothing: its state, read
through `Session.region`, is all it is for.

With pruning off (`dsl plan --no-prune`, `Runtime.load(..., prune=False)`) the unobserved stages are still
listed, and every stage runs.
"""

from __future__ import annotations

import attrs
import networkx as nx

from duplexcadence.dsl import depgraph
from duplexcadence.dsl.program import Program


@attrs.frozen
class PrunedStage:
    """An unobserved stage and why: `reason` says where its writes go."""

    name: str
    reason: str


@attrs.frozen
class PrunedRegion:
    """A region that only pruned stages touch (`stages`)."""

    name: str
    stages: tuple[str, ...]
    input: bool

    @property
    def reason(self) -> str:
        verb = "read" if self.input else "touched"
        return f"{verb} only by pruned {_stages(self.stages)}"


@attrs.frozen
class KeptStage:
    """A stage no output sees that still runs, and why."""

    name: str
    reason: str


@attrs.frozen
class Pruning:
    """The pruning of one program.

    `enabled`: whether the unobserved stages are left out; `unobserved`: every stage no output sees (in the
    program's stage order), pruned or not; `stages` and `regions`: what is left out (empty when pruning is
    off); `kept`: unobserved stages that run anyway (an `rng` stage); `note`: why nothing is pruned, when a
    rule of the pass says so. `source` is the program as checked; `program`, what the later passes plan.
    """

    enabled: bool
    unobserved: tuple[PrunedStage, ...]
    stages: tuple[PrunedStage, ...]
    regions: tuple[PrunedRegion, ...]
    kept: tuple[KeptStage, ...]
    note: str | None
    source: Program = attrs.field(repr=False, eq=False)
    program: Program = attrs.field(repr=False, eq=False)

    @property
    def stage_names(self) -> frozenset[str]:
        return frozenset(stage.name for stage in self.stages)

    @property
    def region_names(self) -> frozenset[str]:
        return frozenset(region.name for region in self.regions)

    def reason_for(self, name: str) -> str | None:
        """Why stage or region `name` is pruned (None: it is not)."""
        pruned: tuple[PrunedStage | PrunedRegion, ...] = (*self.stages, *self.regions)
        for item in pruned:
            if item.name == name:
                return item.reason
        return None


NO_OUTPUT = "the program declares no output region: every stage's state may be what it is read for"


def _stages(names: tuple[str, ...] | list[str]) -> str:
    quoted = ", ".join(f"'{name}'" for name in names)
    return f"stage {quoted}" if len(names) == 1 else f"stages {quoted}"


def _keep_from(graph: nx.DiGraph, program: Program, regions: set[str], stages: set[str]) -> set[str]:
    """The stages kept when the regions `regions` are observed and the stages `stages` kept: the writers
    of an observed region, and what a kept stage reads (or updates), to a fixpoint."""
    kept: set[str] = set()
    observed: set[str] = set()
    frontier = sorted(regions)

    def keep(stage: str) -> None:
        kept.add(stage)
        frontier.extend(access.region for access in program.stages[stage].reads())

    for stage in sorted(stages):
        keep(stage)
    while frontier:
        region = frontier.pop()
        if region in observed:
            continue
        observed.add(region)
        for writer, _, edge in graph.in_edges(("region", region), data=True):
            if writer[0] == "stage" and edge["role"] in ("write", "update") and writer[1] not in kept:
                keep(writer[1])
    return kept


def _unobserved_reason(program: Program, name: str, readers_of: dict[str, set[str]]) -> str:
    """Why no output sees stage `name`: where its writes go (`readers_of`: region -> the stages reading it)."""
    stage = program.stages[name]
    written = {access.region for access in stage.writes()}
    if not written:
        reason = "writes no region"
    else:
        readers = sorted(set().union(*(readers_of.get(region, set()) for region in written)) - {name})
        if readers:
            verb = "reads" if len(readers) == 1 else "read"
            reason = f"no output, and only unobserved {_stages(readers)} {verb} what it writes"
        else:
            reason = "no output, and no other stage reads what it writes"
    if stage.rng:
        reason += "; it draws random numbers, and no kept stage does"
    return reason


def prune_unobserved(program: Program, enabled: bool = True) -> Pruning:
    """Pass 0: the unobserved stages, and with `enabled` the program without them and the regions only
    they touch (see the module docstring)."""
    outputs = {name for name, region in program.regions.items() if region.role == "output"}
    if not outputs:
        return Pruning(enabled, (), (), (), (), NO_OUTPUT, program, program)
    graph = program.graph if program.graph is not None else depgraph.build(program)
    kept = _keep_from(graph, program, outputs, set())
    kept_for_rng: list[KeptStage] = []
    drawing = sorted(name for name in kept if program.stages[name].rng)
    if drawing:
        unobserved_drawing = [name for name, stage in program.stages.items() if stage.rng and name not in kept]
        for name in unobserved_drawing:
            kept_for_rng.append(
                KeptStage(
                    name,
                    f"no output sees it, but it draws random numbers, as kept {_stages(drawing)} "
                    f"{'does' if len(drawing) == 1 else 'do'}: the session's stages share one generator "
                    "state, so leaving it out would change their numbers",
                )
            )
        if unobserved_drawing:
            kept = _keep_from(graph, program, outputs, set(unobserved_drawing))
    readers_of: dict[str, set[str]] = {}
    for name, stage in program.stages.items():
        for access in stage.reads():
            readers_of.setdefault(access.region, set()).add(name)
    order = depgraph.stage_order(program)
    unobserved = tuple(
        PrunedStage(name, _unobserved_reason(program, name, readers_of)) for name in order if name not in kept
    )
    if not enabled or not unobserved:
        return Pruning(enabled, unobserved, (), (), tuple(kept_for_rng), None, program, program)
    pruned_names = {stage.name for stage in unobserved}
    touched_by: dict[str, set[str]] = {}
    for name, stage in program.stages.items():
        for access in stage.accesses:
            touched_by.setdefault(access.region, set()).add(name)
    regions = tuple(
        PrunedRegion(name, tuple(sorted(touched_by[name])), program.regions[name].role == "input")
        for name in program.regions
        if name in touched_by and touched_by[name] <= pruned_names
    )
    dropped = {region.name for region in regions}
    kept_regions = {name: region for name, region in program.regions.items() if name not in dropped}
    families = {
        family: tuple(member for member in members if member not in dropped)
        for family, members in program.families.items()
        if any(member not in dropped for member in members)
    }
    kept_program = attrs.evolve(  # its graph is still the checked program's: built again below
        program,
        stages={name: stage for name, stage in program.stages.items() if name not in pruned_names},
        regions=kept_regions,
        families=families,
    )
    effective = attrs.evolve(kept_program, graph=depgraph.build(kept_program))
    return Pruning(True, unobserved, unobserved, regions, tuple(kept_for_rng), None, program, effective)

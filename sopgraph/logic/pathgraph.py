"""The stage graph with compiled branch regions: what path counting, listing, sampling and the flow
analysis walk (`RegionGraph`). Split from `paths` (which builds `Explorer` on it) along the seam between the
graph's static structure and memoised children, and what is computed over paths."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sopgraph.language import ir
from sopgraph.logic.domain import REGION_CAP, Box, Space, space_for
from sopgraph.logic.formula import Formula

Region = tuple[Box, ...]
Child = tuple[int, str, Any, Region, bool]  # (branch, "stage" | "action", target, child region, undecided)


class RegionGraph:
    """The stage graph as the path analyses walk it: compiled branch formulas, the variables still read
    from each stage on (`live`), the stages on cycles, and the feasible children of a stage under a region
    (memoised). `paths.Explorer` counts, lists and samples paths over it."""

    def __init__(self, scenario: ir.Scenario):
        self.scenario = scenario
        self.sp: Space = space_for(scenario)
        self.ids: list[str] = list(scenario.stages)
        self.idx: dict[str, int] = {sid: i for i, sid in enumerate(self.ids)}
        self.stage_objs: list[ir.Stage] = [scenario.stages[s] for s in self.ids]
        self.start: int | None = self.idx.get(scenario.start or "")
        self._fire: dict[tuple[int, int], Formula] = {}
        self.targets: list[list[tuple[str, Any]]] = []
        for st in self.stage_objs:
            row: list[tuple[str, Any]] = []
            for br in st.branches:
                t = br.target
                if t.kind == "action":
                    row.append(("action", t.action))
                else:
                    row.append(("stage", self.idx.get(t.stage or "", -1)))
            self.targets.append(row)
        self._guards: dict[int, list[tuple[Formula, Formula] | None]] = {}
        self._compute_live()
        self._compute_cycles()
        self._labels: dict[int, list[str]] = {}
        self._children: dict[tuple[int, Region], tuple[Child, ...]] = {}
        self._proj: dict[tuple[Box, int], Box] = {}
        self.uncertain = False  # sticky: set whenever an undecided child was met

    # -- static structure ------------------------------------------------------------------------

    def guards(self, si: int) -> list[tuple[Formula, Formula] | None]:
        """Per branch of stage si: (guard true, guard false) formulas, None for `otherwise`."""
        g = self._guards.get(si)
        if g is None:
            sp = self.sp
            g = [None if br.guard is None else (sp.formula(br.guard, True), sp.formula(br.guard, False))
                 for br in self.stage_objs[si].branches]
            self._guards[si] = g
        return g

    def label(self, si: int, bi: int) -> str:
        row = self._labels.get(si)
        if row is None:
            st = self.stage_objs[si]
            row = [ir.branch_label(st, br) for br in st.branches]
            self._labels[si] = row
        return row[bi]

    def fire(self, si: int, bi: int) -> Formula:
        key = (si, bi)
        f = self._fire.get(key)
        if f is None:
            f = self.sp.fire_formula(self.stage_objs[si], bi)
            self._fire[key] = f
        return f

    def _compute_live(self) -> None:
        sp = self.sp
        n = len(self.ids)
        reads: list[frozenset[int]] = []
        for st in self.stage_objs:
            r: set[int] = set()
            for br in st.branches:
                if br.guard is not None:
                    r.update(sp.base_reads(br.guard))
            reads.append(frozenset(r))
        preds: list[list[int]] = [[] for _ in range(n)]
        for si, row in enumerate(self.targets):
            for kind, t in row:
                if kind == "stage" and t >= 0:
                    preds[t].append(si)
        live: list[set[int]] = [set(r) for r in reads]
        work = list(range(n))
        on = [True] * n
        while work:
            t = work.pop()
            on[t] = False
            for p in preds[t]:
                before = len(live[p])
                live[p] |= live[t]
                if len(live[p]) != before and not on[p]:
                    on[p] = True
                    work.append(p)
        self.live: list[frozenset[int]] = [frozenset(s) for s in live]

    def _compute_cycles(self) -> None:
        """Stages on a cycle (Tarjan, iterative)."""
        n = len(self.ids)
        succ = [[t for kind, t in row if kind == "stage" and t >= 0] for row in self.targets]
        index = [-1] * n
        low = [0] * n
        on_stack = [False] * n
        stack: list[int] = []
        cyclic: set[int] = set()
        counter = 0
        for root in range(n):
            if index[root] >= 0:
                continue
            work = [(root, 0)]
            while work:
                v, pi = work.pop()
                if pi == 0:
                    index[v] = low[v] = counter
                    counter += 1
                    stack.append(v)
                    on_stack[v] = True
                recurse = False
                for k in range(pi, len(succ[v])):
                    w = succ[v][k]
                    if index[w] < 0:
                        work.append((v, k + 1))
                        work.append((w, 0))
                        recurse = True
                        break
                    if on_stack[w]:
                        low[v] = min(low[v], index[w])
                if recurse:
                    continue
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack[w] = False
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1 or v in succ[v]:
                        cyclic.update(comp)
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[v])
        self.cyclic: frozenset[int] = frozenset(cyclic)

    # -- regions ---------------------------------------------------------------------------------

    def project(self, box: Box, si: int) -> Box:
        key = (box, si)
        p = self._proj.get(key)
        if p is None:
            p = self.sp.project(box, self.live[si])
            self._proj[key] = p
        return p

    def root_region(self) -> Region:
        if self.start is None:
            return ()
        return (self.project(self.sp.full, self.start),)

    def children(self, si: int, region: Region) -> tuple[Child, ...]:
        """Feasible (not proven empty) branches of stage `si` under `region`, in order."""
        key = (si, region)
        hit = self._children.get(key)
        if hit is not None:
            return hit
        return self._compute_children(key, si, region)

    def _compute_children(self, key: tuple[int, Region], si: int, region: Region) -> tuple[Child, ...]:
        sp = self.sp
        out: list[Child] = []
        targets = self.targets[si]
        guards = self.guards(si)
        rest: Sequence[Box] = region
        for bi in range(len(targets)):
            if not rest:
                break
            g = guards[bi]
            if g is None:
                boxes = list(rest)
                rest = ()
            else:
                gt, gf = g
                boxes = []
                nrest: list[Box] = []
                for b in rest:
                    boxes.extend(sp.split(b, gt))
                    nrest.extend(sp.split(b, gf))
                    if len(boxes) + len(nrest) > REGION_CAP:  # each kept as a literal on every box
                        boxes = [b3 for b2 in rest for b3 in sp.add_literal(b2, gt)]
                        nrest = [b3 for b2 in rest for b3 in sp.add_literal(b2, gf)]
                        break
                rest = nrest
            if not boxes:
                continue
            uncertain = False
            kept: list[Box] = []
            for b in boxes:
                if b.resid:
                    s = sp.decide(b)
                    if s is False:
                        continue
                    if s is None:
                        uncertain = True
                kept.append(b)
            if not kept:
                continue
            kind, tgt = targets[bi]
            if kind == "stage":
                if tgt < 0:
                    continue
                child = sp.normalize([self.project(b, tgt) for b in kept])
            else:
                child = sp.normalize(kept)
            if uncertain:
                self.uncertain = True
            out.append((bi, kind, tgt, child, uncertain))
        res = tuple(out)
        if len(self._children) > 1_000_000:
            self._children.clear()
        self._children[key] = res
        return res

    def next_visited(self, si: int, vk: frozenset[int]) -> frozenset[int]:
        return vk | {si} if si in self.cyclic else vk

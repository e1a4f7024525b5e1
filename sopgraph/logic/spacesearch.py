"""The witness search of a constraint space: deciding boxes (members found by search or by the solver),
picking values. The layer above `spacecore` (see there)."""

from __future__ import annotations

import random
from collections.abc import Iterable
from typing import Any

from sopgraph.language import ir, scalars
from sopgraph.logic import diffbound, solver
from sopgraph.logic.budget import check_active
from sopgraph.logic.formula import Formula
from sopgraph.logic.guards import NEGATED_OP
from sopgraph.logic.intervals import (  # re-exported: NumDom and the num_* operations are the domain's API
    NO_POINTS,
    NO_VALUE,
    NumDom,
    num_meet,
)
from sopgraph.logic.scalardom import (
    DAY,
    to_input,
    typical,
)
from sopgraph.logic.spacecore import (
    CANONICAL_OP,
    QUICK_COMBOS,
    REFUTED_COMBOS,
    SEARCH_COMBOS,
    SOLVER_FIRST_VARS,
    Box,
    one_call,
    strict_reads,
)
from sopgraph.logic.spacepick import SpacePick

MEMBERS_KEPT = 16


class SpaceSearch(SpacePick):
    """Feasibility of boxes and their witnesses: a member found by search, or by the solver (`solver`)."""

    def lit_text(self, rid: int, truth: bool) -> str:
        """A residual literal as text: as first written with this truth, else a false difference literal
        or comparison as its complement (`A >= B`), not `not (…)`."""
        shown = self._res_shown.get((rid, truth))
        if shown is not None:
            return shown
        if truth:
            return self.res_text[rid]
        pqk = self.diffs.get(rid)
        if pqk is not None:
            p, q, k = pqk
            return self._diff_text(q, p, -k - 1)
        expr = self.res_exprs[rid]
        if isinstance(expr, ir.Compare) and expr.op in CANONICAL_OP:
            return f"{ir.show(expr.left)} {NEGATED_OP[expr.op]} {ir.show(expr.right)}"
        text = self.res_text[rid]
        return f"not {text}" if one_call(text) else f"not ({text})"

    def _var(self, i: int) -> ir.Var:
        return ir.Var.model_construct(kind="var", name=self.names[i], span=ir.NO_SPAN)

    def _diff_text(self, p: int, q: int, k: int) -> str:
        """`x_p - x_q <= k` as people write it: `BookedAt > now - 24 hours` rather than in seconds."""
        timed = p in self.time_kinds or q in self.time_kinds
        if k == -1 or (timed and (k + 1) % 60 == 0 and k % 60) or (not timed and abs(k + 1) < abs(k)):
            # a strict bound reads rounder: `Amount > Limit`, `BookedAt > now - 1 day`
            lhs, op, rhs, off = self.names[q], ">", self.names[p], -(k + 1)
        else:
            lhs, op, rhs, off = self.names[p], "<=", self.names[q], k
        if off == 0:
            return f"{lhs} {op} {rhs}"
        amount = scalars.format_duration(abs(off)) if timed else str(abs(off))
        return f"{lhs} {op} {rhs} {'+' if off > 0 else '-'} {amount}"

    def note_undecided(self, box: Box) -> None:
        """Count a feasibility question left open and remember (the first few of) its conditions, so
        the I302 that reports it can say which question it was."""
        self.undecided += 1
        if len(self.undecided_texts) < 5:
            text = " and ".join(f"`{self.lit_text(rid, truth)}`" for rid, truth in sorted(box.resid))
            text = text if len(text) <= 200 else text[:197] + "..."
            if text not in self.undecided_texts:
                self.undecided_texts.append(text)

    def decide(self, box: Box) -> bool | None:
        """True: a member exists; False: proven empty; None: undecided."""
        if not box.resid:
            return True
        hit = self._decided.get(box)
        if hit is None:
            check_active()  # an analysis past its CPU budget stops before a new question (see `budget`)
            # decided without a search or a solver query where a member found earlier, or the box's own pick,
            # is in it (one query per box on a list of records was most of the analysis' time); the witness
            # itself is computed as before, when one is asked for
            if any(self.box_contains(box, w) for w in reversed(self._members)):
                hit = (True, None)
            else:
                quick = self._decide_by_pick(box)
                if quick is not None:
                    hit = (quick[0], None)  # the member is not kept: the witness asked for later is the search's
                    self._remember(quick[1])
                else:
                    w, exhaustive = self._search_or_solve(box, "boundary", None)
                    hit = (True if w is not None else (False if exhaustive else None), w)
                    self._remember(w)
            self._decided[box] = hit
        return hit[0]

    def _remember(self, member: dict | None) -> None:
        """Keep the latest members found (`MEMBERS_KEPT`): the region of the next stage is mostly the same box
        with one more condition, which a member of the last one often meets (no solver query then)."""
        if member is not None:
            self._members.append(member)
            del self._members[:-MEMBERS_KEPT]

    def _decide_by_pick(self, box: Box) -> tuple[bool | None, dict | None] | None:
        """(True, member) when the box's boundary pick (one value per variable, no search) satisfies its
        residuals, or does once the residual groups it fails are answered as `_solve_groups` answers them
        (memoised); (False, None) or (None, None) when such a group is proven empty or stays undecided (counted
        there, once); None when the usual search must decide."""
        w = self.pick_all(box, "boundary", None)
        if w is None:
            return None
        if self.box_contains(box, w):
            return True, w
        groups = self._resid_groups(box)
        if len(groups) < 2 or self._reads_missing(box):
            return None
        for lits in groups:
            if all(self.eval_resid(rid, truth, w) for rid, truth in lits):
                continue
            found, exhaustive = self._decide_group(box, lits, "boundary", None)
            if found is None:
                return (False if exhaustive else None), None
            w.update(found)
        return (True, w) if self.box_contains(box, w) else None

    def decide_region(self, region: Iterable[Box]) -> bool | None:
        status: bool | None = False
        for b in region:
            s = self.decide(b)
            if s:
                return True
            if s is None:
                status = None
        return status

    def witness(self, box: Box, style: str = "representative",
                rng: random.Random | None = None) -> dict[str, Any] | None:
        """A member of the box in the engine's input form (dates and durations as text)."""
        w = self._witness(box, style, rng)
        if w is not None and not self.box_contains(box, w):  # defensive: never hand out a non-member
            return None
        return to_input(self.time_names, w) if w is not None and self.time_names else w

    def _witness(self, box: Box, style: str, rng: random.Random | None) -> dict[str, Any] | None:
        if not box.resid:
            return self.pick_all(box, style, rng)
        if style == "boundary" and rng is None:
            self.decide(box)
            hit = self._decided.get(box)
            if hit is not None and hit[1] is not None:
                return dict(hit[1])
            if hit is not None and hit[0] is True:  # decided by its pick (`decide`): the witness is looked for now
                check_active()
                open_before, texts_before = self.undecided, list(self.undecided_texts)
                w, _ = self._search_or_solve(box, style, rng)
                if w is None:  # the pick (with its groups' answers, memoised) is a member: the question is not open
                    self.undecided, self.undecided_texts = open_before, texts_before
                    quick = self._decide_by_pick(box)
                    w = quick[1] if quick is not None else None
                self._decided[box] = (True, w)
                return dict(w) if w is not None else None
        check_active()
        w, _ = self._search_or_solve(box, style, rng)
        return w

    def _search_or_solve(self, box: Box, style: str, rng: random.Random | None) -> tuple[dict | None, bool]:
        """Witness search and the SMT solver (`solver`): the search first when the residuals read
        few variables (cheap, and it varies witnesses), the solver first when they read many (the
        search's few thousand candidates would be a needle-in-a-haystack guess). A solver model is
        kept only if the reference interpreter confirms it. Residuals that share no variable are
        decided one group at a time (`_solve_groups`)."""
        if self._reads_missing(box):
            return None, True
        groups = self._resid_groups(box)
        if len(groups) > 1:
            return self._solve_groups(box, groups, style, rng)
        if any(rid in self.diffs for rid, _t in box.resid):
            verdict, w = self._solve_diffs(box, style, rng)
            if verdict == "empty":
                return None, True
            if w is not None:
                return w, False
        rvars = {v for rid, _t in box.resid for v in self.res_vars[rid]}
        solver_first = len(rvars) > SOLVER_FIRST_VARS
        # without a random source (a question, not a sample) the search gets a short go before the solver: on
        # an empty box it tried every candidate in vain (0.3 s each on a sum of order-line prices) where the
        # solver refutes it in milliseconds; the rest of its candidates come after the solver
        quick = rng is None and not solver_first
        if not solver_first:
            w, exhaustive = self._search(box, style, rng, QUICK_COMBOS if quick else SEARCH_COMBOS)
            if w is not None or exhaustive:
                return w, exhaustive
        model, empty = solver.solve(self, box)
        if model is not None and self.box_contains(box, model):
            return self._near_reference(box, model), False
        if empty:
            return None, True
        if solver_first or quick:  # after an inexact refutation only a short search (for a rounding witness)
            w, exhaustive = self._search(box, style, rng, REFUTED_COMBOS if empty is None and solver_first
                                         else SEARCH_COMBOS)
            if w is not None or exhaustive:
                return w, exhaustive
        self.note_undecided(box)
        return None, False

    def _near_reference(self, box: Box, model: dict[str, Any]) -> dict[str, Any]:
        """The solver leaves a moment nothing pins at 0, which reads as 1970 (`LostAt=1970-01-01`, and
        an item "at 1969-12-31T23:59:59" just before it). Comparisons between moments only see their
        differences: moved together by whole days so that the latest sits at the reference moment, the
        model usually still holds; that one is kept, else the model as it was."""
        solved = {v for rid, _t in box.resid for v in self.res_vars[rid]}  # the rest was picked, not solved
        moments = [self.names[i] for i, kind in self.time_kinds.items() if kind != "duration" and i in solved
                   and isinstance(model.get(self.names[i]), int) and not isinstance(model.get(self.names[i]), bool)]
        if not moments:
            return model
        latest = max(model[n] for n in moments)
        shift = (typical("date") - latest) // DAY * DAY
        if abs(shift) < 365 * DAY:  # already near the reference
            return model
        moved = {**model, **{n: model[n] + shift for n in moments}}
        return moved if self.box_contains(box, moved) else model

    def _reads_missing(self, box: Box) -> bool:
        """True when the box says `missing(X)` and another of its residuals always reads `X`: the engine
        refuses every such assignment, so the box is empty. (The search cannot show it, since the other
        variables of that residual have unbounded candidates, and the solver does not model absence.)"""
        absent: set[str] = set()
        for rid, truth in box.resid:
            pred = self.res_exprs[rid]
            if truth and isinstance(pred, ir.Func) and pred.name == "missing" and isinstance(pred.args[0], ir.Var):
                absent.add(pred.args[0].name)
        if not absent:
            return False
        for rid, _truth in box.resid:
            pred = self.res_exprs[rid]
            if isinstance(pred, Formula) or (isinstance(pred, ir.Func) and pred.name == "missing"):
                continue
            if not absent.isdisjoint(self._strict(pred)):
                return True
        return False

    def _strict(self, expr: Any) -> frozenset[str]:
        hit = self._strict_reads.get(id(expr))
        if hit is None or hit[0] is not expr:
            hit = (expr, strict_reads(self.scenario, expr))
            self._strict_reads[id(expr)] = hit
        return hit[1]

    def _resid_groups(self, box: Box) -> list[frozenset]:
        """The box's residual literals split into groups that read disjoint sets of variables."""
        res_vars = self.res_vars
        groups: list[tuple[set[int], list]] = []
        for lit in sorted(box.resid):
            reads = set(res_vars[lit[0]])
            joined = [g for g in groups if g[0] & reads]
            if not joined:
                groups.append((reads, [lit]))
                continue
            first = joined[0]
            first[0].update(reads)
            first[1].append(lit)
            for g in joined[1:]:
                first[0].update(g[0])
                first[1].extend(g[1])
                groups.remove(g)
        return [frozenset(lits) for _reads, lits in groups]

    def _solve_groups(self, box: Box, groups: list[frozenset], style: str,
                      rng: random.Random | None) -> tuple[dict | None, bool]:
        """Independent residual groups (e.g. a score over some inputs, a pattern on a text, a date
        window) decided one by one: the box has a member iff every group does, and the members of
        the groups combine, since no two read the same variable. Searching them together would
        multiply their candidate lists (and the solver gives up on the whole when one part is a
        construct it does not model)."""
        merged = self.pick_all(box, style, rng)
        if merged is None:
            return None, False
        for lits in groups:
            w, exhaustive = self._decide_group(box, lits, style, rng)
            if w is None:
                return None, exhaustive  # one empty group empties the box; an undecided one was counted
            merged.update(w)
        if not all(self.eval_resid(rid, truth, merged) for rid, truth in box.resid):
            self.note_undecided(box)  # defensive: groups that do not combine (a read the split did not see)
            return None, False
        return merged, False

    def _decide_group(self, box: Box, lits: frozenset, style: str,
                      rng: random.Random | None) -> tuple[dict | None, bool]:
        """One group of `_solve_groups`: the values of the variables it reads, and whether its search was
        exhaustive. Without a random source that is a function of the literals and of those variables'
        domains alone, so it is memoised on them: boxes that differ elsewhere (another order line's
        flags) ask the same group again, and on a list of records five of six group questions repeat.
        A repeat of an undecided question is counted again, as a fresh search would."""
        reads = sorted({v for rid, _t in lits for v in self.res_vars[rid]})
        key = (lits, tuple(box.doms[i] for i in reads), style) if rng is None else None
        hit = self._groups.get(key) if key is not None else None
        sub = self.box(box.doms, lits)
        if hit is not None:
            for _ in range(hit[2]):
                self.note_undecided(sub)
            return (dict(hit[0]) if hit[0] is not None else None), hit[1]
        open_before = self.undecided
        w, exhaustive = self._search_or_solve(sub, style, rng)
        found = {self.names[i]: w[self.names[i]] for i in reads} if w is not None else None
        if key is not None:
            if len(self._groups) >= 200_000:
                self._groups.clear()
            self._groups[key] = (found, exhaustive, self.undecided - open_before)
        return (dict(found) if found is not None else None), exhaustive

    def _solve_diffs(self, box: Box, style: str, rng: random.Random | None) -> tuple[str, dict | None]:
        """The box's difference literals as one difference-bound system (`diffbound`): "empty" is exact;
        a member is returned when every residual is a difference literal (else the system's solution
        only seeds nothing and the caller searches)."""
        cons: list[tuple[int, int, int]] = []
        for rid, truth in box.resid:
            pqk = self.diffs.get(rid)
            if pqk is not None:
                p, q, k = pqk
                cons.append((p, q, k) if truth else (q, p, -k - 1))
        involved = {v for p, q, _k in cons for v in (p, q)}
        bounds: dict[int, tuple[float, float]] = {}
        for i in involved:
            d = box.doms[i]
            lo = d.lo + 1 if d.lo_open else d.lo  # ints: closed already; kept general
            hi = d.hi - 1 if d.hi_open else d.hi
            bounds[i] = (lo, hi)

        def pick(i: int, lo: float, hi: float) -> Any:
            d = num_meet(box.doms[i], NumDom(lo, hi, False, False, NO_POINTS), True)
            if d is None:
                return None
            x = self.pick(i, d, style, rng)
            return None if x is NO_VALUE else x

        verdict, values = diffbound.solve(involved, cons, bounds, self.dates & involved, pick)
        if verdict != "sat" or values is None or len(cons) != len(box.resid):
            return verdict, None
        w = self.pick_all(box, style, rng)
        if w is None:
            return "unknown", None
        for i, x in values.items():
            w[self.names[i]] = x
        return ("sat", w) if self.box_contains(box, w) else ("unknown", None)

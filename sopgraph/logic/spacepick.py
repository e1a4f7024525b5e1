"""Values of a constraint space's variables: one pick per variable (`pick_all`), the candidates the witness
search tries, and that search (every combination of the candidates, up to a limit). The layer between `spacecore`
(boxes, domains) and `spacesearch` (deciding boxes with it and the solver)."""

from __future__ import annotations

import copy
import itertools
import math
import random
from typing import Any

from sopgraph.logic.formula import Formula
from sopgraph.logic.intervals import NO_VALUE, pick_num
from sopgraph.logic.scalardom import pick_time, string_candidates, time_candidates
from sopgraph.logic.spacecore import INF, SEARCH_COMBOS, Box, SpaceCore, numeric_consts


class SpacePick(SpaceCore):
    """Picks and candidate values per variable, and the exhaustive-up-to-a-limit witness search over them."""

    def _finite_values(self, i: int, d: Any, limit: int) -> list | None:
        k = self.kinds[i]
        if k == "enum" or k == "bool":
            return self.dom_values(i, d)
        if k == "int" and d.lo != -INF and d.hi != INF and d.hi - d.lo < limit:
            return [x for x in range(int(d.lo), int(d.hi) + 1) if x not in d.excl]
        if k == "float" and d.lo == d.hi:
            return [d.lo]
        return None

    def pick_all(self, box: Box, style: str, rng: random.Random | None) -> dict[str, Any] | None:
        out: dict[str, Any] = {}
        for i, n in enumerate(self.names):
            v = self.pick(i, box.doms[i], style, rng)
            if v is NO_VALUE:
                return None
            out[n] = v
        return out

    def pick(self, i: int, d: Any, style: str, rng: random.Random | None) -> Any:
        if i in self.time_kinds:
            return pick_time(self.time_kinds[i], d, style, rng)
        if i in self.strings:
            return self.string_samples[i][0]
        if i in self.structured:
            return copy.deepcopy(self.structured[i][0])
        k = self.kinds[i]
        if k == "enum" or k == "bool":
            vals = self.dom_values(i, d)
            if not vals:
                return NO_VALUE
            return rng.choice(vals) if rng is not None else vals[0]
        if k == "none":
            return NO_VALUE
        return pick_num(d, k == "int", style, rng)

    def _candidates(self, i: int, d: Any, style: str, rng: random.Random | None,
                    consts: list[float]) -> tuple[list, bool]:
        """Candidate values for variable i in witness search; bool = the list is the whole domain."""
        if i in self.optional:  # missing is a value of its own
            cands, whole = self._candidates_present(i, d, style, rng, consts)
            return (cands[:1] + [None] + cands[1:], whole) if d == self.full_doms[i] else (cands, whole)
        return self._candidates_present(i, d, style, rng, consts)

    def _candidates_present(self, i: int, d: Any, style: str, rng: random.Random | None,
                            consts: list[float]) -> tuple[list, bool]:
        if i in self.time_kinds:
            return time_candidates(self.time_kinds[i], d, style, rng, consts), False
        if i in self.strings:
            return string_candidates(self.names[i], self.res_exprs, *self.string_samples[i]), False
        if i in self.structured:
            return copy.deepcopy(self.structured[i]), False
        k = self.kinds[i]
        if i in self.text_enums and d & 1:  # other texts: also those a residual compares it with
            vals = self.dom_values(i, d)
            known = set(self.values[i])
            vals += [x for x in string_candidates(self.names[i], self.res_exprs, vals[0]) if x not in known]
            return vals, False
        if k == "enum" or k == "bool":
            vals = self.dom_values(i, d)
            if rng is not None:
                vals = vals[:]
                rng.shuffle(vals)
            return vals, True
        if k == "none":
            return [], False
        finite = self._finite_values(i, d, 16)
        if finite is not None:
            first = pick_num(d, k == "int", style, rng)
            return [first] + [x for x in finite if x != first], True
        is_int = k == "int"
        raw: list[float] = [pick_num(d, is_int, style, rng), pick_num(d, is_int, "boundary", None),
                            pick_num(d, is_int, "representative", None)]
        for c in consts:
            raw += [c, c + 1, c - 1]
            if not is_int:
                raw += [c + 0.5, c - 0.5]
        raw += [0, 1, -1, 100, 1000]
        if d.lo != -INF:
            raw += [d.lo, d.lo + 1, d.lo + 2]
        if d.hi != INF:
            raw += [d.hi, d.hi - 1, d.hi - 2]
        if d.lo != -INF and d.hi != INF:
            raw.append((d.lo + d.hi) / 2)
        out: list = []
        seen: set = set()
        for x in raw:
            if x is NO_VALUE or isinstance(x, bool):
                continue
            if is_int:
                if isinstance(x, float):
                    if not math.isfinite(x) or not x.is_integer():
                        continue
                    x = int(x)
            else:
                if not math.isfinite(x):
                    continue
                x = float(x)
            if x in seen or not d.contains(x):
                continue
            seen.add(x)
            out.append(x)
            if len(out) >= 14:
                break
        return out, False

    def _search(self, box: Box, style: str, rng: random.Random | None,
                limit: int = SEARCH_COMBOS) -> tuple[dict | None, bool]:
        base = self.pick_all(box, style, rng)
        if base is None:
            return None, False
        lits = sorted(box.resid)
        rvars: dict[int, None] = {}
        consts: list[float] = []
        for rid, _t in lits:
            for v in self.res_vars[rid]:
                rvars.setdefault(v, None)
            pred = self.res_exprs[rid]
            if isinstance(pred, Formula):
                if pred.src is not None:
                    consts += numeric_consts(pred.src[0])
            else:
                consts += numeric_consts(pred)
        order = list(rvars)
        cand_lists = []
        exhaustive = True
        for i in order:
            cands, whole = self._candidates(i, box.doms[i], style, rng, consts)
            if not cands:
                return None, False
            cand_lists.append(cands)
            exhaustive = exhaustive and whole
        for tried, combo in enumerate(itertools.product(*cand_lists)):
            if tried >= limit:
                return None, False
            values = dict(base)
            for i, v in zip(order, combo, strict=True):
                values[self.names[i]] = v
            if all(self.eval_resid(rid, truth, values) for rid, truth in lits):
                return values, False
        return None, exhaustive

"""Descriptions of regions in words (`describe_region`): the layer above `spacesearch` (see `spacecore`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sopgraph.language import ir
from sopgraph.logic.intervals import (  # re-exported: NumDom and the num_* operations are the domain's API
    describe_num,
)
from sopgraph.logic.scalardom import (
    describe_time,
)
from sopgraph.logic.spacecore import (
    MAX_ALTERNATIVES,
    Box,
    alternative_text,
    merge_nums,
    relation_text,
)
from sopgraph.logic.spacesearch import SpaceSearch


class SpaceText(SpaceSearch):
    """What a region's boxes say about each variable, as text for path listings and notes."""

    def describe_dom(self, i: int, d: Any) -> str:
        if i in self.time_kinds:
            return describe_time(self.time_kinds[i], d)
        k = self.kinds[i]
        if k == "enum" and i in self.text_enums:
            other, *lits = self.values[i]
            vals = self.dom_values(i, d)
            if other in vals and len(vals) > 1:
                return "any text but " + ", ".join(ir.quote_string(x) for x in lits if x not in vals)
            return " | ".join("any other text" if x == other else ir.quote_string(x) for x in vals)
        if k == "enum":
            return " | ".join(ir.show_enum_value(v) for v in self.dom_values(i, d))
        if k == "bool":
            return " | ".join("true" if v else "false" for v in self.dom_values(i, d))
        if k == "none":
            return "any"
        return describe_num(d, self.full_doms[i])

    def describe_region(self, region: Sequence[Box]) -> dict[str, str]:
        """Per constrained variable, its domain over the region, as text; `where` for the rest. Exact
        when the region is one box, or its boxes differ in one variable only, or they are few: then the
        constraints they share are listed per variable and the rest as alternatives (`where`: "(Hardship
        = true and now > …) or (…)"). Per-variable unions alone would lose how variables combine (a
        region "A or B" would read as no constraint at all). Beyond `MAX_ALTERNATIVES` boxes, each
        variable's union is listed and `where` names the variables whose combination is not shown."""
        out: dict[str, str] = {}
        if not region:
            return out
        if len(region) > 1:
            exact = self._describe_alternatives(region)
            if exact is not None:
                return exact
        full_doms = self.full_doms
        cache = self._describe_cache
        for i, n in enumerate(self.names):
            full = full_doms[i]
            if len(region) == 1:
                d = region[0].doms[i]
                if d is full or d == full:
                    continue
                key = (i, d)
                text = cache.get(key)
                if text is None:
                    text = self.describe_dom(i, d)
                    cache[key] = text
                out[n] = text
                continue
            doms: list[Any] = []
            for b in region:
                d = b.doms[i]
                if d not in doms:
                    doms.append(d)
            if any(d == full for d in doms):
                continue
            k = self.kinds[i]
            if k == "enum" or k == "bool":
                m = 0
                for d in doms:
                    m |= d
                if m == full:
                    continue
                out[n] = self.describe_dom(i, m)
                continue
            merged = merge_nums(doms, k == "int")
            if len(merged) == 1 and merged[0] == full:
                continue
            out[n] = " or ".join(describe_num(d, full) for d in merged)
        resid_texts: list[str] = []
        for b in region:
            if not b.resid:
                continue
            parts = [self.lit_text(rid, truth) for rid, truth in sorted(b.resid)]
            t = " and ".join(parts)
            if t and t not in resid_texts:
                resid_texts.append(t)
        if resid_texts:
            out["where"] = " or ".join(alternative_text(t) if len(resid_texts) > 1 else t for t in resid_texts)
        if len(region) > MAX_ALTERNATIVES:
            combined = [self.names[i] for i in self._varying_vars(region)]
            if len(combined) > 1:
                shown = ", ".join(combined[:6]) + (", …" if len(combined) > 6 else "")
                note = f"one of {len(region)} combinations of {shown} (not listed)"
                out["where"] = f"{out['where']}; {note}" if "where" in out else note
        return out

    def _varying_vars(self, region: Sequence[Box]) -> list[int]:
        first = region[0].doms
        return [i for i in range(len(first)) if any(b.doms[i] != first[i] for b in region[1:])]

    def _describe_alternatives(self, region: Sequence[Box]) -> dict[str, str] | None:
        """`describe_region` of a few boxes that differ in more than one variable (or residual): what they
        share per variable, the rest as `where` alternatives. None when per-variable unions are exact
        (one varying variable, same residuals) or the boxes are too many to list."""
        if len(region) > MAX_ALTERNATIVES:
            return None
        varying = self._varying_vars(region)
        if len(varying) <= 1 and all(b.resid == region[0].resid for b in region[1:]):
            return None
        out: dict[str, str] = {}
        full_doms = self.full_doms
        vary = set(varying)
        for i, n in enumerate(self.names):
            d = region[0].doms[i]
            if i not in vary and d != full_doms[i]:
                out[n] = self.describe_dom(i, d)
        shared = frozenset.intersection(*(b.resid for b in region))
        alternatives: list[str] = []
        for b in region:
            parts = [f"{self.names[i]} {relation_text(self.describe_dom(i, b.doms[i]))}"
                     for i in varying if b.doms[i] != full_doms[i]]
            parts += [self.lit_text(rid, truth) for rid, truth in sorted(b.resid - shared)]
            if not parts:  # one box is unconstrained here: the alternatives cover everything
                alternatives = []
                break
            text = " and ".join(parts)
            if text not in alternatives:
                alternatives.append(text)
        where = [self.lit_text(rid, truth) for rid, truth in sorted(shared)]
        if len(alternatives) == 1:
            where.append(alternatives[0])
        elif alternatives:
            where.append("(" + " or ".join(alternative_text(t) for t in alternatives) + ")"
                         if where else " or ".join(alternative_text(t) for t in alternatives))
        if where:
            out["where"] = " and ".join(where)
        return out

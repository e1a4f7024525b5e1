"""Compiled guard conditions: formulas in negation normal form over per-variable domains.

A guard compiles (see `guards`) to a `Formula`: true, false, an atom "variable i has a value in
domain d", a conjunction, a disjunction, or a residual literal (a predicate the boxes cannot
represent, numbered by the space). The constructors `mk_atom`/`mk_and`/`mk_or` simplify as they
build (flattening, meeting atoms on one variable, merging enum atoms), and `negate` gives the
complement of an exact formula, memoised on the formula so long chains stay linear in size.
Nothing here reads expressions or scenarios: the constructors see a space only through `DomainOps`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from sopgraph.logic.intervals import NO_POINTS, num_complement, num_norm


class DomainOps(Protocol):
    """What building formulas needs from a space (a protocol so formulas sit below the space)."""

    kinds: list[str]
    full_doms: tuple

    def meet_dom(self, i: int, a: Any, b: Any) -> Any: ...


# ---------------------------------------------------------------------------------------------
# Formulas (compiled guards in negation normal form)


class Formula:
    """A compiled condition. kind: T, F, atom(var, dom), and(parts), or(parts), res(rid, truth).

    `exact` means: no residual inside, so the logical complement `neg` is available (used to make
    the pieces of a disjunction disjoint)."""

    __slots__ = ("kind", "var", "dom", "parts", "rid", "truth", "exact", "neg", "src")

    def __init__(self, kind: str, var: int = -1, dom: Any = None, parts: tuple = (),
                 rid: int = -1, truth: bool = True, exact: bool = True):
        self.kind = kind
        self.var = var
        self.dom = dom
        self.parts = parts
        self.rid = rid
        self.truth = truth
        self.exact = exact
        self.neg: Formula | None = None
        self.src: tuple[Any, bool] | None = None  # (expression, truth) it was compiled from

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        if self.kind in ("T", "F"):
            return self.kind
        if self.kind == "atom":
            return f"atom({self.var}, {self.dom})"
        if self.kind == "res":
            return f"res({self.rid}, {self.truth})"
        return f"{self.kind}({', '.join(map(repr, self.parts))})"


TRUE = Formula("T")
FALSE = Formula("F")
TRUE.neg = FALSE
FALSE.neg = TRUE


# ---------------------------------------------------------------------------------------------
# Formula construction with light simplification


def mk_atom(space: DomainOps, i: int, dom: Any) -> Formula:
    full = space.full_doms[i]
    d = space.meet_dom(i, full, dom)
    if d is None:
        return FALSE
    if d == full:
        return TRUE
    f = Formula("atom", var=i, dom=d)
    return f


def negate(space: DomainOps, f: Formula) -> Formula | None:
    """Logical complement of an exact formula, or None if it has residuals (memoised on the
    formula: disjoint splitting of disjunctions needs the complements of their parts)."""
    if f.neg is not None:
        return f.neg
    if not f.exact:
        return None
    if f.kind == "atom":
        i = f.var
        k = space.kinds[i]
        if k == "enum" or k == "bool":
            n = mk_atom(space, i, space.full_doms[i] & ~f.dom)
        else:
            pieces = [num_norm(p.lo, p.hi, p.lo_open, p.hi_open, NO_POINTS, k == "int")
                      for p in num_complement(f.dom)]
            n = mk_or(space, [mk_atom(space, i, d) for d in pieces if d is not None])
    elif f.kind == "and":
        n = mk_or(space, [negate_exact(space, p) for p in f.parts])
    elif f.kind == "or":
        n = mk_and(space, [negate_exact(space, p) for p in f.parts])
    else:  # pragma: no cover
        return None
    f.neg = n
    if n.neg is None:
        n.neg = f
    return n


def negate_exact(space: DomainOps, f: Formula) -> Formula:
    """`negate` of a part of an exact formula: such parts are exact too, so the complement exists."""
    n = negate(space, f)
    assert n is not None
    return n


def mk_and(space: DomainOps, parts: Iterable[Formula]) -> Formula:
    flat: list[Formula] = []
    atoms: dict[int, Any] = {}
    for p in parts:
        if p.kind == "T":
            continue
        if p.kind == "F":
            return FALSE
        sub = p.parts if p.kind == "and" else (p,)
        for q in sub:
            if q.kind == "atom":
                if q.var in atoms:
                    d = space.meet_dom(q.var, atoms[q.var], q.dom)
                    if d is None:
                        return FALSE
                    atoms[q.var] = d
                else:
                    atoms[q.var] = q.dom
                    flat.append(q)
            else:
                flat.append(q)
    out: list[Formula] = []
    for q in flat:
        if q.kind == "atom":
            d = atoms[q.var]
            q = q if d is q.dom else mk_atom(space, q.var, d)
            if q.kind == "F":
                return FALSE
            if q.kind == "T":
                continue
        out.append(q)
    if not out:
        return TRUE
    if len(out) == 1:
        return out[0]
    f = Formula("and", parts=tuple(out), exact=all(p.exact for p in out))
    if f.exact:
        _attach_neg_lazily(space, f)
    return f


def mk_or(space: DomainOps, parts: Iterable[Formula]) -> Formula:
    flat: list[Formula] = []
    for p in parts:
        if p.kind == "F":
            continue
        if p.kind == "T":
            return TRUE
        flat.extend(p.parts if p.kind == "or" else (p,))
    # merge atoms on the same enum/bool variable (union of masks is exact)
    out: list[Formula] = []
    enum_atoms: dict[int, int] = {}
    for q in flat:
        if q.kind == "atom" and space.kinds[q.var] in ("enum", "bool"):
            if q.var in enum_atoms:
                out[enum_atoms[q.var]] = mk_atom(space, q.var, out[enum_atoms[q.var]].dom | q.dom)
                if out[enum_atoms[q.var]].kind == "T":
                    return TRUE
                continue
            enum_atoms[q.var] = len(out)
        out.append(q)
    if not out:
        return FALSE
    if len(out) == 1:
        return out[0]
    f = Formula("or", parts=tuple(out), exact=all(p.exact for p in out))
    if f.exact:
        _attach_neg_lazily(space, f)
    return f


def _attach_neg_lazily(space: DomainOps, f: Formula) -> None:
    """Exact disjunctions need the complements of their parts for disjoint splitting."""
    if f.kind == "or":
        for p in f.parts[:-1]:
            negate(space, p)

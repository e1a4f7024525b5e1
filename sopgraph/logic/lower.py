"""Lists and records, lowered to plain variables for the analyses.

The constraint domain, paths, witnesses, synthesis and the flow checks reason about enum, bool and
number variables. A program with list or record variables is analysed in an equivalent plain form:

- a record variable `R` with fields `a`, `b` becomes the variables `R.a`, `R.b` (nested records
  nest: `R.a.x`);
- a list variable `L` of at most n items becomes `len(L)` (an int in the declared length range) and
  one set of variables per possible item: `L[0]`, `L[1]`, … (`L[0].a`, … for records);
- an optional list or record (`list[0..3] of date?`) is missing when its *presence key* is: `len(L)` for a
  list, its first plain variable for a record (`presence_key`); only that key is optional in the plain form, and
  `missing(L)` reads it;
- `any(s in L where C)` becomes `len(L) > 0 and C[s := L[0]] or len(L) > 1 and C[s := L[1]] or …`;
  `all` and `count(… where …)` likewise; `len(L)` reads `len(L)`; `X in L` is `any` of the item
  equalities; a weighted count keeps its form over the lowered conditions (the guard compiler and the
  solver read `count(2: A, 1: B)` as the sum of counts `count(B) + 2 * count(A)`, `guards.weighted_as_counts`).

Item variables past the length are never read (every item condition is guarded by the length, and
`and`/`or` stop early as in the engine), so the plain form decides exactly like the source program,
and a witness of the plain form lifts back to lists of exactly `len(L)` items (`lift`); `flatten`
goes the other way. Lists are bounded (at most `ir.LIST_MAX_LIMIT` items), which keeps this finite.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from sopgraph.errors import Error
from sopgraph.language import ir
from sopgraph.language.diagnostics import clip
from sopgraph.logic.unroll import LOOK_SEP, Unrolled, UnrollError, structure_signature, unrolled_for


class LowerError(Error):
    """An expression over lists or records that has no plain form (a checker error in the source)."""


def structured(scenario: ir.Scenario) -> bool:
    """Whether some field or system variable is a list or a record."""
    return any(v.role != "derived" and ir.is_structured(v.type) for v in scenario.variables.values())


def len_name(path: str) -> str:
    return f"len({path})"


class _Lowering:
    """Builds the plain variables of one scenario and rewrites its expressions."""

    def __init__(self, scenario: ir.Scenario):
        self.s = scenario
        self.types: dict[str, Any] = {}  # every path (`L`, `L[0]`, `L[0].a`) -> its declared type
        self.variables: dict[str, ir.Variable] = {}
        self.texts: dict[str, str] = {}  # lowered expression text -> the source text (for messages)
        self.presence: dict[str, str] = {}  # optional structured root -> its presence key
        for name, var in scenario.variables.items():
            if var.role != "derived" and ir.is_structured(var.type):
                self._expand(var, name, var.type)
                if var.optional:
                    key = self.presence[name] = presence_key(name, var.type)
                    self.variables[key] = self.variables[key].model_copy(update={"optional": True})
            else:
                self.variables[name] = var

    def _expand(self, var: ir.Variable, path: str, vtype: Any, optional: bool = False) -> None:
        """`optional`: an optional record field (`note: string?`), a plain optional of its own (a list or
        record field is missing when its presence key is, as for an optional root)."""
        self.types[path] = vtype
        if isinstance(vtype, ir.RecordType):
            for field in vtype.fields:
                self._expand(var, f"{path}.{field.name}", field.type, field.optional)
            if optional:
                self._optional_part(path, vtype)
        elif isinstance(vtype, ir.ListType):
            n = len_name(path)
            self.variables[n] = var.model_copy(update={
                "name": n, "type": ir.NumType(kind="int", lo=vtype.min_len, hi=vtype.max_len), "observed": False,
                "money": False, "optional": False})
            for i in range(vtype.max_len):
                self._expand(var, f"{path}[{i}]", vtype.item)
            if optional:
                self._optional_part(path, vtype)
        else:
            self.variables[path] = var.model_copy(update={"name": path, "type": vtype, "observed": False,
                                                          "money": False, "optional": optional})

    def _optional_part(self, path: str, vtype: Any) -> None:
        key = self.presence[path] = presence_key(path, vtype)
        self.variables[key] = self.variables[key].model_copy(update={"optional": True})

    # -- expressions
    def path(self, e: Any, env: Mapping[str, str]) -> str:
        """The plain name of a variable, item or field read (`Segments[2].flown`)."""
        if isinstance(e, ir.Var):
            return e.name
        if isinstance(e, ir.Item):
            if e.name not in env:
                raise LowerError(f"item `{e.name}` outside its `any`/`all`/`count`")
            return env[e.name]
        if isinstance(e, ir.Get):
            return f"{self.path(e.base, env)}.{e.field}"
        if isinstance(e, ir.Index):
            return f"{self.path(e.base, env)}[{e.index}]"
        if isinstance(e, ir.Func) and e.name == "first" and len(e.args) == 1:
            return f"{self.path(e.args[0], env)}[0]"
        raise LowerError(f"`{clip(ir.show(e))}` is not a variable, item or field")

    def expr(self, e: Any, env: Mapping[str, str]) -> Any:
        out = self._expr(e, env)
        if not env and isinstance(e, (ir.Quant, ir.Length, ir.Member, ir.Weighted, ir.Get)):
            self.texts.setdefault(ir.show(out), ir.show(e))
        return out

    def _expr(self, e: Any, env: Mapping[str, str]) -> Any:
        if e is None:
            return None
        last = _last_in(e)
        if last is not None:  # `last(L)…`: the item at len(L) - 1, one arm per possible length
            return self.last(e, last, env)
        if isinstance(e, (ir.Item, ir.Get, ir.Index)) or isinstance(e, ir.Func) and e.name == "first":
            name = self.path(e, env)
            if name not in self.variables:
                raise LowerError(f"`{clip(ir.show(e))}` is not a single value")
            return ir.Var(name=name, span=e.span)
        if isinstance(e, ir.Quant):
            return self.quant(e, env)
        if isinstance(e, ir.Length):
            return ir.Var(name=len_name(self._list(e.operand, env)[0]), span=e.span)
        if isinstance(e, ir.Member):
            src, lt = self._list(e.source, env)
            x = self.expr(e.operand, env)
            hits = [self._guarded(src, lt, i, ir.Compare(op="==", left=x, right=ir.Var(name=f"{src}[{i}]"),
                                                         span=e.span), e.span) for i in range(lt.max_len)]
            found: Any = ir.BoolOp(op="or", operands=hits, span=e.span) if len(hits) > 1 else (
                hits[0] if hits else ir.Lit(value=False, span=e.span))
            return ir.Unary(op="not", operand=found, span=e.span) if e.negated else found
        if (isinstance(e, ir.Func) and e.name == "missing" and len(e.args) == 1 and isinstance(e.args[0], ir.Var)
                and e.args[0].name in self.presence):
            out = e.model_copy(update={"args": [ir.Var(name=self.presence[e.args[0].name], span=e.args[0].span)]})
            self.texts.setdefault(ir.show(out), ir.show(e))
            return out
        if isinstance(e, ir.Func) and e.name == "missing" and len(e.args) == 1 and isinstance(e.args[0], ir.Get):
            name = self.path(e.args[0], env)  # an optional record field: its plain variable or presence key
            out = e.model_copy(update={"args": [ir.Var(name=self.presence.get(name, name), span=e.args[0].span)]})
            if not env:
                self.texts.setdefault(ir.show(out), ir.show(e))
            return out
        if isinstance(e, ir.Weighted):  # stays a weighted count: the analyses read it as its sum of counts
            return e.model_copy(update={"args": [self.expr(a, env) for a in e.args]})
        return self._copy(e, env)

    def _copy(self, e: Any, env: Mapping[str, str]) -> Any:
        """A scalar node with its sub-expressions lowered."""
        if isinstance(e, (ir.Lit, ir.Var)):
            return e
        update: dict[str, Any] = {}
        for key in ("operand", "left", "right", "otherwise"):
            if hasattr(e, key):
                update[key] = self.expr(getattr(e, key), env)
        if isinstance(e, ir.BoolOp):
            update["operands"] = [self.expr(o, env) for o in e.operands]
        elif isinstance(e, ir.Call):
            update["args"] = [self.expr(a, env) for a in e.args]
        elif isinstance(e, ir.ListLit):  # a list output's value: its items and their conditions
            update["items"] = [self.expr(i, env) for i in e.items]
            update["conds"] = [self.expr(c, env) for c in e.conds]
        elif isinstance(e, ir.CaseExpr):
            update["arms"] = [ir.CaseArm(when=self.expr(a.when, env), then=self.expr(a.then, env), span=a.span)
                              for a in e.arms]
        return e.model_copy(update=update)

    def last(self, e: Any, last: ir.Func, env: Mapping[str, str]) -> Any:
        """`last(L)` (or a field of it) as `case { when len(L) == 1 -> L[0]… when len(L) == n -> L[n-1]… }`;
        an empty list reads the first item's variable (the engine refuses the read: §8)."""
        src, lt = self._list(last.args[0], env)
        arms = []
        for n in range(max(1, lt.min_len), lt.max_len + 1):
            at = ir.Index(base=last.args[0], index=n - 1, span=last.span)
            then = self._expr(_swap(e, last, at), env)
            arms.append(ir.CaseArm(when=ir.Compare(op="==", left=ir.Var(name=len_name(src)), right=ir.Lit(value=n)),
                                   then=then, span=e.span))
        if not arms:
            raise LowerError(f"`{clip(ir.show(e))}`: the list is always empty")
        return ir.CaseExpr(arms=arms[:-1], otherwise=arms[-1].then, span=e.span) if len(arms) > 1 else arms[0].then

    def _list(self, e: Any, env: Mapping[str, str]) -> tuple[str, ir.ListType]:
        src = self.path(e, env)
        lt = self.types.get(src)
        if not isinstance(lt, ir.ListType):
            raise LowerError(f"`{clip(ir.show(e))}` is not a list")
        return src, lt

    @staticmethod
    def _guarded(src: str, lt: ir.ListType, i: int, cond: Any, span: ir.Span) -> Any:
        """`len(L) > i and cond` (just `cond` for items every list has)."""
        if i < lt.min_len:
            return cond
        present = ir.Compare(op=">", left=ir.Var(name=len_name(src)), right=ir.Lit(value=i), span=span)
        return ir.BoolOp(op="and", operands=[present, cond], span=span)

    def quant(self, e: ir.Quant, env: Mapping[str, str]) -> Any:
        src, lt = self._list(e.source, env)
        conds = [self.expr(e.cond, {**env, e.var: f"{src}[{i}]"}) for i in range(lt.max_len)]
        if e.func == "sum":  # the item's value where its condition holds, else 0, added up
            if e.value is None:
                raise LowerError("`sum(…)` without a value")
            terms = [ir.CaseExpr(arms=[ir.CaseArm(when=self._guarded(src, lt, i, c, e.span),
                                                  then=self.expr(e.value, {**env, e.var: f"{src}[{i}]"}))],
                                 otherwise=ir.Lit(value=0, span=e.span), span=e.span) for i, c in enumerate(conds)]
            total: Any = terms[0] if terms else ir.Lit(value=0, span=e.span)
            for t in terms[1:]:
                total = ir.Binary(op="+", left=total, right=t, span=e.span)
            return total
        if e.func == "count":
            if not conds:
                return ir.Lit(value=0, span=e.span)
            return ir.Call(func="count", args=[self._guarded(src, lt, i, c, e.span) for i, c in enumerate(conds)],
                           span=e.span)
        if e.func == "any":
            parts = [self._guarded(src, lt, i, c, e.span) for i, c in enumerate(conds)]
            if not parts:
                return ir.Lit(value=False, span=e.span)
            return parts[0] if len(parts) == 1 else ir.BoolOp(op="or", operands=parts, span=e.span)
        alls: list[Any] = []
        for i, c in enumerate(conds):  # all: `len(L) <= i or C_i`
            if i < lt.min_len:
                alls.append(c)
            else:
                absent = ir.Compare(op="<=", left=ir.Var(name=len_name(src)), right=ir.Lit(value=i), span=e.span)
                alls.append(ir.BoolOp(op="or", operands=[absent, c], span=e.span))
        if not alls:
            return ir.Lit(value=True, span=e.span)
        return alls[0] if len(alls) == 1 else ir.BoolOp(op="and", operands=alls, span=e.span)


def reads_positions(scenario: ir.Scenario) -> bool:
    """Whether some expression reads a list by position (`first(L)`, `last(L)`, `L[k]`)."""
    def walk(e: Any) -> bool:
        if isinstance(e, ir.Index) or isinstance(e, ir.Func) and e.name in ir.POSITIONS:
            return True
        return any(walk(c) for c in ir.children(e))

    exprs: list[Any] = [v.expr for v in scenario.variables.values() if v.expr is not None]
    for st in scenario.stages.values():
        exprs += [st.subject] + [b.guard for b in st.branches]
        for b in st.branches:
            exprs += [a.value for a in [*b.target.outputs, *b.target.args]]
            exprs += [x for c in b.target.steps for x in c.exprs()]
    return any(walk(e) for e in exprs if e is not None)


def _last_in(e: Any) -> ir.Func | None:
    """The `last(L)` a read by position starts from (`last(L)`, `last(L).a`, `last(L).legs[0]`), or None."""
    while isinstance(e, (ir.Get, ir.Index)):
        e = e.base
    return e if isinstance(e, ir.Func) and e.name == "last" and len(e.args) == 1 else None


def _swap(e: Any, old: Any, new: Any) -> Any:
    """`e` with its base chain's `old` node replaced by `new`."""
    if e is old:
        return new
    return e.model_copy(update={"base": _swap(e.base, old, new)})


def _assigns(lw: _Lowering, assigns: list[ir.OutputAssign], action: str | None = None) -> list[ir.OutputAssign]:
    """Assignments lowered; the list and record arguments of `action` are left out (no plain form, and
    no route reads them: they are reported, never tested)."""
    decl = lw.s.actions.get(action or "")
    whole = {p.name for p in decl.params if ir.is_structured(p.type)} if decl is not None else set()
    return [a.model_copy(update={"value": lw.expr(a.value, {})}) for a in assigns if a.name not in whole]


def _step(lw: _Lowering, call: ir.ActionCall) -> ir.ActionCall:
    """A step lowered. A for-each step stays the step of its action, its one argument the step as
    written (`ir.EACH_WRITTEN`, shown by `ir.show_step`): how many times it is carried out is no part of
    a route (its list and arguments are read by the engine only), but a changed step is a changed outcome."""
    if call.each is not None:
        text = re.sub(rf"(\w){re.escape(LOOK_SEP)}\d+\b", r"\1", ir.show_step(call))  # `Fees#2` (a look) as written
        written = ir.OutputAssign(name=ir.EACH_WRITTEN, value=ir.Lit(value=text, span=call.span))
        return ir.ActionCall(action=call.action, args=[written], span=call.span)
    return call.model_copy(update={"args": _assigns(lw, call.args, call.action)})


def lower(scenario: ir.Scenario) -> tuple[ir.Scenario, dict[str, Any], dict[str, str]]:
    """The plain form of a scenario with list or record variables, and the type of every path
    (for `flatten`/`lift`). Raises LowerError on expressions the checker rejects."""
    lw = _Lowering(scenario)
    variables: dict[str, ir.Variable] = {}
    for name, var in lw.variables.items():
        if var.role == "derived" and var.expr is not None:
            var = var.model_copy(update={"expr": lw.expr(var.expr, {})})
        variables[name] = var
    stages: dict[str, ir.Stage] = {}
    for sid, st in scenario.stages.items():
        branches = []
        for b in st.branches:
            t = b.target
            target = t.model_copy(update={
                "outputs": _assigns(lw, t.outputs), "args": _assigns(lw, t.args, t.action),
                "steps": [_step(lw, c) for c in t.steps]})
            branches.append(b.model_copy(update={"guard": lw.expr(b.guard, {}), "target": target}))
        stages[sid] = st.model_copy(update={"branches": branches, "subject": lw.expr(st.subject, {})})
    for st in scenario.stages.values():  # whole guards too (their lowered text nests the parts)
        for b in st.branches:
            if b.guard is not None:
                lw.texts.setdefault(ir.show(lw.expr(b.guard, {})), ir.show(b.guard))
    plain = scenario.model_copy(update={"variables": variables, "stages": stages})
    plain._engine = None
    plain._analyses = ir.AnalysisCache()
    roots = {name: lw.types[name] for name, v in scenario.variables.items()
             if v.role != "derived" and ir.is_structured(v.type)}
    return plain, roots, lw.texts


def flatten_value(path: str, vtype: Any, value: Any, out: dict[str, Any]) -> None:
    """One structured input value as plain entries (`len(L)`, `L[0].a`, …); malformed parts are skipped
    (the engine reports them)."""
    if isinstance(vtype, ir.ListType):
        if isinstance(value, (list, tuple)):
            out[len_name(path)] = len(value)
            for i, x in enumerate(value[:vtype.max_len]):
                flatten_value(f"{path}[{i}]", vtype.item, x, out)
    elif isinstance(vtype, ir.RecordType):
        if isinstance(value, Mapping):
            for field in vtype.fields:
                if field.name in value:
                    flatten_value(f"{path}.{field.name}", field.type, value[field.name], out)
    elif value is not None:
        out[path] = value


_MISSING = object()


def lift_value(path: str, vtype: Any, values: Mapping[str, Any]) -> Any:
    """A structured value rebuilt from plain entries (`_MISSING` when an entry it needs is absent)."""
    if isinstance(vtype, ir.ListType):
        n = values.get(len_name(path), _MISSING)
        if n is _MISSING or not isinstance(n, int):
            return _MISSING
        items = [lift_value(f"{path}[{i}]", vtype.item, values) for i in range(n)]
        return _MISSING if any(x is _MISSING for x in items) else items
    if isinstance(vtype, ir.RecordType):
        rec = {f.name: lift_value(f"{path}.{f.name}", f.type, values) for f in vtype.fields}
        for f in vtype.fields:
            if f.optional and rec[f.name] is _MISSING:
                rec[f.name] = None  # an optional field left out
        return _MISSING if any(x is _MISSING for x in rec.values()) else rec
    value = values.get(path, _MISSING)
    return _MISSING if value is None else value  # a missing optional list or record's presence key


def presence_key(path: str, vtype: Any) -> str:
    """The plain variable that is missing exactly when an optional list or record `path` is."""
    return _plain_keys(path, vtype)[0]


def optional_field_keys(roots: Mapping[str, Any]) -> list[tuple[str, str, frozenset[str]]]:
    """Each optional record field (`note: string?`) in the plain form, one per list item it can be in:
    its path (`Bills[0].note`), the plain variable missing exactly when it is, and all its plain variables."""
    out: list[tuple[str, str, frozenset[str]]] = []
    stack = list(roots.items())
    while stack:
        path, vtype = stack.pop()
        if isinstance(vtype, ir.ListType):
            stack += [(f"{path}[{i}]", vtype.item) for i in range(vtype.max_len)]
        elif isinstance(vtype, ir.RecordType):
            for f in vtype.fields:
                sub = f"{path}.{f.name}"
                if f.optional:
                    out.append((sub, presence_key(sub, f.type), frozenset(_plain_keys(sub, f.type))))
                stack.append((sub, f.type))
    return sorted(out)


def _plain_keys(path: str, vtype: Any) -> list[str]:
    if isinstance(vtype, ir.ListType):
        out = [len_name(path)]
        for i in range(vtype.max_len):
            out += _plain_keys(f"{path}[{i}]", vtype.item)
        return out
    if isinstance(vtype, ir.RecordType):
        return [k for f in vtype.fields for k in _plain_keys(f"{path}.{f.name}", f.type)]
    return [path]


class Lowered(Unrolled):
    """The analysis form of a program with lists or records (unrolled first if it is a procedure):
    plain variables; `flatten`/`lift` convert values both ways (lists and looks)."""

    def __init__(self, inner: Unrolled, plain: ir.Scenario, roots: dict[str, Any], texts: dict[str, str]):
        super().__init__(plain, inner.origin, inner.looks, inner.premature, inner.scenario_source)
        self.inner = inner
        self.roots = roots
        self.texts = sorted(texts.items(), key=lambda kv: -len(kv[0]))  # longest first
        self.plain_keys = {name: _plain_keys(name, t) for name, t in roots.items()}
        self._lowering: _Lowering | None = None
        self.positions = reads_positions(inner.scenario_source)  # its witnesses need the source's word

    def flatten(self, values: Mapping[str, Any]) -> dict[str, Any]:
        out = self.inner.flatten(values) if self.inner.looks else dict(values)
        for name, vtype in self.roots.items():
            if name in out:
                flatten_value(name, vtype, out.pop(name), out)
        return out

    def lift(self, values: Mapping[str, Any]) -> dict[str, Any]:
        out = self.lift_structures(values)
        return self.inner.lift(out) if self.inner.looks else out

    def lift_structures(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """Lists and records rebuilt, looks left as they are (values for `self.inner.scenario`)."""
        out = dict(values)
        for name, vtype in self.roots.items():
            value = lift_value(name, vtype, values)
            for key in self.plain_keys[name]:
                out.pop(key, None)
            if value is not _MISSING:
                out[name] = value
            elif self.plain_keys[name][0] in values and values[self.plain_keys[name][0]] is None:
                out[name] = None  # an optional list or record left out, shown as plain optionals are
        return out

    def lower_expr(self, expr: Any) -> Any:
        """A condition written against the source program (`any(s in Segments where s.flown)`,
        `Metrics.latency > 200`) in plain form; raises LowerError for lists or records used as one value."""
        if self._lowering is None:
            self._lowering = _Lowering(self.inner.scenario)
        return self._lowering.expr(expr, {})

    def missing_in_source_terms(self, text: str) -> str:
        """`missing(len(L))` (the plain form's test of an optional list or record) as `missing(L)`."""
        for name, vtype in self.roots.items():
            if self.inner.scenario.variables[name].optional:
                text = text.replace(f"missing({presence_key(name, vtype)})", f"missing({name})")
        return text

    def source_text(self, text: str) -> str:
        """A message about the plain form in the source's terms (`any(s in L where …)`, not its expansion)."""
        for low, src in self.texts:
            if low in text:
                text = text.replace(low, src)
        return text


def lower_condition(form: Unrolled, expr: Any) -> Any:
    """A condition over the source program's variables in the terms of its analysis form `form`
    (profile intents: lists and records lowered; unchanged for plain programs and procedures)."""
    return form.lower_expr(expr) if isinstance(form, Lowered) else expr


def _identity(scenario: ir.Scenario) -> Unrolled:
    return Unrolled(scenario, {sid: sid for sid in scenario.stages}, {})


def _build(scenario: ir.Scenario) -> Unrolled | Exception:
    try:
        inner = unrolled_for(scenario) if scenario.procedural else _identity(scenario)
        if not structured(inner.scenario):
            return inner
        plain, roots, texts = lower(inner.scenario)
        return Lowered(inner, plain, roots, texts)
    except (UnrollError, LowerError) as exc:
        return exc


def needs_analysis_form(scenario: ir.Scenario) -> bool:
    """Whether the analyses work on a transformed program (a procedure, or lists and records)."""
    return scenario.procedural or structured(scenario)


def analysis_form(scenario: ir.Scenario) -> Unrolled:
    """The plain program the analyses run on: the procedure unrolled, lists and records lowered;
    built once per scenario and structure. Raises UnrollError (LowerError is reported as one)."""
    result = scenario.cached_analysis("analysis_form", structure_signature(scenario), lambda: _build(scenario))
    if isinstance(result, LowerError):
        raise UnrollError(str(result))
    if isinstance(result, Exception):
        raise result
    return result

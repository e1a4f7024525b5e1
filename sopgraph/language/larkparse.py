"""The Lark side of the parser: the LALR parser built from `grammars/sop.lark`, the tree → IR builder,
and the errors of a Lark parse turned into diagnostics (syntax errors named in user terms).

Apart from `parse` because only some runs need it: the fast path (`fastparse`) reads every regular file
without Lark, so `sop check` and `sop decide` of a valid file never import lark (start-up time); Lark
takes a fragment the fast path hands over, a file with a syntax error, and `sop fmt`.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from lark import Lark, Token, Transformer, v_args
from lark.exceptions import (
    LarkError,
    UnexpectedInput,
    VisitError,
)
from lark.lark import PostLex

from sopgraph.language import ir, scalars
from sopgraph.language.diagnostics import Diagnostic, SopError, error
from sopgraph.language.program import (
    RESERVED,
    Include,
    Program,
    ScenarioHeader,
    StartDecl,
    Subflow,
    TypeDecl,
    Use,
    number,
    unquote,
)
from sopgraph.language.syntax_errors import GLUE_HINT, syntax_diagnostic

_number, _unquote = number, unquote  # the builder's short names

def grammar_path() -> Path:
    """The grammar ships inside the wheel (sopgraph/grammars) and lives in grammars/ in a checkout."""
    here = Path(__file__).resolve().parent.parent  # the sopgraph package directory
    for candidate in (here / "grammars" / "sop.lark", here.parent / "grammars" / "sop.lark"):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError("sop.lark grammar not found next to the sopgraph package")


@lru_cache(maxsize=1)
def parser() -> Lark:
    return Lark(
        grammar_path().read_text(encoding="utf-8"),
        parser="lalr",
        propagate_positions=True,
        maybe_placeholders=False,
        postlex=KeywordGlue(),
    )


_WORD_EDGE = re.compile(r"\w")
_WORDS_OF_THEIR_OWN = frozenset({"NAME", "NUMBER", "TIME_UNIT", "STRING", "LONG_STRING"})


class KeywordGlue(PostLex):
    """Refuses a keyword run into the next word (`systemB: int`, `whenA -> t`, `up to2 times`).

    Why: Lark's contextual lexer only tries the terminals the parser can take next, so where no name
    can stand it reads `systemB` as the keyword `system` and the name `B`, yet where a name can stand
    the same text is the one name `systemB`. The fast path's reader (and a person) read one word, so
    the language is: a keyword is a word of its own. A number may still run into a unit (`2days`)."""

    always_accept: tuple[str, ...] = ()

    def process(self, stream: Iterator[Token]) -> Iterator[Token]:
        prev: Token | None = None
        for tok in stream:
            if (prev is not None and prev.type not in _WORDS_OF_THEIR_OWN and prev.end_pos == tok.start_pos
                    and _WORD_EDGE.match(prev.value[-1:]) and _WORD_EDGE.match(tok.value[:1])):
                glued = Token(prev.type, prev.value + tok.value, prev.start_pos, prev.line, prev.column,
                              tok.end_line, tok.end_column, tok.end_pos)
                raise _BadToken(glued, f"missing space after `{prev}` in `{glued}`",
                                f"write `{prev} {tok}`: {GLUE_HINT}")
            yield tok
            prev = tok


def _span(file: str, meta: Any) -> ir.Span:
    if isinstance(meta, _ChildMeta):
        empty, line, col, end_line, end_col = meta._get()
        return ir.make_span(file, 0, 0, 0, 0) if empty else ir.make_span(file, line, col, end_line, end_col)
    if getattr(meta, "empty", False) or not hasattr(meta, "line"):
        return ir.Span(file=file)
    return ir.Span(file=file, line=meta.line, col=meta.column, end_line=meta.end_line,
                   end_col=meta.end_column)


def _tok_span(file: str, tok: Token) -> ir.Span:
    return ir.make_span(file, tok.line or 0, tok.column or 0, tok.end_line or tok.line or 0,
                        tok.end_column or tok.column or 0)


def _list_bound(value: float, is_open: bool, step: int) -> int:
    """A list's length bound as an integer (an open bound excludes its value)."""
    n = math.ceil(value) if step > 0 else math.floor(value)
    return int(n + step) if is_open and float(value).is_integer() else int(n)


class _ChildMeta:
    """Position of a rule computed from its children (Lark gives no meta to inline transformers).

    Keywords are filtered from the tree, so a span starts at the first name, value or sub-node.
    Computed lazily: many rules take their span from a token and never ask."""

    __slots__ = ("_children", "_pos")

    def __init__(self, children: list[Any]):
        self._children = children
        self._pos: tuple[bool, int, int, int, int] | None = None

    def _get(self) -> tuple[bool, int, int, int, int]:
        if self._pos is None:
            first = last = None
            for child in self._children:
                for item in (child if isinstance(child, list) else (child,)):
                    pos = _position(item)
                    if pos is not None:
                        if first is None:
                            first = pos
                        last = pos
            if first is None or last is None:
                self._pos = (True, 0, 0, 0, 0)
            else:
                self._pos = (False, first[0], first[1], last[2], last[3])
        return self._pos

    @property
    def empty(self) -> bool:
        return self._get()[0]

    @property
    def line(self) -> int:
        return self._get()[1]

    @property
    def column(self) -> int:
        return self._get()[2]

    @property
    def end_line(self) -> int:
        return self._get()[3]

    @property
    def end_column(self) -> int:
        return self._get()[4]


def _position(child: Any) -> tuple[int, int, int, int] | None:
    if isinstance(child, Token):
        line, col, end_line, end_col = child.line, child.column, child.end_line, child.end_column
        if line is None or col is None or end_line is None or end_col is None:
            return None
        return (line, col, end_line, end_col)
    span = getattr(child, "span", None)
    if span is None and isinstance(child, tuple) and len(child) == 2 and isinstance(child[1], ir.Span):
        span = child[1]
    if isinstance(span, ir.Span) and span.line:
        return (span.line, span.col, span.end_line, span.end_col)
    return None




class _BadExpr(Exception):
    """An expression the grammar accepts but the language does not (`any(3 where …)`)."""

    def __init__(self, span: ir.Span, message: str, hint: str):
        super().__init__(message)
        self.span = span
        self.message = message
        self.hint = hint


class _BadToken(Exception):
    """A token the grammar accepts but the language does not: a keyword used as a name (meta keys
    excepted), or a number too large to be represented."""

    def __init__(self, token: Token, message: str, hint: str):
        super().__init__(message)
        self.token = token
        self.message = message
        self.hint = hint


class _BadLiteral(Exception):
    """A literal the grammar reads but whose text is not a value: `date("2026-13-45")` (E210)."""

    def __init__(self, span: ir.Span, message: str, hint: str, code: str = "E210"):
        super().__init__(message)
        self.span = span
        self.message = message
        self.hint = hint
        self.code = code  # E001: a list written where a set is meant (`X in [A, B]`)


def _no_list_literal(source: Any) -> None:
    """`X in [A, B]`: a list (a list output's value) where a set of values is meant."""
    if isinstance(source, ir.ListLit):
        at = source.span.replace(end_line=source.span.line, end_col=source.span.col + 1)
        raise _BadLiteral(at, "a set of values is written in braces", "write `X in {A, B}`", code="E001")


def _check_token(child: Token) -> None:
    if child.type == "NAME" and child.value in RESERVED:
        raise _BadToken(child, f"`{child}` is a reserved word and cannot be used as a name",
                        f"rename it, e.g. `{child.value.capitalize()}` or `{child}_`")
    if child.type == "NUMBER" and len(child.value) > 300 and float(child.value) == float("inf"):
        raise _BadToken(child, "number too large", "numbers must fit a 64-bit float (below about 1.8e308)")


def _with_child_meta(func: Any, _data: str, children: list[Any], _meta: Any) -> Any:
    if _data != "meta_entry":
        for child in children:
            if type(child) is Token and (child.type == "NAME" or child.type == "NUMBER"):
                _check_token(child)
    return func(_ChildMeta(children), children)


class _Builder(Transformer):
    """What every part of the tree → IR builder shares: the file, and spans from Lark's positions."""

    def __init__(self, file: str):
        super().__init__()
        self.file = file

    def _sp(self, meta: Any) -> ir.Span:
        # private (leading underscore): `v_args` would otherwise wrap it anew on every access
        return _span(self.file, meta)


@v_args(wrapper=_with_child_meta)
class _DeclarationsToIR(_Builder):
    """Declarations and types: the scenario header, includes, fields, system and derived variables,
    actions, outputs, `type` aliases, lists and records."""

    # -- helpers for tokens
    def text(self, meta, children):
        return _unquote(str(children[0]))

    def action_name(self, meta, children):
        tok = children[0]
        name = _unquote(str(tok)) if tok.type == "STRING" else str(tok)
        return (name, _tok_span(self.file, tok))

    # -- top level
    def start(self, meta, children):
        return Program(file=self.file, items=children, span=self._sp(meta))

    def scenario_decl(self, meta, children):
        name = children[0]
        texts = [c for c in children[1:] if isinstance(c, str)]
        meta_entries = next((c for c in children[1:] if isinstance(c, list)), [])
        return ScenarioHeader(name=str(name), title=texts[0] if texts else "",
                              description="\n".join(texts[1:]), meta=meta_entries, span=self._sp(meta))

    def meta_block(self, meta, children):
        return list(children)

    def meta_entry(self, meta, children):
        return ir.MetaEntry(key=str(children[0]), value=children[1], span=self._sp(meta))

    def include_decl(self, meta, children):
        return Include(path=_unquote(str(children[0])), span=self._sp(meta))

    def start_decl(self, meta, children):
        return StartDecl(stage=str(children[0]), span=_tok_span(self.file, children[0]))

    def _variable(self, role: ir.Role, meta, children) -> ir.Variable:
        name_tok, vtype, *rest = children
        kw: dict[str, Any] = {}
        for item in rest:
            if isinstance(item, str):
                kw["description"] = item
            elif isinstance(item, tuple):
                kw[item[0]] = item[1]
        return ir.Variable(name=str(name_tok), role=role, type=vtype, span=_tok_span(self.file, name_tok),
                           **kw)

    def field_decl(self, meta, children):
        return self._variable("field", meta, children)

    def system_decl(self, meta, children):
        return self._variable("system", meta, children)

    def derived_decl(self, meta, children):
        name_tok, expr, *rest = children
        return ir.Variable(name=str(name_tok), role="derived", expr=expr,
                           description=rest[0] if rest else "", span=_tok_span(self.file, name_tok))

    def unit_attr(self, meta, children):
        return ("unit", _unquote(str(children[0])))

    def money_attr(self, meta, children):
        return ("money", True)

    def hidden_attr(self, meta, children):
        return ("hidden", True)

    def volatile_attr(self, meta, children):
        return ("volatile", True)

    def output_decl(self, meta, children):
        name_tok, vtype, *rest = children
        default = next((c for c in rest if isinstance(c, (ir.Lit, ir.TimeLit, ir.ListLit))), None)
        if isinstance(default, ir.TimeLit):  # `= 2 days`: finals report durations as text
            default = ir.Lit(value=scalars.format_temporal(default.unit, default.value), span=default.span)
        desc = next((c for c in rest if isinstance(c, str)), "")
        return ir.Output(name=str(name_tok), type=vtype, default=default, description=desc,
                         span=_tok_span(self.file, name_tok))

    def action_decl(self, meta, children):
        (name, span), *rest = children
        desc = next((c for c in rest if isinstance(c, str)), "")
        attrs = next((c for c in rest if isinstance(c, list)), [])
        params = next((c for c in rest if isinstance(c, tuple) and c and c[0] == "params"), ("params", []))
        affects = next((c for c in rest if isinstance(c, tuple) and c and c[0] == "affects"), ("affects", []))
        return ir.Action(name=name, description=desc, attributes=[a for a, _ in attrs],
                         attribute_spans=[s for _, s in attrs], params=params[1], span=span,
                         affects=[a for a, _ in affects[1]], affects_spans=[s for _, s in affects[1]])

    def action_params(self, meta, children):
        return ("params", [c for c in children if c is not None])

    def action_param(self, meta, children):
        return ir.ActionParam(name=str(children[0]), type=children[1], span=_tok_span(self.file, children[0]))

    def type_decl(self, meta, children):
        name, vtype, *rest = children
        return TypeDecl(name=str(name), type=vtype, description=rest[0] if rest else "",
                        span=_tok_span(self.file, name))

    # -- lists and records
    def list_type(self, meta, children):
        bounds = children[0] if isinstance(children[0], dict) else {}
        lo, hi = bounds.get("lo"), bounds.get("hi")
        kw: dict[str, Any] = {}
        if lo is not None:
            kw["min_len"] = _list_bound(lo, bounds.get("lo_open", False), +1)
        if hi is not None:
            kw["max_len"] = _list_bound(hi, bounds.get("hi_open", False), -1)
        return ir.ListType(item=children[-1], span=self._sp(meta), **kw)

    def record_type(self, meta, children):
        fields = [c for c in children if isinstance(c, ir.RecordField)]
        return ir.RecordType(fields=fields, open=len(fields) < len(children), span=self._sp(meta))

    def record_open(self, meta, children):
        return "open"

    def record_field(self, meta, children):
        optional = len(children) > 2  # `note: string?`
        return ir.RecordField(name=str(children[0]), type=children[1], optional=optional,
                              span=_tok_span(self.file, children[0]))

    def alias_type(self, meta, children):
        return ir.EnumType(values=[], alias=str(children[0]), span=_tok_span(self.file, children[0]))

    def affects(self, meta, children):
        return ("affects", [(str(c), _tok_span(self.file, c)) for c in children if c is not None])

    def attr_list(self, meta, children):
        return [(str(c), _tok_span(self.file, c)) for c in children if c is not None]

    # -- types
    def enum_type(self, meta, children):
        values = [_unquote(str(c)) if c.type == "STRING" else str(c) for c in children]
        return ir.EnumType(values=values, span=self._sp(meta))

    def bool_type(self, meta, children):
        return ir.BoolType(span=self._sp(meta))

    def _num_type(self, kind: ir.NumKind, meta, children):
        if not children:
            return ir.NumType(kind=kind, span=self._sp(meta))
        return ir.NumType(kind=kind, span=self._sp(meta), **children[0])

    def int_type(self, meta, children):
        return self._num_type("int", meta, children)

    def float_type(self, meta, children):
        return self._num_type("float", meta, children)

    def range(self, meta, children):
        left, *mid, right = children
        bounds = dict(mid)
        lo, hi = bounds.get("lo"), bounds.get("hi")
        return {"lo": lo, "hi": hi, "lo_open": left == "open" or lo is None,
                "hi_open": right == "open" or hi is None}

    def range_lo(self, meta, children):
        return ("lo", children[0])

    def range_hi(self, meta, children):
        return ("hi", children[0])

    def closed(self, meta, children):
        return "closed"

    def open(self, meta, children):
        return "open"

    def bound(self, meta, children):
        return _number(str(children[-1]))

    def neg_bound(self, meta, children):
        return _number(str(children[-1]), negative=True)

    # -- dates, durations, strings, optionals, defaults (docs/language.md §4)
    def date_type(self, meta, children):
        return ir.TimeType(kind="date", span=self._sp(meta))

    def datetime_type(self, meta, children):
        return ir.TimeType(kind="datetime", span=self._sp(meta))

    def duration_type(self, meta, children):
        return ir.TimeType(kind="duration", span=self._sp(meta))

    def string_type(self, meta, children):
        return ir.StringType(span=self._sp(meta))

    def optional_mark(self, meta, children):
        return ("optional", True)

    def decl_default(self, meta, children):
        return ("default", children[0])


@v_args(wrapper=_with_child_meta)
class _ExpressionsToIR(_Builder):
    """Expressions: operators, literals (numbers, durations, dates), functions, list and record reads."""

    def duration_lit(self, meta, children):
        number, unit = children
        amount = _number(str(number))
        seconds = amount * scalars.unit_seconds(str(unit))
        if isinstance(seconds, float) and seconds.is_integer():
            seconds = int(seconds)
        return ir.TimeLit(unit="duration", value=seconds, text=f"{number} {unit}", span=self._sp(meta))

    def func_call(self, meta, children):
        name_tok, *args = children
        args = [a for a in args if a is not None]
        name = str(name_tok)
        if name in ("date", "datetime"):
            return self._time_literal(name, args, meta)
        return ir.Func(name=name, args=args, span=self._sp(meta))

    def index_expr(self, meta, children):
        base, _open, number, _close = children
        if "." in str(number):
            raise _BadToken(number, f"a list position is a whole number, not `{number}`", "write `L[0]` for the first item")
        return ir.Index(base=base, index=int(str(number)), span=self._sp(meta))

    def get_expr(self, meta, children):
        base, name = children
        out = base
        for field in str(name).split("."):
            out = ir.Get(base=out, field=field, span=self._sp(meta))
        return out

    def _time_literal(self, kind: str, args: list[Any], meta: Any) -> ir.TimeLit:
        span = self._sp(meta)
        example = "2026-11-23" if kind == "date" else "2026-11-23T10:00"
        if len(args) != 1 or not isinstance(args[0], ir.Lit) or not isinstance(args[0].value, str) or args[0].bare:
            raise _BadLiteral(span, f"`{kind}(...)` takes one quoted {kind}",
                              f'write `{kind}("{example}")`')
        try:
            value = scalars.parse_temporal(kind, args[0].value)
        except scalars.ValueProblem as exc:
            raise _BadLiteral(args[0].span, f'"{args[0].value}" {exc}', f'write `{kind}("{example}")`') from None
        return ir.TimeLit(unit=kind, value=value, text=args[0].value, span=span)  # type: ignore[arg-type]

    def matches_op(self, meta, children):
        operand, tok = children
        pattern = str(tok)[1:-1].replace('\\"', '"')  # the text as written: `\d` stays `\d`
        return ir.Matches(operand=operand, pattern=pattern, pattern_span=_tok_span(self.file, tok),
                          span=self._sp(meta))

    # -- operators and atoms
    def or_op(self, meta, children):
        return self._flatten("or", meta, children)

    def and_op(self, meta, children):
        return self._flatten("and", meta, children)

    def _flatten(self, op: ir.LogicOp, meta, children):
        head = children[0]
        if isinstance(head, ir.BoolOp) and head.op == op:
            # `a and b and c ...` reduces one operand at a time: grow the left operand's list in
            # place so a long chain costs linear, not quadratic, time.
            for child in children[1:]:
                if isinstance(child, ir.BoolOp) and child.op == op:
                    head.operands.extend(child.operands)
                else:
                    head.operands.append(child)
            head.span = self._sp(meta)
            return head
        operands: list[Any] = []
        for child in children:
            if isinstance(child, ir.BoolOp) and child.op == op:
                operands.extend(child.operands)
            else:
                operands.append(child)
        return ir.BoolOp(op=op, operands=operands, span=self._sp(meta))

    def not_op(self, meta, children):
        return ir.Unary(op="not", operand=children[0], span=self._sp(meta))

    def neg(self, meta, children):
        inner = children[0]
        if isinstance(inner, ir.Lit) and isinstance(inner.value, (int, float)) and not isinstance(
                inner.value, bool):
            return ir.Lit(value=-inner.value, span=self._sp(meta))
        return ir.Unary(op="neg", operand=inner, span=self._sp(meta))

    def compare(self, meta, children):
        return ir.Compare(op=str(children[1]), left=children[0], right=children[2], span=self._sp(meta))

    def in_set(self, meta, children):
        return ir.InSet(operand=children[0], values=children[1], span=self._sp(meta))

    def not_in_set(self, meta, children):
        return ir.InSet(operand=children[0], values=children[1], negated=True, span=self._sp(meta))

    def value_set(self, meta, children):
        return list(children)

    def _bin(self, op: ir.BinOp, meta, children):
        return ir.Binary(op=op, left=children[0], right=children[1], span=self._sp(meta))

    def add(self, meta, children):
        return self._bin("+", meta, children)

    def sub(self, meta, children):
        return self._bin("-", meta, children)

    def mul(self, meta, children):
        return self._bin("*", meta, children)

    def div(self, meta, children):
        return self._bin("/", meta, children)

    def count_expr(self, meta, children):
        return ir.Call(func="count", args=list(children), span=self._sp(meta))

    def min_expr(self, meta, children):
        return ir.Call(func="min", args=list(children), span=self._sp(meta))

    def max_expr(self, meta, children):
        return ir.Call(func="max", args=list(children), span=self._sp(meta))

    def weighted_count(self, meta, children):
        return ir.Weighted(weights=[w for c in children for w in c.weights],
                           args=[a for c in children for a in c.args], span=self._sp(meta))

    def weighted(self, meta, children):
        return ir.Weighted(weights=[_number(str(children[0]))], args=[children[1]], span=self._sp(meta))

    def _quant(self, func: Literal["any", "all", "count"], meta, children):
        head, cond = children
        if not (isinstance(head, ir.Member) and not head.negated and isinstance(head.operand, ir.Var)
                and "." not in head.operand.name):
            raise _BadExpr(head.span if isinstance(head, ir.Node) else self._sp(meta),
                           f"`{func}(… where …)` starts with an item name and a list",
                           f"write `{func}(x in List where condition)`")
        return ir.Quant(func=func, var=head.operand.name, source=head.source, cond=cond, span=self._sp(meta))

    def sum_for(self, meta, children):
        _sum, value, head, *rest = children
        if not (isinstance(head, ir.Member) and not head.negated and isinstance(head.operand, ir.Var)
                and "." not in head.operand.name):
            raise _BadExpr(head.span if isinstance(head, ir.Node) else self._sp(meta),
                           "`sum(… for …)` names an item and a list after `for`",
                           "write `sum(x.amount for x in List)` or `sum(x.amount for x in List where condition)`")
        cond = rest[0] if rest else ir.Lit(value=True, span=self._sp(meta))
        return ir.Quant(func="sum", var=head.operand.name, source=head.source, cond=cond, value=value,
                        span=self._sp(meta))

    def sum_call(self, meta, children):
        """`sum(A, B)` (scalars): the checker's E101 says to write `A + B`."""
        args = [c for c in children[1:] if c is not None]
        return ir.Func(name="sum", args=args, span=self._sp(meta))

    def count_where(self, meta, children):
        return self._quant("count", meta, children)

    def any_where(self, meta, children):
        return self._quant("any", meta, children)

    def all_where(self, meta, children):
        return self._quant("all", meta, children)

    def len_expr(self, meta, children):
        return ir.Length(operand=children[0], span=self._sp(meta))

    def in_list(self, meta, children):
        _no_list_literal(children[1])
        return ir.Member(operand=children[0], source=children[1], span=self._sp(meta))

    def not_in_list(self, meta, children):
        _no_list_literal(children[1])
        return ir.Member(operand=children[0], source=children[1], negated=True, span=self._sp(meta))

    def case_expr(self, meta, children):
        *arms, otherwise = children
        return ir.CaseExpr(arms=arms, otherwise=otherwise, span=self._sp(meta))

    def case_arm(self, meta, children):
        return ir.CaseArm(when=children[0], then=children[1], span=self._sp(meta))

    def var_ref(self, meta, children):
        return ir.Var(name=str(children[0]), span=_tok_span(self.file, children[0]))

    def number(self, meta, children):
        return ir.Lit(value=_number(str(children[0])), span=self._sp(meta))

    def list_lit(self, meta, children):
        items = [c for c in children if isinstance(c, tuple)]
        span = ir.Span(self.file, children[0].line, children[0].column, children[-1].end_line,
                       children[-1].end_column)  # from `[` to `]`
        return ir.ListLit(items=[i for i, _ in items], conds=[c for _, c in items], span=span)

    def list_value(self, meta, children):
        return self.list_lit(meta, [c if not isinstance(c, ir.Node) else (c, ir.Lit(value=True)) for c in children
                                    if c is not None])

    def list_item(self, meta, children):
        cond = children[1] if len(children) > 1 else ir.Lit(value=True)  # `A`: kept always
        return (children[0], cond)

    def number_value(self, meta, children):
        return ir.Lit(value=_number(str(children[-1])), span=self._sp(meta))

    def neg_number_value(self, meta, children):
        return ir.Lit(value=_number(str(children[-1]), negative=True), span=self._sp(meta))

    def true(self, meta, children):
        return ir.Lit(value=True, span=self._sp(meta))

    def false(self, meta, children):
        return ir.Lit(value=False, span=self._sp(meta))

    def string(self, meta, children):
        return ir.Lit(value=_unquote(str(children[0])), span=self._sp(meta))

    def name_value(self, meta, children):
        return ir.Lit(value=str(children[0]), bare=True, span=_tok_span(self.file, children[0]))



# ---------------------------------------------------------------------------------------------
# Syntax errors, named by what the user was writing (the catalogue: `syntax_errors`)


@v_args(wrapper=_with_child_meta)
class ToIR(_DeclarationsToIR, _ExpressionsToIR):
    """Tree → IR nodes. Kept mechanical: all cross-item logic lives in `_resolve`. Public because
    the formatter (`fmt`) builds its program from the same tree the parser does. Declarations and
    expressions are built by its two bases; stages, their decisions and subflows here."""

    # -- stages
    def stage_decl(self, meta, children):
        name_tok = children[0]
        rest = children[1:]
        title = rest[0] if rest and isinstance(rest[0], str) else ""
        body = rest[-1]
        return ir.Stage(id=str(name_tok), title=title, span=_tok_span(self.file, name_tok), **body)

    def stage_body(self, meta, children):
        texts = [c for c in children if isinstance(c, str)]
        classify = next((c for c in children if isinstance(c, tuple) and c[0] == "classify"), None)
        observe = next((c for c in children if isinstance(c, tuple) and c[0] == "observe"), None)
        decision = children[-1]
        out = dict(decision)
        out["text"] = "\n".join(texts)
        out["classify"] = classify[1] if classify else []
        out["observe"] = observe[1] if observe else []
        return out

    def classify_stmt(self, meta, children):
        return ("classify", [str(c) for c in children])

    def observe_stmt(self, meta, children):
        return ("observe", [str(c) for c in children])

    def goto(self, meta, children):
        limit = children[1] if len(children) > 1 else None
        first = ir.Branch(target=children[0], limit=limit, span=self._sp(meta))
        if limit is None:
            return {"kind": "goto", "branches": [first]}
        # `-> t up to N times [otherwise -> u]`: a bounded jump, then what to do once it is spent
        return {"kind": "when", "branches": [first, *children[2:]]}

    def limit(self, meta, children):
        return int(_number(str(children[-1])))

    def match_block(self, meta, children):
        subject, *arms = children
        branches = []
        for arm in arms:
            if isinstance(arm, ir.Branch):
                branches.append(arm)
            else:
                values, target, span, limit = arm
                guard = ir.InSet(operand=subject, values=values, span=span)
                branches.append(ir.Branch(guard=guard, target=target, values=values, limit=limit,
                                          span=span))
        return {"kind": "match", "subject": subject, "branches": branches}

    def match_arm(self, meta, children):
        limit = children.pop() if isinstance(children[-1], int) and not isinstance(children[-1], bool) else None
        *values, target = children
        return (values, target, self._sp(meta), limit)

    def when_block(self, meta, children):
        return {"kind": "when", "branches": list(children)}

    def when_arm(self, meta, children):
        limit = children[2] if len(children) > 2 else None
        return ir.Branch(guard=children[0], target=children[1], limit=limit, span=self._sp(meta))

    def else_when_arm(self, meta, children):
        branch = self.when_arm(meta, children)
        branch.ordered = True
        return branch

    def otherwise_arm(self, meta, children):
        limit = children[1] if len(children) > 1 else None
        return ir.Branch(guard=None, target=children[0], limit=limit, span=self._sp(meta))

    def stage_target(self, meta, children):
        return ir.Target(kind="stage", stage=str(children[0]), span=self._sp(meta))

    def action_target(self, meta, children):
        (name, _span_), *rest = children
        args = next((c[1] for c in rest if isinstance(c, tuple)), [])
        outputs = next((c for c in rest if isinstance(c, list)), [])
        return ir.Target(kind="action", action=name, outputs=outputs, args=args, span=self._sp(meta))

    def step_target(self, meta, children):
        (name, span), *rest = children
        args = next((c[1] for c in rest if isinstance(c, tuple)), [])
        nxt: ir.Target = rest[-1]
        call = ir.ActionCall(action=name, args=args, span=span)
        nxt.steps.insert(0, call)
        nxt.span = self._sp(meta)
        return nxt

    def each_target(self, meta, children):
        var_tok, source, *rest = children
        cond = rest.pop(0)[1] if isinstance(rest[0], tuple) and rest[0][0] == "where" else None
        (name, span), *rest = rest
        args = next((c[1] for c in rest if isinstance(c, tuple)), [])
        nxt: ir.Target = rest[-1]
        call = ir.ActionCall(action=name, args=args, each=str(var_tok), source=source, cond=cond,
                             span=_tok_span(self.file, var_tok))
        nxt.steps.insert(0, call)
        nxt.span = self._sp(meta)
        return nxt

    def each_where(self, meta, children):
        return ("where", children[0])

    def call_args(self, meta, children):
        return ("args", [c for c in children if c is not None])

    def call_arg(self, meta, children):
        return ir.OutputAssign(name=str(children[0]), value=children[1], span=self._sp(meta))

    def output_block(self, meta, children):
        return list(children)

    def output_assign(self, meta, children):
        return ir.OutputAssign(name=str(children[0]), value=children[1], span=self._sp(meta))

    # -- subflows
    def subflow_decl(self, meta, children):
        name = children[0]
        params = [str(c) for c in children[1:] if isinstance(c, Token)]
        stages = [c for c in children[1:] if isinstance(c, ir.Stage)]
        uses = [c for c in children[1:] if isinstance(c, Use)]
        return Subflow(name=str(name), params=params, stages=stages, uses=uses, span=_tok_span(self.file, name))

    def use_decl(self, meta, children):
        sub, inst, *binds = children
        return Use(subflow=str(sub), instance=str(inst), bindings=dict(b for b in binds if b),
                   span=_tok_span(self.file, inst))

    def binding(self, meta, children):
        return (str(children[0]), children[1])


def _syntax_diagnostic(exc: UnexpectedInput, text: str, file: str) -> Diagnostic:
    """The diagnostic for a syntax error in `text`. The catalogue is matched by parser state, and
    state numbers belong to one Lark instance: the error is found again with `parser()`, whose states
    the examples are parsed with (one more parse, of text that failed)."""
    lark = parser()
    try:
        lark.parse(text)
    except UnexpectedInput as again:
        exc = again
    except Exception:  # noqa: BLE001, S110 - refused another way: keep the builder's error
        pass
    return syntax_diagnostic(exc, text, file, lark)

_BUILDER_LOCK = threading.Lock()


@lru_cache(maxsize=1)
def _building_parser() -> tuple[Lark, ToIR]:
    """A parser that builds the IR while parsing (no intermediate tree): about as fast as Lark alone."""
    builder = ToIR("<string>")
    return Lark(grammar_path().read_text(encoding="utf-8"), parser="lalr", transformer=builder,
                maybe_placeholders=False, postlex=KeywordGlue()), builder


def lark_program(text: str, file: str) -> Program:
    """The Lark parser's program for `text` (raises Lark's and the builder's exceptions)."""
    lark, builder = _building_parser()
    with _BUILDER_LOCK:
        builder.file = file
        program = lark.parse(text)  # the builder transforms the tree into a Program
    assert isinstance(program, Program)
    return program



# what a Lark parse of malformed text can raise (`parse_error` names each one for the user)
PARSE_FAILURES = (LarkError, _BadToken, _BadExpr, _BadLiteral, RecursionError, ValueError, TypeError)


def parse_error(exc: Exception, text: str, file: str) -> SopError:
    """The `SopError` for an exception out of a Lark parse of `text` (with or without the IR builder):
    one place, so `sop check` and `sop fmt` say the same about the same text."""
    if isinstance(exc, VisitError) and isinstance(exc.orig_exc, (_BadToken, _BadExpr, _BadLiteral, RecursionError)):
        exc = exc.orig_exc
    if isinstance(exc, UnexpectedInput):
        found = _syntax_diagnostic(exc, text, file)
    elif isinstance(exc, _BadToken):
        found = error("E001", exc.message, _tok_span(file, exc.token), exc.hint)
    elif isinstance(exc, _BadExpr):
        found = error("E001", exc.message, exc.span, exc.hint)
    elif isinstance(exc, _BadLiteral):
        found = error(exc.code, exc.message, exc.span, exc.hint)
    elif isinstance(exc, RecursionError):
        found = error("E006", "the program nests too deeply to parse", ir.Span(file=file),
                      "split deeply nested expressions")
    else:
        found = error("E001", f"cannot build the program: {exc}", ir.Span(file=file))
    return SopError([found], {file: text})

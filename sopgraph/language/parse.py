"""Text → IR: the Lark LALR parser, syntax errors named in user terms, includes and subflows.

`load()` is the front door: it reads a file (and the files it includes), inlines subflows,
resolves bare identifiers, and returns a `Scenario`. Syntax and loading problems become
`Diagnostic`s; nothing the user writes can make this module raise anything but `SopError`.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import stat
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
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

from sopgraph.errors import Error
from sopgraph.language import ir, scalars
from sopgraph.language.diagnostics import Diagnostic, SopError, clip, did_you_mean, error
from sopgraph.language.fastparse import parse_fast
from sopgraph.language.program import (  # noqa: F401 - re-exported: parse.Program, parse.KEYWORDS, ...
    CONTEXT_KEYWORDS,
    KEYWORDS,
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
from sopgraph.language.syntax_errors import DECL_KEYWORDS, GLUE_HINT, syntax_diagnostic  # noqa: F401

_number, _unquote = number, unquote  # the builder's short names
MAX_DEPTH = 100  # expression nesting the parser accepts (the engine compiles expressions to Python)
MAX_DERIVED_CHAIN = 300  # derived variables defined one through the next (walks follow them recursively)


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


def _lark_program(text: str, file: str) -> Program:
    """The Lark parser's program for `text` (raises Lark's and the builder's exceptions)."""
    lark, builder = _building_parser()
    with _BUILDER_LOCK:
        builder.file = file
        program = lark.parse(text)  # the builder transforms the tree into a Program
    assert isinstance(program, Program)
    return program


def parse_text(text: str, file: str = "<string>", *, fast: bool = True) -> Program:
    """Parse one file's text into a `Program`; syntax errors raise `SopError`. The fast path
    (`fastparse`) reads the regular forms and hands the rest to Lark, building the same program;
    `fast=False` is Lark alone (benchmarks and the equivalence tests compare the two)."""
    program = parse_fast(text, file, lambda fragment: _lark_program(fragment, file).items) if fast else None
    if program is None:
        try:
            program = _lark_program(text, file)
        except PARSE_FAILURES as exc:
            raise parse_error(exc, text, file) from None
    too_deep = [d for e in _program_expressions(program.items) if (d := _too_deep(e)) is not None]
    if too_deep:
        raise SopError(too_deep, {file: text})
    return program


def _target_expressions(target: ir.Target) -> Iterator[Any]:
    for assign in target.outputs:
        yield assign.value
    for assign in target.args:
        yield assign.value
    for step in target.steps:
        yield from step.exprs()


def _program_expressions(items: Iterable[Any]) -> Iterator[Any]:
    """Every expression written in a file's items (subflows included), before names are resolved."""
    for item in items:
        if type(item) is ir.Stage:
            if item.subject is not None:
                yield item.subject
            for branch in item.branches:
                if branch.guard is not None:
                    yield branch.guard
                target = branch.target
                if target.outputs or target.args or target.steps:
                    yield from _target_expressions(target)
        elif isinstance(item, ir.Variable):
            yield from (e for e in (item.expr, item.default) if e is not None)
        elif isinstance(item, ir.Output) and item.default is not None:
            yield item.default
        elif isinstance(item, Subflow):
            yield from _program_expressions([*item.stages, *item.uses])
        elif isinstance(item, Use):
            for target in item.bindings.values():
                yield from _target_expressions(target)


_SHALLOW = frozenset((ir.Var, ir.Lit))


def _too_deep(expr: Any) -> Diagnostic | None:
    """E006 for an expression nested deeper than `MAX_DEPTH`, measured without recursion, at parse time:
    name resolution, type inference, path listing and the engine's code generation all recurse over
    expressions, so nothing after the parser may see one (a profile's `when` is parsed here too)."""
    kind = type(expr)
    if kind in _SHALLOW or (kind is ir.InSet and type(expr.operand) in _SHALLOW) or (
            kind is ir.Compare and type(expr.left) in _SHALLOW and type(expr.right) in _SHALLOW):
        return None  # most guards: measured by their shape
    depth, level = 0, [expr]
    while level:
        depth += 1
        level = [child for node in level for child in ir.children(node)]
    if depth <= MAX_DEPTH:
        return None
    return error("E006", f"expression nested too deeply ({depth} levels; at most {MAX_DEPTH})", expr.span,
                 "split it into derived variables (`let`)")


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


# ---------------------------------------------------------------------------------------------
# Loading: includes, merge, subflow inlining, name resolution


class Loaded(ir.Node):
    """The result of loading: a scenario (if one could be built), diagnostics and sources."""

    scenario: ir.Scenario | None = None
    diagnostics: list[Diagnostic] = []
    sources: dict[str, str] = {}


def load_source(path: str | Path | None = None, *, text: str | None = None,
                name: str | None = None, include_path: Sequence[str | Path] = ()) -> Loaded:
    """Load a program, collecting every loading diagnostic instead of stopping at the first.
    Includes are sandboxed (see `read_sop_file`): they must lie under the main file's directory
    or one of the `include_path` directories."""
    return _load_source(path, text=text, name=name, include_path=include_path)


MAX_SOURCE_BYTES = 64 * 1024 * 1024  # a .sop file (main or included) larger than this is refused
_SYSTEM_TREES = ("/proc", "/sys", "/dev")  # pseudo-files: endless, blocking or secret


class ReadRefused(Error):
    """A source file that must not be read; `str()` is the reason, `hint` says what to do."""

    def __init__(self, reason: str, hint: str | None = None):
        super().__init__(reason)
        self.hint = hint


def read_sop_file(path: str | Path, *, limit: int | None = None) -> str:
    """Read a source file safely: only a regular file (no FIFO, device or /proc entry, which could
    block forever, never end or leak secrets), at most `limit` bytes, UTF-8 text without NUL bytes.
    Opened non-blocking and checked on the open descriptor, so a FIFO swapped in cannot hang us."""
    limit = MAX_SOURCE_BYTES if limit is None else limit
    name = str(path)
    if "\0" in name:
        raise ReadRefused("the path contains a NUL byte", "remove the NUL character from the path")
    resolved = Path(path).resolve()
    if any(str(resolved) == t or str(resolved).startswith(t + "/") for t in _SYSTEM_TREES):
        raise ReadRefused(f"{resolved} is a system pseudo-file, not a source file", "name a .sop file")
    try:
        fd = os.open(resolved, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise ReadRefused(_reason(exc)) from exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ReadRefused("not a regular file", "name a .sop file, not a directory, device or pipe")
        if info.st_size > limit:
            raise ReadRefused(f"the file is too large ({info.st_size:,} bytes; at most {limit:,})",
                              "split it into smaller files joined with `include`")
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read(limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise ReadRefused(f"the file is too large (more than {limit:,} bytes)",
                          "split it into smaller files joined with `include`")
    if b"\0" in data:
        raise ReadRefused("the file contains NUL bytes (binary data, not a .sop program)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ReadRefused(f"not UTF-8 text (byte {exc.start})", "save the file as UTF-8") from exc
    return text[1:] if text.startswith("\ufeff") else text  # a byte-order mark (Windows editors)


def _load_source(path: str | Path | None, *, text: str | None, name: str | None,
                 include_path: Sequence[str | Path] = ()) -> Loaded:
    sources: dict[str, str] = {}
    diags: list[Diagnostic] = []
    programs: list[Program] = []
    if text is None:
        assert path is not None
        file = str(path)
        try:
            text = read_sop_file(path)
        except ReadRefused as exc:
            shown = file.replace("\0", "\\0")
            return Loaded(diagnostics=[error("E003", f"cannot read {shown}: {exc}", ir.Span(file=shown), exc.hint)])
        base = Path(path).resolve().parent
    else:
        file = name or (str(path) if path else "<string>")
        base = Path(path).resolve().parent if path else Path.cwd()
    text = text.replace("\r\n", "\n")
    sources[file] = text
    try:
        main = parse_text(text, file)
    except SopError as exc:
        return Loaded(diagnostics=exc.diagnostics, sources=sources)
    programs.append(main)
    roots = [base] + [Path(p).resolve() for p in include_path]
    _collect_includes(main, base, [str(Path(file).resolve()) if path else file], programs, sources, diags,
                      roots)
    if any(d.is_error for d in diags):
        return Loaded(diagnostics=diags, sources=sources)
    try:
        scenario = _merge(programs, diags, sources.values())
        if (chain := _long_derived_chain(scenario)) is not None:
            return Loaded(diagnostics=[chain], sources=sources)
    except RecursionError:
        return Loaded(diagnostics=[error("E006", "an expression is nested too deeply",
                                         ir.Span(file=file), f"keep expressions under {MAX_DEPTH} levels; "
                                         "split them into derived variables (`let`)")], sources=sources)
    digest = hashlib.sha256()
    for f in sources:
        digest.update(sources[f].encode("utf-8"))
    scenario.source_hash = digest.hexdigest()[:16]
    scenario.files = list(sources)
    return Loaded(scenario=scenario, diagnostics=diags, sources=sources)


def _reason(exc: Exception) -> str:
    if isinstance(exc, UnicodeDecodeError):
        return "not UTF-8 text"
    return getattr(exc, "strerror", None) or str(exc)


def _include_target(item: Any, base: Path, roots: Sequence[Path]) -> Path:
    """The file an `include` names, if the sandbox allows it: a `.sop` file inside the main file's
    directory tree or an `--include-path` directory. Raises `ReadRefused` otherwise."""
    if "\0" in item.path:
        raise ReadRefused("the path contains a NUL byte", "remove the NUL character from the path")
    if not item.path.endswith(".sop"):
        raise ReadRefused("only `.sop` files can be included", "name a file ending in `.sop`")
    target = (base / item.path).resolve()
    if not any(target == r or target.is_relative_to(r) for r in roots):
        raise ReadRefused("it lies outside the main file's directory",
                          "include files under the main file's directory, or name their directory with "
                          "`sop --include-path DIR`")
    return target


def _collect_includes(program: Program, base: Path, chain: list[str], programs: list[Program],
                      sources: dict[str, str], diags: list[Diagnostic], roots: Sequence[Path] = ()) -> None:
    for item in program.items:
        if not isinstance(item, Include):
            continue
        shown = clip(item.path.replace("\0", "\\0"))
        try:
            target = _include_target(item, base, roots or [base])
        except ReadRefused as exc:
            diags.append(error("E003", f"cannot include `{shown}`: {exc}", item.span, exc.hint))
            continue
        key = str(target)
        if key in chain:
            diags.append(error("E004", f"include cycle: {' -> '.join(Path(c).name for c in chain)} -> "
                               f"{target.name}", item.span))
            continue
        if any(str(Path(p.file).resolve()) == key for p in programs):
            continue  # included twice through different routes: once is enough
        try:
            text = read_sop_file(target).replace("\r\n", "\n")
        except ReadRefused as exc:
            diags.append(error("E003", f"cannot include `{shown}`: {exc}", item.span,
                               exc.hint or "include paths are relative to the including file"))
            continue
        sources[str(target)] = text
        try:
            sub = parse_text(text, str(target))
        except SopError as exc:
            diags.extend(exc.diagnostics)
            continue
        programs.append(sub)
        _collect_includes(sub, target.parent, chain + [key], programs, sources, diags, roots)


def _merge(programs: list[Program], diags: list[Diagnostic], texts: Iterable[str] | None = None) -> ir.Scenario:
    """One scenario from the main program and its includes. `texts` (every source the programs were
    parsed from, when known) lets the search for an undeclared `now` skip programs that never write it."""
    header: ScenarioHeader | None = None
    variables: dict[str, ir.Variable] = {}
    actions: dict[str, ir.Action] = {}
    outputs: dict[str, ir.Output] = {}
    stages: dict[str, ir.Stage] = {}
    subflows: dict[str, Subflow] = {}
    uses: list[Use] = []
    start: StartDecl | None = None
    aliases: dict[str, TypeDecl] = {}
    seen: dict[str, tuple[str, ir.Span]] = {}  # every top-level name shares one namespace

    def declare(name: str, kind: str, span: ir.Span) -> bool:
        if name in seen:
            prev_kind, prev = seen[name]
            diags.append(error("E102", f"`{name}` is already declared as {prev_kind} at {prev}", span,
                               "rename one of them"))
            return False
        seen[name] = (kind, span)
        return True

    # The main file comes first, so its stages come first: the first stage is the entry.
    for program in programs:
        for item in program.items:
            kind = type(item)
            if kind is ir.Stage or kind is ir.Variable:  # most items of a large file: by exact type, as below
                name, what = (item.id, "a stage") if kind is ir.Stage else (item.name, f"a {item.role} variable")
                if name in seen:
                    declare(name, what, item.span)
                else:
                    seen[name] = (what, item.span)
                    (stages if kind is ir.Stage else variables)[name] = item
                continue
            if isinstance(item, ScenarioHeader):
                if program is programs[0] and header is None:
                    header = item
            elif isinstance(item, ir.Variable):
                if declare(item.name, f"a {item.role} variable", item.span):
                    variables[item.name] = item
            elif isinstance(item, ir.Action):
                if item.name in actions:
                    diags.append(error("E102", f"action `{item.name}` is already declared at "
                                       f"{actions[item.name].span}", item.span, "rename one of them"))
                else:
                    actions[item.name] = item
            elif isinstance(item, ir.Output):
                if item.name == "Action":
                    diags.append(error("E102", "`Action` is the built-in final output", item.span,
                                       "choose another output name"))
                elif declare(item.name, "an output", item.span):
                    outputs[item.name] = item
            elif isinstance(item, ir.Stage):
                if declare(item.id, "a stage", item.span):
                    stages[item.id] = item
            elif isinstance(item, Subflow):
                if declare(item.name, "a subflow", item.span):
                    subflows[item.name] = item
            elif isinstance(item, Use):
                if declare(item.instance, "a subflow instance", item.span):
                    uses.append(item)
            elif isinstance(item, StartDecl):
                start = start or item
            elif isinstance(item, TypeDecl):  # types have their own namespace: a name is only ever read as a type
                if item.name in aliases:
                    diags.append(error("E102", f"type `{item.name}` is already declared at "
                                       f"{aliases[item.name].span}", item.span, "rename one of them"))
                else:
                    aliases[item.name] = item
    _resolve_aliases(aliases, variables, actions, outputs, diags)
    entries = _inline_subflows(subflows, uses, stages, diags, declare)
    if entries:
        for stage in stages.values():
            for branch in stage.branches:
                _retarget(branch.target, entries)
    start_id = start.stage if start else next(iter(stages), None)
    if start_id in entries:
        start_id = entries[start_id]  # `start gate` names a subflow instance: its first stage
    scenario = ir.Scenario(
        name=header.name if header else Path(programs[0].file).stem,
        title=header.title if header else "",
        description=header.description if header else "",
        meta={m.key: m.value for m in (header.meta if header else [])},
        variables=variables, actions=actions, outputs=outputs, stages=stages,
        start=start_id,
        span=header.span if header else ir.Span(file=programs[0].file),
    )
    _declare_now(scenario, texts)
    _resolve_names(scenario)
    for name in scenario.observed:
        if name in scenario.variables and scenario.variables[name].role == "system":
            scenario.variables[name].observed = True
    return scenario


def _resolve_aliases(aliases: dict[str, TypeDecl], variables: dict[str, ir.Variable],
                     actions: dict[str, ir.Action], outputs: dict[str, ir.Output],
                     diags: list[Diagnostic]) -> None:
    """Replace every `NAME` written as a type by the type of `type NAME = …` (an enum's values, or
    a copy of a record), inside lists and records too."""
    typed: list[Any] = [*variables.values(), *outputs.values()]
    for action in actions.values():
        typed += action.params
    for decl in typed:
        resolved = _resolve_type(decl.type, aliases, diags, [])
        if resolved is not decl.type:  # most types resolve to themselves (`_fix_field`'s reason)
            decl.type = resolved
    for output in outputs.values():
        _canonical_list_default(output)


def _canonical_list_default(output: ir.Output) -> None:
    """A list output's default in the order the engine reports lists, the enum's, each value once (`= [B, A, B]`
    is `[A, B]`), so every reader of `default.value` sees the engine's value."""
    vtype, default = output.type, output.default
    if not (isinstance(default, ir.ListLit) and isinstance(vtype, ir.ListType) and isinstance(vtype.item, ir.EnumType)):
        return
    order = vtype.item.values
    lits = [i for i in default.items if isinstance(i, ir.Lit) and isinstance(i.value, str) and i.value in order]
    if len(lits) != len(default.items):
        return  # a value not of the enum: the checker reports it
    keep: dict[str, ir.Lit] = {}
    for lit in sorted(lits, key=lambda i: order.index(str(i.value))):
        keep.setdefault(str(lit.value), lit)
    default.items = list(keep.values())
    default.conds = [ir.Lit(value=True) for _ in keep]


def _resolve_type(vtype: Any, aliases: dict[str, TypeDecl], diags: list[Diagnostic], chain: list[str]) -> Any:
    if isinstance(vtype, ir.ListType):
        vtype.item = _resolve_type(vtype.item, aliases, diags, chain)
        return vtype
    if isinstance(vtype, ir.RecordType):
        for field in vtype.fields:
            field.type = _resolve_type(field.type, aliases, diags, chain)
        return vtype
    if not isinstance(vtype, ir.EnumType) or vtype.alias is None or vtype.values:
        return vtype
    alias = aliases.get(vtype.alias)
    if alias is None:
        diags.append(error("E101", f"undefined type `{vtype.alias}`", vtype.span,
                           did_you_mean(vtype.alias, aliases)
                           or "declare it with `type NAME = A | B`, or write the values `A | B`"))
        return vtype
    if isinstance(alias.type, ir.EnumType):
        vtype.values = list(alias.type.values)
        return vtype
    if alias.name in chain:
        diags.append(error("E101", f"record type `{alias.name}` contains itself: "
                           + " -> ".join([*chain, alias.name]), vtype.span,
                           "a record cannot hold a value of its own type; use a list of another record"))
        return vtype
    record = alias.type.model_copy(deep=True)
    record.alias = alias.name
    return _resolve_type(record, aliases, diags, [*chain, alias.name])


def _retarget(target: ir.Target, entries: dict[str, str]) -> None:
    if target.kind == "stage" and target.stage in entries:
        target.stage = entries[target.stage]


def _inline_subflows(subflows: dict[str, Subflow], uses: list[Use], stages: dict[str, ir.Stage],
                     diags: list[Diagnostic], declare) -> dict[str, str]:
    """Expand each `use S as I(p -> t)` into stages `I.<id>` (a subflow's own `use`s nest as
    `I.J.<id>`); returns instance → entry stage id."""
    entries: dict[str, str] = {}
    for use in uses:
        entry = _expand_use(use, "", {}, subflows, stages, diags, declare, [])
        if entry is not None:
            entries[use.instance] = entry
    return entries


def _bind_target(tgt: ir.Target, params: list[str], bindings: dict[str, ir.Target], local: set[str],
                 nested: dict[str, str], prefix: str) -> ir.Target:
    """A target written inside a subflow, made absolute for one instance (`prefix` = `I.`)."""
    if tgt.kind != "stage" or tgt.stage is None:
        return tgt
    name = tgt.stage
    if name in params and name in bindings:
        bound = bindings[name].model_copy(deep=True)
        bound.steps = [*tgt.steps, *bound.steps]
        return bound
    if name in local or name.split(".")[0] in nested:
        tgt.stage = nested.get(name, prefix + name)
    return tgt


def _expand_use(use: Use, outer: str, outer_fix: dict[str, Any], subflows: dict[str, Subflow],
                stages: dict[str, ir.Stage], diags: list[Diagnostic], declare,
                chain: list[str]) -> str | None:
    """Copy the stages of one `use` (and of the `use`s inside its subflow); returns the entry id."""
    sub = subflows.get(use.subflow)
    if sub is None:
        diags.append(error("E105", f"undefined subflow `{use.subflow}`", use.span,
                           did_you_mean(use.subflow, subflows)))
        return None
    if sub.name in chain:
        diags.append(error("E105", f"subflow `{sub.name}` uses itself: {' -> '.join([*chain, sub.name])}",
                           use.span, "a subflow may use other subflows, but not itself"))
        return None
    if not sub.stages and not sub.uses:
        return None
    for param in sub.params:
        if param not in use.bindings:
            diags.append(error("E105", f"`use {use.subflow}` does not bind parameter `{param}`",
                               use.span, f"add `{param} -> <stage or do Action>`"))
    for bound in use.bindings:
        if bound not in sub.params:
            diags.append(error("E105", f"subflow `{sub.name}` has no parameter `{bound}`", use.span,
                               did_you_mean(bound, sub.params)))
    bindings = {k: outer_fix["fix"](v) if outer_fix else v for k, v in use.bindings.items()}
    prefix = outer + use.instance + "."
    local = {s.id for s in sub.stages}
    nested: dict[str, str] = {}

    def fix(tgt: ir.Target) -> ir.Target:
        return _bind_target(tgt.model_copy(deep=True), sub.params, bindings, local, nested, prefix)

    for inner in sub.uses:
        entry = _expand_use(inner, prefix, {"fix": fix}, subflows, stages, diags, declare, [*chain, sub.name])
        if entry is not None:
            nested[inner.instance] = entry
    for stage in sub.stages:
        copy = stage.model_copy(deep=True)
        copy.id = prefix + stage.id
        copy.origin = (outer + use.instance)
        for branch in copy.branches:
            branch.target = _bind_target(branch.target, sub.params, bindings, local, nested, prefix)
        if declare(copy.id, "a stage", copy.span):
            stages[copy.id] = copy
    if sub.stages:
        return prefix + sub.stages[0].id
    return next(iter(nested.values()), None)


def _resolve_var(expr: ir.Var, names: dict[str, ir.Variable], scope: frozenset[str]) -> Any:
    """A written name: a variable, an item variable (`s` in `any(s in L where …)`), a dotted field
    access (`Metrics.latency`, `s.flown`), or else an enum value."""
    if expr.name in scope:
        return ir.Item(name=expr.name, span=expr.span)
    if expr.name in names:
        return expr
    head, *fields = expr.name.split(".")
    if not fields or (head not in names and head not in scope):
        return ir.Lit(value=expr.name, bare=True, span=expr.span)
    sp = expr.span
    end = sp.col + len(head)
    base: Any = (ir.Item(name=head, span=sp.replace(end_col=end)) if head in scope
                 else ir.Var(name=head, span=sp.replace(end_col=end)))
    for field in fields:
        end += 1 + len(field)
        base = ir.Get(base=base, field=field, span=sp.replace(end_col=end))
    return base


def _fix_data(expr: Any, scope: frozenset[str], fix: Any) -> None:
    """Name resolution inside the list/record expressions (an item variable is in scope only in the
    condition of its own `any`/`all`/`count(… where …)`, and in the value of its `sum(… for …)`)."""
    if isinstance(expr, ir.Get):
        expr.base = fix(expr.base, scope)
    elif isinstance(expr, ir.Quant):
        expr.source = fix(expr.source, scope)
        expr.cond = fix(expr.cond, scope | {expr.var})
        if expr.value is not None:  # `sum(x.amount for x in L …)`: the item is in scope in the value too
            expr.value = fix(expr.value, scope | {expr.var})
    elif isinstance(expr, ir.Length):
        expr.operand = fix(expr.operand, scope)
    elif isinstance(expr, ir.Member):
        expr.operand = fix(expr.operand, scope)
        expr.source = fix(expr.source, scope)
    elif isinstance(expr, ir.Weighted):
        expr.args = [fix(a, scope) for a in expr.args]
    elif isinstance(expr, ir.Index):
        expr.base = fix(expr.base, scope)


NOW = "now"
# read by agents, users and judges in their prompts: no command-line advice here (errors give it)
NOW_DESCRIPTION = ("The current date and time: the reference for every date comparison. It is given with "
                   "each conversation, never read from a clock.")


def scenario_expressions(scenario: ir.Scenario) -> list[Any]:
    """Every top-level expression of a scenario (derived values, subjects, guards, assignments)."""
    out: list[Any] = [v.expr for v in scenario.variables.values() if v.expr is not None]
    for stage in scenario.stages.values():
        if stage.subject is not None:
            out.append(stage.subject)
        for branch in stage.branches:
            if branch.guard is not None:
                out.append(branch.guard)
            target = branch.target
            if target.outputs or target.args or target.steps:  # most targets have none: no lists built
                out += [a.value for a in [*target.outputs, *target.args]] + [x for c in target.steps for x in c.exprs()]
    return out


_NOW_WORD = re.compile(r"(?<![A-Za-z0-9_])now(?![A-Za-z0-9_])")


def _declare_now(scenario: ir.Scenario, texts: Iterable[str] | None = None) -> None:
    """A program that reads `now` without declaring it gets it as a system variable of type
    `datetime`: the reference time given per case or per decision (never a wall-clock read).
    A `Var` named `now` comes from the word `now` written in a source: when `texts` (all sources)
    has none, there is nothing to find and the expressions are not walked."""
    if NOW in scenario.variables:
        return
    if texts is not None and not any(NOW in text and _NOW_WORD.search(text) for text in texts):
        return
    stack = scenario_expressions(scenario)
    children, var = ir.children, ir.Var
    while stack:
        e = stack.pop()
        if type(e) is var or isinstance(e, var):
            if e.name == NOW:
                scenario.variables[NOW] = ir.Variable(name=NOW, role="system", type=ir.TimeType(kind="datetime"),
                                                      description=NOW_DESCRIPTION, span=e.span)
                return
            continue
        kids = children(e)
        if kids:
            stack.extend(kids)


def _derived_reads(scenario: ir.Scenario) -> dict[str, list[str]]:
    """The derived variables each derived variable's definition reads (walked without recursion)."""
    derived = {v.name for v in scenario.derived}
    reads: dict[str, list[str]] = {}
    for var in scenario.derived:
        found: dict[str, None] = {}
        stack = [var.expr] if var.expr is not None else []
        while stack:
            node = stack.pop()
            if isinstance(node, ir.Var) and node.name in derived:
                found[node.name] = None
            stack.extend(ir.children(node))
        reads[var.name] = list(found)
    return reads


def _long_derived_chain(scenario: ir.Scenario) -> Diagnostic | None:
    """E006 for a derived variable defined through more than `MAX_DERIVED_CHAIN` derived variables, one
    reading the next (`let X2 = X1 + 1`, `let X3 = X2 + 1`, …): path listing, the solver and the checker
    follow a definition into the ones it reads recursively. A cycle (E205, the checker's) counts once."""
    reads = _derived_reads(scenario)
    length: dict[str, int] = {}  # longest chain from a variable down (itself counted)
    for root in reads:
        stack: list[tuple[str, int]] = [(root, 0)]
        on_stack = {root}
        while stack:
            name, i = stack[-1]
            below = reads.get(name, [])
            if i < len(below):
                stack[-1] = (name, i + 1)
                nxt = below[i]
                if nxt not in length and nxt not in on_stack:
                    stack.append((nxt, 0))
                    on_stack.add(nxt)
                continue
            stack.pop()
            on_stack.discard(name)
            length[name] = 1 + max((length.get(n, 0) for n in below), default=0)
            if length[name] > MAX_DERIVED_CHAIN:
                var = scenario.variables[name]
                first = next(n for n in below if length.get(n, 0) == length[name] - 1)
                return error("E006", f"derived chain too long: `{name}` reads `{first}`, which reads another "
                             f"derived variable, and so on, {length[name]} deep (at most {MAX_DERIVED_CHAIN})",
                             var.span, "define it from fewer intermediate `let`s (or give the value as a system "
                             "variable)")
    return None


def resolve_expression(expr: Any, variables: dict[str, ir.Variable]) -> Any:
    """One parsed expression's names resolved as the loader resolves a program's (enum values, dotted
    field accesses, item variables); used for conditions written outside a `.sop` (profile intents).
    The expression is updated in place: pass a fresh parse."""
    return _fixer(variables)(expr)


def _fixer(names: dict[str, ir.Variable]) -> Callable[..., Any]:
    def fix(expr: Any, scope: frozenset[str] = frozenset()) -> Any:
        kind = type(expr)
        if kind is ir.Lit:
            return expr
        if kind is ir.Var or isinstance(expr, ir.Var):
            if not scope and expr.name in names:
                return expr  # a variable: most names (as `_resolve_var` answers, without the call)
            return _resolve_var(expr, names, scope)
        if kind is ir.InSet:  # the commonest guards first, by exact type (a subclass takes the chain below)
            _fix_field(expr, "operand", fix(expr.operand, scope))
        elif kind is ir.Compare:
            _fix_field(expr, "left", fix(expr.left, scope))
            _fix_field(expr, "right", fix(expr.right, scope))
        elif isinstance(expr, ir.Unary):
            _fix_field(expr, "operand", fix(expr.operand, scope))
        elif isinstance(expr, (ir.Binary, ir.Compare)):
            _fix_field(expr, "left", fix(expr.left, scope))
            _fix_field(expr, "right", fix(expr.right, scope))
        elif isinstance(expr, ir.InSet):
            _fix_field(expr, "operand", fix(expr.operand, scope))
        elif isinstance(expr, ir.BoolOp):
            expr.operands = [fix(o, scope) for o in expr.operands]
        elif isinstance(expr, (ir.Call, ir.Func)):
            expr.args = [fix(a, scope) for a in expr.args]
        elif isinstance(expr, ir.Matches):
            _fix_field(expr, "operand", fix(expr.operand, scope))
        elif isinstance(expr, ir.CaseExpr):
            for arm in expr.arms:
                arm.when = fix(arm.when, scope)
                arm.then = fix(arm.then, scope)
            expr.otherwise = fix(expr.otherwise, scope)
        elif isinstance(expr, (ir.Get, ir.Quant, ir.Length, ir.Member, ir.Weighted, ir.Index)):
            _fix_data(expr, scope, fix)
        elif isinstance(expr, ir.ListLit):  # `[Billing, Network when NoSignal]`
            expr.items = [fix(i, scope) for i in expr.items]
            expr.conds = [fix(c, scope) for c in expr.conds]
        return expr

    return fix


def _fix_field(node: Any, name: str, value: Any) -> None:
    """`node.<name> = value`, skipped when it is already that object (most names resolve to the
    `Var` written there): a model's `__setattr__` costs about a microsecond, a million times."""
    if getattr(node, name) is not value:
        setattr(node, name, value)


def _named(expr: Any, names: dict[str, ir.Variable]) -> bool:
    """Whether `expr` is a `Var` naming a variable: name resolution leaves it as it is."""
    return type(expr) is ir.Var and expr.name in names


def _resolve_names(scenario: ir.Scenario) -> None:
    """Bare identifiers that are not variables become enum-value literals (checked later); dotted
    names become field accesses; item variables of `any`/`all`/`count(… where …)` become `Item`s."""
    names = scenario.variables
    fix = _fixer(names)
    for var in names.values():
        if var.expr is not None:
            _fix_field(var, "expr", fix(var.expr))
    for stage in scenario.stages.values():
        subject = stage.subject
        if subject is not None:
            subject = fix(subject)
            _fix_field(stage, "subject", subject)
        for branch in stage.branches:
            guard: Any = branch.guard
            if guard is not None:
                kind = type(guard)
                if kind is ir.InSet and subject is not None and branch.values:
                    # a match arm's test: its operand becomes the resolved subject (its values are
                    # literals), which is what resolving it and then replacing its operand gives
                    _fix_field(guard, "operand", subject)
                elif not (kind is ir.Var and guard.name in names  # a variable, or one compared with a
                          or kind is ir.Compare and _named(guard.left, names)  # literal or a variable:
                          and (type(guard.right) is ir.Lit or _named(guard.right, names))):  # resolved as is
                    guard = fix(guard)
                    _fix_field(branch, "guard", guard)
                    if subject is not None and branch.values and isinstance(guard, ir.InSet):
                        _fix_field(guard, "operand", subject)
            target = branch.target
            if not (target.outputs or target.args or target.steps):
                continue  # most targets: nothing to resolve
            for assign in target.outputs:
                _fix_field(assign, "value", fix(assign.value))
            for assign in target.args:
                _fix_field(assign, "value", fix(assign.value))
            for call in target.steps:
                scope = frozenset() if call.each is None else frozenset((call.each,))
                if call.source is not None:
                    _fix_field(call, "source", fix(call.source))
                if call.cond is not None:
                    _fix_field(call, "cond", fix(call.cond, scope))
                for assign in call.args:
                    _fix_field(assign, "value", fix(assign.value, scope))

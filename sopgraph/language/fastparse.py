"""The parser's fast path: a hand-written recursive-descent reader of the language that builds the SAME
raw program (equal nodes, equal spans) as the Lark parser in `parse`.

Why: Lark's LALR parser with its lexer and tree callbacks costs about 0.3 ms per stage (a 100k-stage
file took 30 s of CPU just to parse); this reader takes a fraction of it. And building Lark's parser
costs a few hundred milliseconds of every command that needs it: every form of a valid file (lists,
records, `type` declarations, `sum(… for …)`, field reads, positions, for-each steps, subflows, uses)
is read here, so checking a valid file does not build it (`sop fmt` still does, for the comments). It
is a fast path, not a second parser: each top-level item it does not fully recognise (anything
malformed, any word it does not expect, a number of more than 300 digits) is handed to Lark as a fragment placed at the same line and column,
and a fragment Lark rejects makes the whole file go through Lark, so every diagnostic for malformed
input is exactly Lark's. Spans follow the Lark builder's rule (`larkparse._ChildMeta`): a node spans from
its first to its last positioned child, keywords not counted (the named tokens `sum`, `[` and `]`
count). Where Lark's contextual lexer reads a word as a keyword (`sum` where an expression starts,
`for` where a target stands, `date` or `list` where a type is written), it is no name here either.
tests/test_fastparse.py proves the two paths build equal programs.
"""

from __future__ import annotations

import keyword
import math
import re
from bisect import bisect_left
from collections.abc import Callable
from sys import intern
from typing import Any

from sopgraph.language import ir, scalars
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

_ASCII_NAME = r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*"
_ANY_NAME = r"[^\W\d]\w*(?:\.[^\W\d]\w*)*"  # letters of any script, digits, `_` (the grammar's NAME)
_GOES_ON = frozenset(("->", "(", "{"))  # after a target: steps, arguments or outputs follow


_Q_NL = r"[ \t]*\n[ \t\n]*"  # a line break, blank lines and indentation (whole-stage regexes)
_Q_END = r"(?=[ \t]*\n)"  # nothing more on the line
_Q_CLOSE = re.compile(rf"{_Q_NL}\}}")


class _Syntax:
    """The fast path's regexes for one spelling of names. An ASCII file (nearly all) is read with ASCII
    name classes, a file with any other character with the grammar's own (letters of every script):
    the Unicode classes cost a few per cent of the parse of a 100k-stage file."""

    def __init__(self, name: str):
        # One token after optional whitespace and comments (the grammar's %ignore WS / COMMENT). Kinds:
        # n NAME, d NUMBER, l LONG_STRING, s STRING, o operator or punctuation. The skip is possessive
        # (`*+`): a comment ending the file must not give its last characters back as a token
        # (`field A: bool # x?` with no line break after it would read `?`).
        self.token = re.compile(rf'''(?:[ \t\f\r\n]+|(?:\#|//)[^\n]*)*+(?:
            (?P<n>{name})
           |(?P<d>[0-9]+(?:\.[0-9]+)?)
           |(?P<l>"""[\s\S]*?""")
           |(?P<s>"(?:[^"\\\n]|\\.)*")
           |(?P<o>->|==|!=|<=|>=|\.\.|[<>{{}}()\[\],:=|?+\-*/.])
        )''', re.X)
        self.simple_arm = re.compile(rf"({name}|[0-9]+(?:\.[0-9]+)?)[ \t]*->[ \t]*({name})")
        # `when NAME [CMP NUMBER-or-NAME] -> [do] NAME` and `otherwise -> [do] NAME` on one line: the
        # commonest arms of large files, read with one regex (groups: guard name, operator, operand, `do`,
        # target name)
        self.when_arm = re.compile(rf"when[ \t]+({name})(?:[ \t]*(==|!=|<=|>=|<|>)[ \t]*([0-9]+(?:\.[0-9]+)?|{name}))?"
                                   rf"[ \t]*->[ \t]*(?:(do)[ \t]+)?({name})")
        self.otherwise_arm = re.compile(rf"otherwise()()()[ \t]*->[ \t]*(?:(do)[ \t]+)?({name})")
        # Heads of the commonest items, read with one regex each; anything else goes to the token reader.
        self.stage_head = re.compile(rf'stage[ \t]+({name})[ \t]+("(?:[^"\\\n]|\\.)*")[ \t]*\{{')  # `stage ID "title" {{`
        self.match_head = re.compile(rf"match[ \t]+({name})[ \t]*\{{")  # `match NAME {{`
        # `field|system NAME: TYPE` with TYPE `bool`, `int[lo..hi]`/`float[lo..hi]` (integer bounds) or `A | B | ...`
        self.decl_head = re.compile(rf"(?:field|system)[ \t]+({name})[ \t]*:[ \t]*(?:(bool)(?![\w.])"
                                    rf"|(int|float)[ \t]*\[[ \t]*(-?[0-9]{{1,18}})[ \t]*\.\.[ \t]*(-?[0-9]{{1,18}})[ \t]*\]"
                                    rf"|({name}(?:[ \t]*\|[ \t]*{name})+))")
        self.names = re.compile(name)
        # A whole stage of the commonest shapes, one line per item: the head (`stage_head`), then either
        # a `match NAME {` block of `VALUE -> [do] NAME` arms (and an `otherwise` arm) or `when` arms (and
        # an `otherwise` arm), then the closing braces (`_Q_CLOSE`). Each item is one regex starting at the
        # previous item's end: a line break (blanks allowed) first, nothing after it on its line. Anything
        # else (a comment, a text, steps, `up to`, `otherwise when`, an item going on on the next line)
        # puts the reader back (`_Items.quick_stage`).
        self.q_match = re.compile(rf"{_Q_NL}match[ \t]+({name})[ \t]*\{{")
        self.q_match_arm = re.compile(rf"{_Q_NL}({name}|[0-9]+(?:\.[0-9]+)?)[ \t]*->[ \t]*(?:(do)[ \t]+)?({name}){_Q_END}")
        self.q_when = re.compile(rf"{_Q_NL}{self.when_arm.pattern}{_Q_END}")  # groups as `when_arm`'s
        self.q_otherwise = re.compile(rf"{_Q_NL}{self.otherwise_arm.pattern}{_Q_END}")  # as `otherwise_arm`'s


_ASCII = _Syntax(_ASCII_NAME)
_ANY_SCRIPT = _Syntax(_ANY_NAME)
_SKIP = re.compile(r"(?:[ \t\f\r\n]+|(?:#|//)[^\n]*)*")
_TIME_UNITS = frozenset(("week", "weeks", "day", "days", "hour", "hours", "minute", "minutes", "second",
                         "seconds"))
_COMP = frozenset(("==", "!=", "<", "<=", ">", ">="))
# Words Lark reads as keywords where a target or an expression starts (not names there, though not reserved)
_NO_TARGET = RESERVED | {"for"}
_NO_OPERAND = RESERVED | {"sum"}
_TYPE_WORDS = frozenset(("date", "datetime", "duration", "string", "list", "record"))  # types' (non-reserved) words
_TOP = frozenset(("scenario", "include", "start", "field", "system", "let", "action", "output", "stage",
                  "subflow", "use"))
MAX_FALLBACKS = 64  # items handed to Lark one by one; past this the whole file goes to Lark
_new = object.__new__
_set = object.__setattr__


class _Bail(Exception):
    """The fast path does not recognise what it reads here: Lark takes the item."""


# ---------------------------------------------------------------------------------------------
# Nodes built without validation (the values are the ones the validated path would hold)

_MAKERS: dict[type, Callable[..., Any]] = {}
_FRESH = object()  # "no value given": the field's mutable default is made fresh


def _maker(cls: type) -> Callable[..., Any]:
    """A function building `cls` from keyword values without validation: each field set on the new
    object in field order, the model's defaults, a fresh list/dict/factory value for mutable defaults,
    the class's shared fields set (see `ir.share_fields_set`). Generated once per class: it is the
    inner loop. Why field by field and not one `__dict__` (as pydantic's `model_construct` does): set
    one by one, in the same order every time, the values stay inline in the object (CPython's shared
    keys) and no dict is made, ~250 bytes less a node; a 100k-stage check then holds ~230 MB less, and
    is ~10 % faster for it (fewer pages to fault in, faster attribute reads in every pass). Code here
    that replaces a field of a built node uses `object.__setattr__` too, not `node.__dict__`, which
    would make the dict."""
    fields = cls.model_fields  # type: ignore[attr-defined]
    env: dict[str, Any] = {"_new": _new, "_set": _set, "_cls": cls, "_fields_set": set(fields), "_FRESH": _FRESH}
    params, entries = [], []
    for i, (name, f) in enumerate(fields.items()):
        if keyword.iskeyword(name) or not name.isidentifier():
            raise ValueError(f"field {name!r} of {cls.__name__} cannot be a parameter")
        if f.default_factory is not None:
            env[f"_f{i}"] = f.default_factory
            fresh = f"_f{i}()"
        elif type(f.default) in (list, dict):
            fresh = "[]" if type(f.default) is list else "{}"
        else:
            env[f"_d{i}"] = f.default
            params.append(f"{name}=_d{i}")
            entries.append(f"    _set(obj, {name!r}, {name})\n")
            continue
        params.append(f"{name}=_FRESH")
        entries.append(f"    _set(obj, {name!r}, {fresh} if {name} is _FRESH else {name})\n")
    code = (f"def make(*, {', '.join(params)}):\n"
            "    obj = _new(_cls)\n"
            + "".join(entries) +
            "    _set(obj, '__pydantic_fields_set__', _fields_set)\n"
            "    _set(obj, '__pydantic_extra__', None)\n"
            "    _set(obj, '__pydantic_private__', None)\n"
            "    return obj\n")
    exec(code, env)  # noqa: S102 - code generated above from the model's own field names
    maker: Callable[..., Any] = env["make"]
    _MAKERS[cls] = maker
    return maker


def mk(cls: type, **kw: Any) -> Any:
    """An instance of the IR model `cls` equal to `cls(**kw)` for values of the right type, built
    without validation (about 10x cheaper: a 100k-stage program has a million nodes). Mutable
    defaults get a fresh copy, as pydantic gives them."""
    return (_MAKERS.get(cls) or _maker(cls))(**kw)


_var = _maker(ir.Var)
_lit = _maker(ir.Lit)
_target = _maker(ir.Target)
_branch = _maker(ir.Branch)
_inset = _maker(ir.InSet)
_compare = _maker(ir.Compare)
_stage = _maker(ir.Stage)
_variable = _maker(ir.Variable)
_enum_type = _maker(ir.EnumType)
_bool_type = _maker(ir.BoolType)
_num_type = _maker(ir.NumType)
_make_span = ir.make_span


def _list_bound(value: float, is_open: bool, step: int) -> int:
    """A list's length bound as a whole number (an open bound excludes its value): `larkparse._list_bound`."""
    n = math.ceil(value) if step > 0 else math.floor(value)
    return int(n + step) if is_open and float(value).is_integer() else int(n)


def _first_last(parts: tuple[Any, ...]) -> tuple[ir.Span | None, ir.Span | None]:
    first = last = None
    for part in parts:
        for item in (part if type(part) is list else (part,)):
            span = item if type(item) is ir.Span else getattr(item, "span", None)
            if span is not None and span.line:
                if first is None:
                    first = span
                last = span
    return first, last


def _plain_values(values: list[Any]) -> list[Any]:
    """Values of a set or a match arm must be plain literals (`ir.InSet.values` is a list of `Lit`):
    a duration there fails the validated path's node, so Lark reports it."""
    if any(type(v) is not ir.Lit for v in values):
        raise _Bail
    return values


def _arm_ok(m: re.Match[str]) -> bool:
    """An arm matched by `_Syntax.when_arm`/`otherwise_arm` the regex may build: no reserved word where a
    name stands, no huge number (Lark reports those)."""
    guard_name, operand, target_name = m.group(1, 3, 5)
    if target_name in _NO_TARGET or guard_name in _NO_OPERAND or operand in _NO_OPERAND:
        return False
    return not (operand and operand[0].isdigit() and len(operand) > 300)


class _Reader:
    """Tokens read one at a time with a regex; the current token is (k, v, s, e)."""

    def __init__(self, text: str, file: str):
        self.text = text
        self.file = file
        self.syntax = _ASCII if text.isascii() else _ANY_SCRIPT
        self.newlines = [m.start() for m in re.finditer("\n", text)]
        self.nowhere = ir.make_span(file, 0, 0, 0, 0)  # the span of a rule without positioned children
        self.e = 0
        self.k = self.v = ""
        self.s = 0
        self.advance()

    # -- tokens
    def advance(self) -> None:
        m = self.syntax.token.match(self.text, self.e)
        if m is None:
            end = _SKIP.match(self.text, self.e).end()  # type: ignore[union-attr] # always matches
            if end < len(self.text):
                raise _Bail
            self.k, self.v, self.s, self.e = "$", "", end, end
            return
        k = m.lastgroup
        assert k is not None
        self.k, self.v, self.s, self.e = k, m.group(k), m.start(k), m.end()

    def at(self, value: str) -> bool:
        return self.v == value and self.k != "s" and self.k != "l"

    def expect(self, value: str) -> None:
        if self.v != value or self.k == "s" or self.k == "l":
            raise _Bail
        self.advance()

    def span_at(self, start: int, end: int) -> ir.Span:
        """The span of text[start:end]."""
        nl = self.newlines
        i = bisect_left(nl, start)
        col = start - (nl[i - 1] if i else -1)
        line = end_line = i + 1
        end_col = col + end - start
        if self.text.find("\n", start, end) >= 0:
            j = bisect_left(nl, end)
            end_line, end_col = j + 1, end - (nl[j - 1] if j else -1)
        return _make_span(self.file, line, col, end_line, end_col)

    def name(self) -> tuple[str, ir.Span]:
        """A NAME token (not a reserved word) and its span."""
        if self.k != "n" or self.v in RESERVED:
            raise _Bail
        value, span = intern(self.v), self.span_at(self.s, self.e)  # names recur: one string each
        self.advance()
        return value, span

    def number(self) -> tuple[str, ir.Span]:
        if self.k != "d" or len(self.v) > 300:  # a huge number: Lark reports it
            raise _Bail
        value, span = self.v, self.span_at(self.s, self.e)
        self.advance()
        return value, span

    def string(self) -> tuple[str, ir.Span]:
        if self.k != "s":
            raise _Bail
        value, span = self.v, self.span_at(self.s, self.e)
        self.advance()
        return value, span

    def text_opt(self) -> str | None:
        """A `text` (STRING or LONG_STRING), unquoted, if one comes next."""
        if self.k != "s" and self.k != "l":
            return None
        value = unquote(self.v)
        self.advance()
        return value

    def cover(self, *parts: Any) -> ir.Span:
        """The span of a rule from its children, as `larkparse._span(_ChildMeta(children))` computes it."""
        first, last = _first_last(parts)
        if first is None or last is None:
            return self.nowhere
        if first is last and first.file == self.file:
            return first  # spans are frozen: one object serves both nodes (memory of huge programs)
        return ir.make_span(self.file, first.line, first.col, last.end_line, last.end_col)


# ---------------------------------------------------------------------------------------------
# Expressions


class _Exprs(_Reader):
    def expr(self) -> Any:
        left = self.and_expr()
        while self.k == "n" and self.v == "or":
            self.advance()
            left = self.flatten("or", left, self.and_expr())
        return left

    def and_expr(self) -> Any:
        left = self.not_expr()
        while self.k == "n" and self.v == "and":
            self.advance()
            left = self.flatten("and", left, self.not_expr())
        return left

    def flatten(self, op: ir.LogicOp, head: Any, right: Any) -> Any:
        """As `ToIR._flatten`: a chain of one operator is one `BoolOp`, grown in place."""
        span = self.cover(head, right)
        if type(head) is ir.BoolOp and head.op == op:
            if type(right) is ir.BoolOp and right.op == op:
                head.operands.extend(right.operands)
            else:
                head.operands.append(right)
            _set(head, "span", span)  # as `head.span = ...` does (the fields set holds every name)
            return head
        operands: list[Any] = []
        for child in (head, right):
            if type(child) is ir.BoolOp and child.op == op:
                operands.extend(child.operands)
            else:
                operands.append(child)
        return mk(ir.BoolOp, op=op, operands=operands, span=span)

    def not_expr(self) -> Any:
        if self.k == "n" and self.v == "not":
            self.advance()
            operand = self.not_expr()
            return mk(ir.Unary, op="not", operand=operand, span=self.cover(operand))
        return self.comparison()

    def comparison(self) -> Any:
        left = self.sum()
        k, v = self.k, self.v
        if k == "o" and v in _COMP:
            op_span = self.span_at(self.s, self.e)
            self.advance()
            right = self.sum()
            return mk(ir.Compare, op=v, left=left, right=right, span=self.cover(left, op_span, right))
        if k != "n" or v not in ("in", "not", "matches"):
            return left
        if v == "matches":
            self.advance()
            tok, tok_span = self.string()
            return mk(ir.Matches, operand=left, pattern=tok[1:-1].replace('\\"', '"'), pattern_span=tok_span,
                      span=self.cover(left, tok_span))
        negated = v == "not"
        self.advance()
        if negated:
            self.expect("in")
        if self.at("{"):
            values = self.value_set()
            return _inset(operand=left, values=values, negated=negated, span=self.cover(left, values))
        source = self.sum()
        if type(source) is ir.ListLit:
            raise _Bail  # `X in [A, B]`: Lark's E001 (a set is written in braces)
        return mk(ir.Member, operand=left, source=source, negated=negated, span=self.cover(left, source))

    def value_set(self) -> list[Any]:
        self.expect("{")
        values = [self.value()]
        while self.at(","):
            self.advance()
            values.append(self.value())
        self.expect("}")
        return _plain_values(values)

    def sum(self) -> Any:
        left = self.product()
        while self.k == "o" and (self.v == "+" or self.v == "-"):
            op = self.v
            self.advance()
            right = self.product()
            left = mk(ir.Binary, op=op, left=left, right=right, span=self.cover(left, right))
        return left

    def product(self) -> Any:
        left = self.unary()
        while self.k == "o" and (self.v == "*" or self.v == "/"):
            op = self.v
            self.advance()
            right = self.unary()
            left = mk(ir.Binary, op=op, left=left, right=right, span=self.cover(left, right))
        return left

    def unary(self) -> Any:
        if self.k == "o" and self.v == "-":
            self.advance()
            inner = self.unary()
            value = inner.value if type(inner) is ir.Lit else None
            if type(value) is int or type(value) is float:
                return _lit(value=-value, span=self.cover(inner))
            return mk(ir.Unary, op="neg", operand=inner, span=self.cover(inner))
        out = self.atom()
        while self.k == "o" and (self.v == "." or self.v == "["):
            out = self.get(out) if self.v == "." else self.index(out)
        return out

    def get(self, base: Any) -> Any:
        """`first(Legs).origin` (the grammar's `get_expr`): one `Get` per part of a dotted name, each
        spanning the base and the whole name. (`l.price` is one NAME: a `Var`, as in Lark.)"""
        self.advance()
        name, span = self.name()
        whole = self.cover(base, span)
        for field in name.split("."):
            base = mk(ir.Get, base=base, field=intern(field), span=whole)
        return base

    def index(self, base: Any) -> Any:
        """`Legs[0]` (the grammar's `index_expr`): a whole number in brackets, spanning up to `]`."""
        open_span = self.span_at(self.s, self.e)  # `[` and `]` are named tokens: `true[0]` spans from `[`
        self.advance()
        text, _ = self.number()
        if "." in text or not self.at("]"):
            raise _Bail  # `L[1.5]`: Lark's error
        close = self.span_at(self.s, self.e)
        self.advance()
        return mk(ir.Index, base=base, index=int(text), span=self.cover(base, open_span, close))

    def atom(self) -> Any:
        k, v = self.k, self.v
        if k == "d":
            return self.number_or_duration()
        if k == "s":
            tok, span = self.string()
            return _lit(value=unquote(tok), span=span)
        if k == "o":
            if v == "[":
                return self.list_lit()
            if v != "(":
                raise _Bail
            self.advance()
            inner = self.expr()
            self.expect(")")
            return inner
        if k != "n":
            raise _Bail
        if v in RESERVED:
            return self.keyword_atom(v)
        name, span = self.name()
        if name == "sum":  # where an expression starts, `sum` is the keyword: `sum` alone is Lark's error
            return self.summation(span)
        if not self.at("("):
            return _var(name=name, span=span)
        args = self.args()
        if name in ("date", "datetime"):
            return self.time_literal(name, args, self.cover(span, args))
        return mk(ir.Func, name=name, args=args, span=self.cover(span, args))

    def summation(self, span: ir.Span) -> Any:
        """`sum(V for x in L [where C])` (a `Quant`; without `where` its condition is `true`, spanning the
        whole sum) or `sum(A, B)` (a `Func` the checker refuses). The span starts at `sum` (a named token)."""
        self.expect("(")
        if self.at(")"):
            self.advance()
            return mk(ir.Func, name="sum", args=[], span=span)
        first = self.expr()
        if not self.at("for"):
            args = [first]
            while self.at(","):
                self.advance()
                args.append(self.expr())
            self.expect(")")
            return mk(ir.Func, name="sum", args=args, span=self.cover(span, args))
        self.advance()
        head = self.expr()
        cond = None
        if self.at("where"):
            self.advance()
            cond = self.expr()
        self.expect(")")
        if not (type(head) is ir.Member and not head.negated and type(head.operand) is ir.Var
                and "." not in head.operand.name):
            raise _Bail  # Lark's E001 names the mistake
        whole = self.cover(span, first, head, cond)
        return mk(ir.Quant, func="sum", var=head.operand.name, source=head.source,
                  cond=mk(ir.Lit, value=True, span=whole) if cond is None else cond, value=first, span=whole)

    def list_lit(self) -> Any:
        """`[Billing, Network when NoSignal]` (a list output's value): spans from `[` to `]`; an item
        written without `when` is kept always (a `true` without position)."""
        open_span = self.span_at(self.s, self.e)
        self.advance()
        items: list[Any] = []
        conds: list[Any] = []
        while not self.at("]"):
            if items:
                self.expect(",")
            items.append(self.expr())
            if self.k == "n" and self.v == "when":
                self.advance()
                conds.append(self.expr())
            else:
                conds.append(mk(ir.Lit, value=True))
        close = self.span_at(self.s, self.e)
        self.advance()
        return mk(ir.ListLit, items=items, conds=conds, span=self.cover(open_span, close))

    def args(self) -> list[Any]:
        self.expect("(")
        args: list[Any] = []
        if not self.at(")"):
            args.append(self.expr())
            while self.at(","):
                self.advance()
                args.append(self.expr())
        self.expect(")")
        return args

    def time_literal(self, kind: str, args: list[Any], span: ir.Span) -> ir.TimeLit:
        arg = args[0] if len(args) == 1 else None
        if type(arg) is not ir.Lit or type(arg.value) is not str or arg.bare:
            raise _Bail  # Lark names the mistake
        try:
            value = scalars.parse_temporal(kind, arg.value)
        except scalars.ValueProblem:
            raise _Bail from None
        return mk(ir.TimeLit, unit=kind, value=value, text=arg.value, span=span)

    def number_or_duration(self) -> Any:
        text, span = self.number()
        unit = self.v.partition(".")[0] if self.k == "n" else ""
        if unit in _TIME_UNITS:  # `2 days.x`: Lark's TIME_UNIT stops before the dot (`.x` reads a field)
            unit_span = self.span_at(self.s, self.s + len(unit))
            self.e = self.s + len(unit)
            self.advance()
            seconds = number(text) * scalars.unit_seconds(unit)
            if isinstance(seconds, float) and seconds.is_integer():
                seconds = int(seconds)
            return mk(ir.TimeLit, unit="duration", value=seconds, text=f"{text} {unit}",
                      span=self.cover(span, unit_span))
        return _lit(value=number(text), span=span)

    def keyword_atom(self, word: str) -> Any:
        if word == "true" or word == "false":
            self.advance()
            return _lit(value=word == "true", span=self.cover())
        if word in ("min", "max"):
            self.advance()
            args = self.args()
            if not args:
                raise _Bail
            return mk(ir.Call, func=word, args=args, span=self.cover(args))
        if word == "count":
            self.advance()
            return self.count()
        if word in ("any", "all"):
            self.advance()
            self.expect("(")
            return self.quant(word, self.expr())
        if word == "len":
            self.advance()
            self.expect("(")
            operand = self.expr()
            self.expect(")")
            return mk(ir.Length, operand=operand, span=self.cover(operand))
        if word == "case":
            self.advance()
            return self.case()
        raise _Bail

    def count(self) -> Any:
        self.expect("(")
        saved = (self.k, self.v, self.s, self.e)
        if self.k == "d":
            self.advance()
            weighted = self.at(":")
            self.k, self.v, self.s, self.e = saved
            if weighted:
                return self.weighted()
        first = self.expr()
        if self.at("where"):
            return self.quant("count", first)
        args = [first]
        while self.at(","):
            self.advance()
            args.append(self.expr())
        self.expect(")")
        return mk(ir.Call, func="count", args=args, span=self.cover(args))

    def weighted(self) -> Any:
        parts: list[Any] = []
        while True:
            text, span = self.number()
            self.expect(":")
            arg = self.expr()
            parts.append(mk(ir.Weighted, weights=[number(text)], args=[arg], span=self.cover(span, arg)))
            if not self.at(","):
                break
            self.advance()
        self.expect(")")
        return mk(ir.Weighted, weights=[w for p in parts for w in p.weights], args=[a for p in parts for a in p.args],
                  span=self.cover(parts))

    def quant(self, func: str, head: Any) -> Any:
        self.expect("where")
        cond = self.expr()
        self.expect(")")
        if not (type(head) is ir.Member and not head.negated and type(head.operand) is ir.Var
                and "." not in head.operand.name):
            raise _Bail
        return mk(ir.Quant, func=func, var=head.operand.name, source=head.source, cond=cond,
                  span=self.cover(head, cond))

    def case(self) -> Any:
        self.expect("{")
        arms: list[Any] = []
        while self.at("when"):
            self.advance()
            when = self.expr()
            self.expect("->")
            then = self.expr()
            arms.append(mk(ir.CaseArm, when=when, then=then, span=self.cover(when, then)))
        if not arms:
            raise _Bail
        self.expect("otherwise")
        self.expect("->")
        otherwise = self.expr()
        self.expect("}")
        return mk(ir.CaseExpr, arms=arms, otherwise=otherwise, span=self.cover(arms, otherwise))

    def value(self) -> Any:
        """A value written where the type is known (match arms, sets, defaults)."""
        k = self.k
        if k == "d":
            return self.number_or_duration()
        if k == "o" and self.v == "-":
            self.advance()
            text, span = self.number()
            return _lit(value=number(text, negative=True), span=span)
        if k == "s":
            tok, span = self.string()
            return _lit(value=unquote(tok), span=span)
        if k == "n" and (self.v == "true" or self.v == "false"):
            word = self.v
            self.advance()
            return _lit(value=word == "true", span=self.cover())
        name, span = self.name()
        return _lit(value=name, bare=True, span=span)


# ---------------------------------------------------------------------------------------------
# Declarations and stages


class _Decls(_Exprs):
    """Declarations: the scenario header, fields and system variables with their types, actions, outputs."""

    def meta_block(self) -> list[Any]:
        """`{ key "value" ... }` after the scenario header: any name is a key, reserved words too
        (`money "Penalty"`). Read here, so a header with metadata does not send the file's first item to
        Lark (whose parser is built on first use: a few hundred milliseconds of every command)."""
        self.advance()
        entries: list[Any] = []
        while not self.at("}"):
            if self.k != "n":
                raise _Bail
            key, span = intern(self.v), self.span_at(self.s, self.e)
            self.advance()
            if self.k != "s" and self.k != "l":
                raise _Bail
            entries.append(mk(ir.MetaEntry, key=key, value=self.text_opt(), span=span))
        self.advance()
        return entries

    def vtype(self) -> Any:
        if self.k == "s":  # an enum whose first value is quoted (`"5+ times" | Never`)
            first, span = self.enum_value()
            if not self.at("|"):
                raise _Bail  # one quoted string is no type: Lark says so
            return self.enum_rest(first, span)
        if self.k != "n":
            raise _Bail
        word = self.v
        if word == "bool":
            self.advance()
            return mk(ir.BoolType, span=self.cover())
        if word == "int" or word == "float":
            self.advance()
            bounds = self.range() if self.k == "o" and self.v in ("[", "(") else {}
            return mk(ir.NumType, kind=word, span=self.cover(), **bounds)
        if word in ("date", "datetime", "duration"):
            self.advance()
            return mk(ir.TimeType, kind=word, span=self.cover())
        if word == "string":
            self.advance()
            return mk(ir.StringType, span=self.cover())
        if word == "list":
            return self.list_type()
        if word == "record":
            return self.record_type()
        name, span = self.name()
        if not self.at("|"):
            return mk(ir.EnumType, values=[], alias=name, span=span)
        return self.enum_rest(name, span)

    def enum_rest(self, first: str, span: ir.Span) -> Any:
        """The values of an enum after its first: names or quoted strings."""
        values, last = [first], span
        while self.at("|"):
            self.advance()
            value, last = self.enum_value()
            values.append(value)
        return mk(ir.EnumType, values=values, span=self.cover(span, last))

    def enum_value(self) -> tuple[str, ir.Span]:
        if self.k == "s":
            tok, span = self.string()
            return unquote(tok), span
        return self.name()

    def list_type(self) -> Any:
        """`list[lo..hi] of T`: its length bounds as whole numbers (`_list_bound`), its span the item type's."""
        self.advance()
        kw: dict[str, int] = {}
        if self.k == "o" and self.v in ("[", "("):
            left, lo, hi, right = self.bounds()
            if lo is not None:
                kw["min_len"] = _list_bound(lo, left == "(", +1)
            if hi is not None:
                kw["max_len"] = _list_bound(hi, right == ")", -1)
        self.expect("of")
        item = self.vtype()
        return mk(ir.ListType, item=item, span=self.cover(item), **kw)

    def record_type(self) -> Any:
        """`record [open] { a: T, b: T?, }`: spans from the first field's name to the last's."""
        self.advance()
        is_open = self.k == "n" and self.v == "open"
        if is_open:
            self.advance()
        self.expect("{")
        fields: list[Any] = []
        while True:
            name, span = self.name()
            self.expect(":")
            ftype = self.vtype()
            optional = self.at("?")
            if optional:
                self.advance()
            fields.append(mk(ir.RecordField, name=name, type=ftype, optional=optional, span=span))
            if not self.at(","):
                break
            self.advance()
            if self.at("}"):
                break
        self.expect("}")
        return mk(ir.RecordType, fields=fields, open=is_open, span=self.cover(fields))

    def range(self) -> dict[str, Any]:
        left, lo, hi, right = self.bounds()
        return {"lo": None if lo is None else float(lo), "hi": None if hi is None else float(hi),
                "lo_open": left == "(" or lo is None, "hi_open": right == ")" or hi is None}

    def bounds(self) -> tuple[str, int | float | None, int | float | None, str]:
        """`[lo..hi]`, `(lo..]`, `[..hi)`: the brackets and the bounds as written (None where left out)."""
        left = self.v
        self.advance()
        lo = None if self.at("..") else self.bound()
        self.expect("..")
        hi = None if self.k == "o" and self.v in ("]", ")") else self.bound()
        right = self.v
        if self.k != "o" or right not in ("]", ")"):
            raise _Bail
        self.advance()
        return left, lo, hi, right

    def bound(self) -> int | float:
        negative = self.k == "o" and self.v == "-"
        if negative:
            self.advance()
        return number(self.number()[0], negative=negative)

    def variable(self, role: ir.Role) -> ir.Variable:
        quick = self.quick_decl()
        if quick is None:
            self.advance()
            name, span = self.name()
            self.expect(":")
            quick = name, span, self.vtype()
        name, span, vtype = quick
        kw: dict[str, Any] = {"type": vtype}
        if self.at("?"):
            self.advance()
            kw["optional"] = True
        if self.at("="):
            self.advance()
            kw["default"] = self.value()
        while self.k == "n" and self.v in ("unit", "money", "hidden", "volatile"):
            word = self.v
            self.advance()
            kw[word] = unquote(self.string()[0]) if word == "unit" else True
        text = self.text_opt()
        if text is not None:
            kw["description"] = text
        return _variable(name=name, role=role, span=span, **kw)

    def quick_decl(self) -> tuple[str, ir.Span, Any] | None:
        """`field|system NAME: TYPE` of the commonest one-line shapes (`_Syntax.decl_head`): its name, span and
        type, as the token reader builds them; None for anything else (the token reader takes it)."""
        m = self.syntax.decl_head.match(self.text, self.s)
        if m is None or m.group(1) in RESERVED:
            return None
        enum = m.group(6)
        values = [intern(v) for v in self.syntax.names.findall(enum)] if enum else []
        if any(v in RESERVED for v in values) or (values and values[0] in _TYPE_WORDS):
            return None  # a keyword; or a type's word first (`date | A`): Lark reads the type, then refuses `|`
        saved = (self.k, self.v, self.s, self.e)
        self.e = m.end()
        self.advance()
        if enum and self.k == "o" and self.v == "|":  # the enum goes on (on the next line)
            self.k, self.v, self.s, self.e = saved
            return None
        nl = self.newlines  # the head is on one line: one line number for both spans
        i = bisect_left(nl, m.start(1))
        line, base = i + 1, (nl[i - 1] if i else -1)
        if m.group(2):
            vtype = _bool_type(span=self.nowhere)
        elif enum:
            vtype = _enum_type(values=values, span=_make_span(self.file, line, m.start(6) - base, line, m.end(6) - base))
        else:
            vtype = _num_type(kind=intern(m.group(3)), span=self.nowhere, lo=float(int(m.group(4))),
                              hi=float(int(m.group(5))), lo_open=False, hi_open=False)
        return intern(m.group(1)), _make_span(self.file, line, m.start(1) - base, line, m.end(1) - base), vtype

    def action_name(self) -> tuple[str, ir.Span]:
        if self.k == "s":
            tok, span = self.string()
            return unquote(tok), span
        return self.name()

    def action(self) -> ir.Action:
        self.advance()
        name, span = self.action_name()
        params: list[Any] = []
        if self.at("("):
            self.advance()
            while not self.at(")"):
                if params:
                    self.expect(",")
                pname, pspan = self.name()
                self.expect(":")
                params.append(mk(ir.ActionParam, name=pname, type=self.vtype(), span=pspan))
                if not self.at(")") and not self.at(","):
                    raise _Bail
            self.advance()
        description = self.text_opt() or ""
        attrs: list[tuple[str, ir.Span]] = []
        if self.at("["):
            self.advance()
            if not self.at("]"):
                attrs.append(self.name())
                while self.at(","):
                    self.advance()
                    attrs.append(self.name())
            self.expect("]")
        affects: list[tuple[str, ir.Span]] = []
        if self.k == "n" and self.v == "affects":  # `affects X, Y` (a word with a meaning here only)
            self.advance()
            affects.append(self.name())
            while self.at(","):
                self.advance()
                affects.append(self.name())
        return mk(ir.Action, name=name, description=description, attributes=[a for a, _ in attrs],
                  attribute_spans=[s for _, s in attrs], params=params, span=span,
                  affects=[a for a, _ in affects], affects_spans=[s for _, s in affects])

    def output(self) -> ir.Output:
        self.advance()
        name, span = self.name()
        self.expect(":")
        vtype = self.vtype()
        default = None
        if self.at("="):
            self.advance()
            default = self.list_value() if self.at("[") else self.value()
            if type(default) is ir.TimeLit:  # `= 2 days`: finals report durations as text
                default = _lit(value=scalars.format_temporal(default.unit, default.value), span=default.span)
        return mk(ir.Output, name=name, type=vtype, default=default, description=self.text_opt() or "",
                  span=span)

    def list_value(self) -> Any:
        """`= [Billing, Network]`: a list output's default, values only (each kept always)."""
        open_span = self.span_at(self.s, self.e)
        self.advance()
        items: list[Any] = []
        while not self.at("]"):
            if items:
                self.expect(",")
            items.append(self.value())
        close = self.span_at(self.s, self.e)
        self.advance()
        return mk(ir.ListLit, items=items, conds=[mk(ir.Lit, value=True) for _ in items],
                  span=self.cover(open_span, close))

    def type_decl(self) -> Any:
        """`type Name = A | B | "c d"` (two values at least) or `type Name = record {…}`, and a text."""
        self.advance()
        name, span = self.name()
        self.expect("=")
        if self.k == "n" and self.v == "record":
            vtype = self.record_type()
        else:
            first, first_span = self.enum_value()  # a name here, even `date` or `list`: no type is written
            if not self.at("|"):
                raise _Bail
            vtype = self.enum_rest(first, first_span)
        return mk(TypeDecl, name=name, type=vtype, description=self.text_opt() or "", span=span)


class _QuickStages(_Decls):
    """Whole stages and arms of the commonest one-line shapes, read with one regex per line (the bulk of
    large files), built as the token reader (`_Items`) builds them: same nodes, same spans."""

    def quick_arm(self, pattern: re.Pattern[str], *, ordered: bool = False) -> Any | None:
        """A `when` or `otherwise` arm of the commonest one-line shapes (`_Syntax.when_arm`, `_Syntax.otherwise_arm`),
        read with one regex and built as the token reader builds it (same nodes, same spans); None
        when the arm is anything else, or goes on after its target (the token reader takes it)."""
        m = pattern.match(self.text, self.s)
        if m is None or not _arm_ok(m):
            return None
        saved = (self.k, self.v, self.s, self.e)
        self.e = m.end()
        self.advance()
        if (self.k == "o" and self.v in _GOES_ON) or (self.k == "n" and self.v == "up"):
            self.k, self.v, self.s, self.e = saved
            return None
        return self.arm_nodes(m, ordered)

    def arm_nodes(self, m: re.Match[str], ordered: bool) -> Any:
        """The branch of an arm matched by `_Syntax.when_arm`/`otherwise_arm` (or `q_when`/`q_otherwise`)."""
        guard_name, op, operand, do, target_name = m.group(1, 2, 3, 4, 5)
        nl = self.newlines
        i = bisect_left(nl, m.start(5))
        line, base, file = i + 1, (nl[i - 1] if i else -1), self.file
        target_span = _make_span(file, line, m.start(5) - base, line, m.end(5) - base)
        if do:
            target = _target(kind="action", action=intern(target_name), outputs=[], args=[], span=target_span)
        else:
            target = _target(kind="stage", stage=intern(target_name), span=target_span)
        if not guard_name:
            return _branch(guard=None, target=target, limit=None, span=target_span)
        col = m.start(1) - base
        left = _var(name=intern(guard_name), span=_make_span(file, line, col, line, m.end(1) - base))
        guard = left
        if op is not None:
            right_span = _make_span(file, line, m.start(3) - base, line, m.end(3) - base)
            right = (_lit(value=number(operand), span=right_span) if operand[0].isdigit()
                     else _var(name=intern(operand), span=right_span))
            guard = _compare(op=op, left=left, right=right, span=_make_span(file, line, col, line, right_span.end_col))
        return _branch(guard=guard, target=target, limit=None, ordered=ordered,
                       span=_make_span(file, line, col, line, target_span.end_col))

    def quick_stage(self) -> Any | None:
        """A whole stage of the commonest shapes (`_Syntax.stage_head`, then `q_match` and `q_match_arm`s or
        `q_when`s, a `q_otherwise`, `_Q_CLOSE`s), one regex per line, built as the token reader builds
        it (same nodes, same spans); None for anything else: the token reader takes the stage."""
        text = self.text
        m = self.syntax.stage_head.match(text, self.s)
        if m is None or m.group(1) in RESERVED:
            return None
        head = self.syntax.q_match.match(text, m.end())
        subject = None
        if head is not None:
            if head.group(1) in _NO_OPERAND:
                return None
            subject = _var(name=intern(head.group(1)), span=self.span_at(head.start(1), head.end(1)))
            found = self.quick_match_arms(subject, head.end())
        else:
            found = self.quick_when_arms(m.end())
        if found is None:
            return None
        branches, end = found
        close = _Q_CLOSE.match(text, end)
        if close is None:
            return None
        self.e = close.end()
        self.advance()
        return _stage(id=intern(m.group(1)), title=unquote(m.group(2)), span=self.span_at(m.start(1), m.end(1)),
                      text="", classify=[], observe=[], kind="when" if subject is None else "match", subject=subject,
                      branches=branches)

    def quick_otherwise(self, branches: list[Any], pos: int) -> tuple[list[Any], int] | None:
        """`branches` with an `otherwise -> [do] NAME` line at `pos` (if one is there), and where they end."""
        o = self.syntax.q_otherwise.match(self.text, pos)
        if o is None:
            return branches, pos
        if not _arm_ok(o):
            return None
        branches.append(self.arm_nodes(o, False))
        return branches, o.end()

    def quick_when_arms(self, pos: int) -> tuple[list[Any], int] | None:
        """The `when` lines of a quick stage (and its `otherwise` line), and where they end."""
        branches: list[Any] = []
        while (a := self.syntax.q_when.match(self.text, pos)) is not None:
            if not _arm_ok(a):
                return None
            branches.append(self.arm_nodes(a, False))
            pos = a.end()
        if not branches:
            return None  # `otherwise` alone: the token reader's (and Lark's) error
        return self.quick_otherwise(branches, pos)

    def quick_match_arms(self, subject: Any, pos: int) -> tuple[list[Any], int] | None:
        """The arms of a quick stage's `match` block up to its closing brace, and where they end."""
        text, file, nl, nowhere = self.text, self.file, self.newlines, self.nowhere
        branches: list[Any] = []
        while (a := self.syntax.q_match_arm.match(text, pos)) is not None:
            value, do, target_name = a.group(1, 2, 3)
            if target_name in _NO_TARGET or len(value) > 300:
                return None
            i = bisect_left(nl, a.start(1))
            line, base = i + 1, (nl[i - 1] if i else -1)
            target_span = span = _make_span(file, line, a.start(3) - base, line, a.end(3) - base)
            if value in RESERVED:
                if value != "true" and value != "false":
                    break  # `otherwise` (or a keyword, which the closing brace then refuses)
                lit = _lit(value=value == "true", span=nowhere)
            else:
                col = a.start(1) - base
                value_span = _make_span(file, line, col, line, a.end(1) - base)
                lit = (_lit(value=number(value), span=value_span) if value[0].isdigit()
                       else _lit(value=intern(value), bare=True, span=value_span))
                span = _make_span(file, line, col, line, target_span.end_col)
            if do:
                target = _target(kind="action", action=intern(target_name), outputs=[], args=[], span=target_span)
            else:
                target = _target(kind="stage", stage=intern(target_name), span=target_span)
            guard = _inset(operand=subject, values=[lit], span=span)
            branches.append(_branch(guard=guard, target=target, values=[lit], limit=None, span=span))
            pos = a.end()
        if not branches:
            return None
        found = self.quick_otherwise(branches, pos)
        if found is None:
            return None
        close = _Q_CLOSE.match(text, found[1])
        return None if close is None else (found[0], close.end())


class _Items(_QuickStages):
    """Top-level items (`item`) and stages with their decisions, arms and targets."""

    def item(self) -> Any:
        word = self.v if self.k == "n" else ""
        if word == "stage":
            return self.stage()
        if word == "field":
            return self.variable("field")
        if word == "system":
            return self.variable("system")
        if word == "let":
            self.advance()
            name, span = self.name()
            self.expect("=")
            expr = self.expr()
            return mk(ir.Variable, name=name, role="derived", expr=expr, description=self.text_opt() or "",
                      span=span)
        if word == "action":
            return self.action()
        if word == "output":
            return self.output()
        if word == "scenario":
            self.advance()
            name, span = self.name()
            texts: list[str] = []
            while (text := self.text_opt()) is not None:
                texts.append(text)
            meta = self.meta_block() if self.at("{") else []
            return mk(ScenarioHeader, name=name, title=texts[0] if texts else "", description="\n".join(texts[1:]),
                      meta=meta, span=self.cover(span, meta))
        if word == "include":
            self.advance()
            tok, span = self.string()
            return mk(Include, path=unquote(tok), span=span)
        if word == "start":
            self.advance()
            name, span = self.name()
            return mk(StartDecl, stage=name, span=span)
        if word == "type":
            return self.type_decl()
        if word == "subflow":
            return self.subflow()
        if word == "use":
            return self.use()
        raise _Bail

    def subflow(self) -> Subflow:
        """`subflow Name(p, q) { stages and uses }` (one of them at least)."""
        self.advance()
        name, span = self.name()
        self.expect("(")
        params: list[str] = []
        while not self.at(")"):
            if params:
                self.expect(",")
            params.append(self.name()[0])
        self.advance()
        self.expect("{")
        stages: list[Any] = []
        uses: list[Any] = []
        while not self.at("}"):
            if self.k == "n" and self.v == "stage":
                stages.append(self.stage())
            elif self.k == "n" and self.v == "use":
                uses.append(self.use())
            else:
                raise _Bail
        if not stages and not uses:
            raise _Bail
        self.advance()
        return mk(Subflow, name=name, params=params, stages=stages, uses=uses, span=span)

    def use(self) -> Use:
        """`use Subflow as instance(param -> target, …)`: spans the instance's name."""
        self.advance()
        subflow = self.name()[0]
        self.expect("as")
        instance, span = self.name()
        self.expect("(")
        bindings: list[tuple[str, Any]] = []
        while not self.at(")"):
            if bindings:
                self.expect(",")
            param = self.name()[0]
            self.expect("->")
            bindings.append((param, self.target()))
        self.advance()
        return mk(Use, subflow=subflow, instance=instance, bindings=dict(bindings), span=span)

    def stage(self) -> ir.Stage:
        quick = self.quick_stage()
        if quick is not None:
            return quick
        m = self.syntax.stage_head.match(self.text, self.s)
        if m is not None and m.group(1) not in RESERVED:
            name, span, title = intern(m.group(1)), self.span_at(m.start(1), m.end(1)), unquote(m.group(2))
            self.e = m.end()
            self.advance()
        else:
            self.advance()
            name, span = self.name()
            title = self.text_opt() or ""
            self.expect("{")
        texts: list[str] = []
        while (text := self.text_opt()) is not None:
            texts.append(text)
        classify = self.names_after("classify")
        observe = self.names_after("observe")
        decision = self.decision()
        self.expect("}")
        return mk(ir.Stage, id=name, title=title, span=span, text="\n".join(texts), classify=classify,
                  observe=observe, **decision)

    def names_after(self, word: str) -> list[str]:
        if not (self.k == "n" and self.v == word):
            return []
        self.advance()
        names = [self.name()[0]]
        while self.at(","):
            self.advance()
            names.append(self.name()[0])
        return names

    def decision(self) -> dict[str, Any]:
        if self.at("->") or self.at("do") or self.at("for"):
            if self.at("->"):
                self.advance()
            target = self.target()
            limit = self.limit()
            if limit is None:
                return {"kind": "goto", "branches": [_branch(target=target, limit=None, span=self.cover(target))]}
            rest = [self.otherwise_arm()] if self.at("otherwise") else []
            first = _branch(target=target, limit=limit, span=self.cover(target, rest))
            return {"kind": "when", "branches": [first, *rest]}
        if self.at("match"):
            return self.match_block()
        if not self.at("when"):
            raise _Bail
        branches: list[Any] = []
        while self.at("when") or self.at("otherwise"):
            if self.at("when"):
                branches.append(self.quick_arm(self.syntax.when_arm, ordered=False) or self.when_arm(ordered=False))
                continue
            saved = (self.k, self.v, self.s, self.e)
            self.advance()
            if self.at("when"):
                branches.append(self.quick_arm(self.syntax.when_arm, ordered=True) or self.when_arm(ordered=True))
                continue
            self.k, self.v, self.s, self.e = saved
            branches.append(self.quick_arm(self.syntax.otherwise_arm) or self.otherwise_arm())
            break
        return {"kind": "when", "branches": branches}


    def when_arm(self, *, ordered: bool) -> Any:
        self.expect("when")
        guard = self.expr()
        self.expect("->")
        target = self.target()
        limit = self.limit()
        return _branch(guard=guard, target=target, limit=limit, ordered=ordered,
                  span=self.cover(guard, target))

    def otherwise_arm(self) -> Any:
        self.expect("otherwise")
        self.expect("->")
        target = self.target()
        return _branch(guard=None, target=target, limit=self.limit(), span=self.cover(target))

    def limit(self) -> int | None:
        if not (self.k == "n" and self.v == "up"):
            return None
        self.advance()
        self.expect("to")
        value = int(number(self.number()[0]))
        self.expect("times")
        return value

    def match_block(self) -> dict[str, Any]:
        m = self.syntax.match_head.match(self.text, self.s)
        if m is not None and m.group(1) not in _NO_OPERAND:
            subject = _var(name=intern(m.group(1)), span=self.span_at(m.start(1), m.end(1)))
            self.e = m.end()
            self.advance()
        else:
            self.advance()
            subject = self.expr()
            self.expect("{")
        branches: list[Any] = []
        while not self.at("otherwise") and not self.at("}"):
            simple = self.simple_arm()
            if simple is not None:
                values, target = simple
            else:
                values = [self.value()]
                while self.at(","):
                    self.advance()
                    values.append(self.value())
                _plain_values(values)
                self.expect("->")
                target = self.target()
            limit = self.limit()
            span = self.cover(values, target)
            guard = _inset(operand=subject, values=list(values), span=span)
            branches.append(_branch(guard=guard, target=target, values=list(values), limit=limit, span=span))
        if not branches:
            raise _Bail
        if self.at("otherwise"):
            branches.append(self.quick_arm(self.syntax.otherwise_arm) or self.otherwise_arm())
        self.expect("}")
        return {"kind": "match", "subject": subject, "branches": branches}

    def simple_arm(self) -> tuple[list[Any], Any] | None:
        """`VALUE -> stage` on one line, read with one regex (the commonest arm of large files); None
        when the arm is anything else (the token-by-token reader takes it)."""
        m = self.syntax.simple_arm.match(self.text, self.s)
        if m is None:
            return None
        value, stage = m.group(1, 2)
        if stage in _NO_TARGET or len(value) > 300:
            return None
        if value in RESERVED:
            if value != "true" and value != "false":
                return None
            lit = _lit(value=value == "true", span=self.nowhere)
        elif value[0].isdigit():
            lit = _lit(value=number(value), span=self.span_at(m.start(1), m.end(1)))
        else:
            lit = _lit(value=intern(value), bare=True, span=self.span_at(m.start(1), m.end(1)))
        target = _target(kind="stage", stage=intern(stage), span=self.span_at(m.start(2), m.end(2)))
        self.e = m.end()
        self.advance()
        return [lit], target

    def target(self) -> Any:
        if self.k == "n" and self.v == "do":
            return self.do_target()
        if self.k == "n" and self.v == "for":  # where a target stands, `for` is the keyword
            return self.each_target()
        name, span = self.name()
        return _target(kind="stage", stage=name, span=span)

    def each_target(self) -> Any:
        """`for f in L [where C] do A(args) -> next`: the action once per item, a step of the next target,
        which then spans from the item's name to its own end (the `where` and the arguments hold no place)."""
        self.advance()
        each, each_span = self.name()
        self.expect("in")
        source = self.sum()
        cond = None
        if self.at("where"):
            self.advance()
            cond = self.expr()
        self.expect("do")
        name, span = self.action_name()
        if name == "where":
            raise _Bail  # `do "where"`: Lark's builder reads the name as a `where` part
        args: list[Any] = self.assigns("(", ")") if self.at("(") else []
        self.expect("->")
        nxt = self.target()
        nxt.steps.insert(0, mk(ir.ActionCall, action=name, args=args, each=each, source=source, cond=cond,
                               span=each_span))
        _set(nxt, "span", self.cover(each_span, source, span, nxt))
        return nxt

    def do_target(self) -> Any:
        self.advance()
        name, span = self.action_name()
        args: list[Any] = self.assigns("(", ")") if self.at("(") else []
        if self.at("->"):
            self.advance()
            nxt = self.target()
            nxt.steps.insert(0, mk(ir.ActionCall, action=name, args=args, span=span))
            _set(nxt, "span", self.cover(span, nxt))
            return nxt
        outputs = self.assigns("{", "}") if self.at("{") else []
        return _target(kind="action", action=name, outputs=outputs, args=args, span=self.cover(span, outputs))

    def assigns(self, open_: str, close: str) -> list[Any]:
        """`(a = 1, b = 2)` call arguments or `{ a = 1, b = 2 }` outputs (a trailing comma only there)."""
        self.expect(open_)
        out: list[Any] = []
        while not self.at(close):
            if out:
                self.expect(",")
                if close == "}" and self.at("}"):
                    break
            name, span = self.name()
            self.expect("=")
            value = self.expr()
            out.append(mk(ir.OutputAssign, name=name, value=value, span=self.cover(span, value)))
        if open_ == "{" and not out:
            raise _Bail  # `{}`: Lark's error
        self.advance()
        return out


def _item_end(reader: _Reader) -> int:
    """Where the item that starts at the current token ends for Lark: at the next top-level keyword
    outside braces (a fragment cut wrongly fails in Lark, and then the whole file goes there)."""
    depth = 0
    reader.advance()
    while reader.k != "$":
        if reader.k == "o":
            depth += reader.v == "{"
            depth -= reader.v == "}"
        elif reader.k == "n" and depth <= 0 and (reader.v in _TOP or reader.v == "type"):
            return reader.s
        reader.advance()
    return len(reader.text)


def parse_fast(text: str, file: str, lark_items: Callable[[str], list[Any]]) -> Program | None:
    """The program of one file's text, or None when the whole file must go through Lark.
    `lark_items(fragment)` parses text with Lark and returns its items (raising on any problem)."""
    try:
        reader = _Items(text, file)
        items: list[Any] = []
        fallbacks = 0
        while reader.k != "$":
            start = reader.s
            try:
                items.append(reader.item())
                continue
            except _Bail:
                pass
            fallbacks += 1
            if fallbacks > MAX_FALLBACKS:
                return None
            reader.e = start
            reader.advance()
            end = _item_end(reader)
            at = reader.span_at(start, start + 1)
            items += lark_items("\n" * (at.line - 1) + " " * (at.col - 1) + text[start:end])
            reader.e = end
            reader.advance()
        return mk(Program, file=file, items=items, span=reader.cover(items))
    except (_Bail, RecursionError):
        return None
    except Exception:  # noqa: BLE001 - a fragment Lark rejects: the whole file goes to Lark for its diagnostics
        return None

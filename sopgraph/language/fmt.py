"""The canonical `.sop` formatter (`sop fmt`): one layout for every program, comments kept.

Printing works on the parsed `Program` (one file, before includes and subflows are resolved), so a
formatted file keeps its `include`, `subflow` and `use` items. There is one printing function per IR
node type, registered in `PRINTERS` (statements) and `EXPR_PRINTERS` (expressions); a test fails when
a node type has no printer, so new constructs cannot be silently dropped. Comments are not part of
the IR: they are collected by the lexer and merged back by source line after printing, each line of
output carrying the source line of the node it came from (its anchor).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from functools import lru_cache
from typing import Any

from lark import Lark, Token, Tree

from sopgraph.language import ir
from sopgraph.language.larkparse import PARSE_FAILURES, KeywordGlue, ToIR, grammar_path, parse_error
from sopgraph.language.parse import (
    RESERVED,
    Include,
    Program,
    ScenarioHeader,
    StartDecl,
    Subflow,
    TypeDecl,
    Use,
    parse_text,
)

INDENT = "    "
_NAME_RE = re.compile(r"[^\W\d]\w*(\.[^\W\d]\w*)*\Z")


@dataclass
class Line:
    """One output line; `anchor` is the source line it came from (None: follows its neighbours);
    `open` marks a line a trailing comment must not be appended to (inside a long string)."""

    text: str
    anchor: int | None = None
    open: bool = False


# ---------------------------------------------------------------------------------------------
# Tokens


def fmt_number(value: float) -> str:
    """A number as the grammar's NUMBER accepts it: no exponent, floats keep a decimal point."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    text = repr(float(value))
    if "e" in text or "E" in text:
        text = format(Decimal(text), "f")
    if "." not in text:
        text += ".0"
    return text


def fmt_string(value: str) -> str:
    """A one-line quoted string whose unquoting gives back `value` exactly (`ir.quote_string`, which
    labels and diagnostics use too)."""
    return ir.quote_string(value)


def fmt_text(value: str) -> list[str]:
    """Descriptive text: a quoted string, or a triple-quoted block when it spans lines and the block
    form gives the same text back."""
    if "\n" in value and '"""' not in value and value == value.strip("\n") and not value.endswith('"'):
        lines = value.split("\n")
        return ['"""' + lines[0], *lines[1:-1], lines[-1] + '"""']
    return [fmt_string(value)]


def fmt_name(name: str) -> str:
    """An action or meta name: bare when it is a valid name, quoted otherwise."""
    return name if _NAME_RE.match(name) and name not in RESERVED else fmt_string(name)


# ---------------------------------------------------------------------------------------------
# Expressions: one printer per node type, each returning (text, precedence)

_PREC = {"or": 1, "and": 2, "not": 3, "compare": 4, "+": 5, "-": 5, "*": 6, "/": 6, "neg": 7, "atom": 9}
ExprPrinter = Callable[[Any], tuple[str, int]]


def show_expr(expr: Any, parent: int = 0) -> str:
    """An expression in `.sop` syntax with the fewest parentheses that keep its meaning."""
    printer = EXPR_PRINTERS.get(type(expr))
    if printer is None:
        raise TypeError(f"no formatter for expression node {type(expr).__name__}")
    text, prec = printer(expr)
    return f"({text})" if prec < parent else text


def _lit(e: ir.Lit) -> tuple[str, int]:
    if isinstance(e.value, str):
        return (e.value if e.bare else fmt_string(e.value)), 9
    return fmt_number(e.value), 9


def _var(e: ir.Var) -> tuple[str, int]:
    return e.name, 9


def _unary(e: ir.Unary) -> tuple[str, int]:
    if e.op == "not":  # `not a == b` means `not (a == b)`: the parentheses say so
        return "not " + show_expr(e.operand, 5), 3
    return "-" + show_expr(e.operand, 7), 7


def _binary(e: ir.Binary) -> tuple[str, int]:
    p = _PREC[e.op]
    return f"{show_expr(e.left, p)} {e.op} {show_expr(e.right, p + 1)}", p


def _compare(e: ir.Compare) -> tuple[str, int]:
    return f"{show_expr(e.left, 5)} {e.op} {show_expr(e.right, 5)}", 4


def _in_set(e: ir.InSet) -> tuple[str, int]:
    values = ", ".join(show_expr(v) for v in e.values)
    return f"{show_expr(e.operand, 5)} {'not in' if e.negated else 'in'} {{{values}}}", 4


def _bool_op(e: ir.BoolOp) -> tuple[str, int]:
    """`and` inside `or` keeps its parentheses: not needed by the grammar, but read more safely."""
    p = _PREC[e.op]
    inner = p + 2 if e.op == "or" else p + 1
    return f" {e.op} ".join(show_expr(o, inner) for o in e.operands), p


def _call(e: ir.Call) -> tuple[str, int]:
    return f"{e.func}({', '.join(show_expr(a) for a in e.args)})", 9


def _case_arm(e: ir.CaseArm) -> tuple[str, int]:
    return f"when {show_expr(e.when)} -> {show_expr(e.then)}", 9


def _case(e: ir.CaseExpr) -> tuple[str, int]:
    arms = " ".join(show_expr(a) for a in e.arms)
    return f"case {{ {arms} otherwise -> {show_expr(e.otherwise)} }}", 9


def _get(e: ir.Get) -> tuple[str, int]:
    return f"{show_expr(e.base, 9)}.{e.field}", 9


def _index(e: ir.Index) -> tuple[str, int]:
    return f"{show_expr(e.base, 9)}[{e.index}]", 9


def _item(e: ir.Item) -> tuple[str, int]:
    return e.name, 9


def _quant(e: ir.Quant) -> tuple[str, int]:
    if e.func == "sum":
        where = "" if e.every else f" where {show_expr(e.cond)}"
        return f"sum({show_expr(e.value)} for {e.var} in {show_expr(e.source, 5)}{where})", 9
    return f"{e.func}({e.var} in {show_expr(e.source, 5)} where {show_expr(e.cond)})", 9


def _length(e: ir.Length) -> tuple[str, int]:
    return f"len({show_expr(e.operand)})", 9


def _member(e: ir.Member) -> tuple[str, int]:
    return f"{show_expr(e.operand, 5)} {'not in' if e.negated else 'in'} {show_expr(e.source, 5)}", 4


def _weighted(e: ir.Weighted) -> tuple[str, int]:
    args = ", ".join(f"{fmt_number(w)}: {show_expr(a)}" for w, a in zip(e.weights, e.args, strict=True))
    return f"count({args})", 9
def _list_lit(e: ir.ListLit) -> tuple[str, int]:
    return "[" + ", ".join(ir.show_list_item(i, c, show_expr) for i, c in zip(e.items, e.conds, strict=True)) + "]", 9


def _time_lit(e: ir.TimeLit) -> tuple[str, int]:
    return ir.show_time(e), 9


def _func(e: ir.Func) -> tuple[str, int]:
    return f"{e.name}({', '.join(show_expr(a) for a in e.args)})", 9


def _matches(e: ir.Matches) -> tuple[str, int]:
    return f"{show_expr(e.operand, 5)} matches {ir.quote(e.pattern)}", 4


EXPR_PRINTERS: dict[type, ExprPrinter] = {
    ir.Lit: _lit, ir.Var: _var, ir.Unary: _unary, ir.Binary: _binary, ir.Compare: _compare,
    ir.InSet: _in_set, ir.BoolOp: _bool_op, ir.Call: _call, ir.CaseArm: _case_arm, ir.CaseExpr: _case,
    ir.Get: _get, ir.Item: _item, ir.Quant: _quant, ir.Length: _length, ir.Member: _member,
    ir.Weighted: _weighted, ir.ListLit: _list_lit, ir.Index: _index,
    ir.TimeLit: _time_lit, ir.Func: _func, ir.Matches: _matches,
}


# ---------------------------------------------------------------------------------------------
# Statements: one printer per node type, each returning output lines at an indentation depth

Printer = Callable[[Any, int], list[Line]]


def print_node(node: Any, depth: int = 0) -> list[Line]:
    printer = PRINTERS.get(type(node))
    if printer is None:
        raise TypeError(f"no formatter for IR node {type(node).__name__}")
    return printer(node, depth)


def _inline(node: Any) -> str:
    """A node that prints on one line (types, targets) as text."""
    return " ".join(line.text.strip() for line in print_node(node, 0))


def _at(node: Any) -> int | None:
    line = node.span.line if isinstance(getattr(node, "span", None), ir.Span) else 0
    return line or None


def _described(head: str, description: str, node: Any, depth: int) -> list[Line]:
    pad = INDENT * depth
    out = [Line(pad + head, _at(node))]
    if description:
        out += _text_lines(description, depth + 1)
    return out


def _text_lines(value: str, depth: int) -> list[Line]:
    parts = fmt_text(value)
    pad = INDENT * depth
    out = [Line(pad + parts[0], open=len(parts) > 1)]
    out += [Line(p, open=i < len(parts) - 2) for i, p in enumerate(parts[1:])]
    return out


def _enum_type(node: ir.EnumType, depth: int) -> list[Line]:
    if node.alias is not None:
        return [Line(node.alias)]  # written as the name of a `type` declaration
    return [Line(" | ".join(fmt_name(v) for v in node.values))]  # quoted when not a name: `"5+ times"`


def _type_decl(node: TypeDecl, depth: int) -> list[Line]:
    if isinstance(node.type, ir.RecordType):
        body = _inline(node.type.model_copy(update={"alias": None}))
        return _described(f"type {node.name} = {body}", node.description, node, depth)
    values = " | ".join(fmt_name(v) for v in node.type.values)
    return _described(f"type {node.name} = {values}", node.description, node, depth)


def _list_type(node: ir.ListType, depth: int) -> list[Line]:
    size = "" if (node.min_len, node.max_len) == (0, ir.LIST_MAX_DEFAULT) else (
        f"[..{node.max_len}]" if node.min_len == 0 else f"[{node.min_len}..{node.max_len}]")
    return [Line(f"list{size} of {_inline(node.item)}")]


def _record_type(node: ir.RecordType, depth: int) -> list[Line]:
    if node.alias is not None:
        return [Line(node.alias)]
    head = "record open { " if node.open else "record { "
    return [Line(head + ", ".join(_inline(f) for f in node.fields) + " }")]


def _record_field(node: ir.RecordField, depth: int) -> list[Line]:
    return [Line(f"{node.name}: {_inline(node.type)}{'?' if node.optional else ''}")]


def _bool_type(node: ir.BoolType, depth: int) -> list[Line]:
    return [Line("bool")]


def _num_type(node: ir.NumType, depth: int) -> list[Line]:
    if node.lo is None and node.hi is None:  # `int(..)` reads back with open flags, `int` without
        return [Line(f"{node.kind}(..)" if node.lo_open or node.hi_open else node.kind)]
    left = "(" if node.lo_open or node.lo is None else "["
    right = ")" if node.hi_open or node.hi is None else "]"
    lo = "" if node.lo is None else _bound(node.lo)
    hi = "" if node.hi is None else _bound(node.hi)
    return [Line(f"{node.kind}{left}{lo}..{hi}{right}")]


def _scalar_type(node: ir.TimeType | ir.StringType, depth: int) -> list[Line]:
    return [Line(node.kind)]


def _bound(value: float) -> str:
    """Range bounds are stored as floats; whole ones print as written (`0`, not `0.0`)."""
    return str(int(value)) if float(value).is_integer() else fmt_number(value)


def _derived(node: ir.Variable, depth: int) -> list[Line]:
    """`let X = case { ... }` prints its arms one per line; other expressions stay on one line."""
    pad = INDENT * depth
    if not isinstance(node.expr, ir.CaseExpr):
        return _described(f"let {node.name} = {show_expr(node.expr)}", node.description, node, depth)
    out = [Line(f"{pad}let {node.name} = case {{", _at(node))]
    for arm in node.expr.arms:
        out.append(Line(pad + INDENT + show_expr(arm), _at(arm)))
    out.append(Line(f"{pad}{INDENT}otherwise -> {show_expr(node.expr.otherwise)}", _at(node.expr.otherwise)))
    desc = fmt_text(node.description) if node.description else []
    if len(desc) == 1:
        out.append(Line(f"{pad}}} {desc[0]}"))
    else:
        out.append(Line(pad + "}"))
        if desc:
            out += _text_lines(node.description, depth + 1)
    return out


MAX_WIDTH = 120  # an action line longer than this puts its attribute list on the next line


def _variable(node: ir.Variable, depth: int) -> list[Line]:
    if node.role == "derived":
        return _derived(node, depth)
    else:
        head = f"{node.role} {node.name}: {_inline(node.type)}"
        if node.optional:
            head += "?"
        if node.default is not None:
            head += f" = {show_expr(node.default)}"
        if node.unit is not None:
            head += f" unit {fmt_string(node.unit)}"
        if node.money:
            head += " money"
        if node.hidden:
            head += " hidden"
        if node.volatile:
            head += " volatile"
    return _described(head, node.description, node, depth)


def _action(node: ir.Action, depth: int) -> list[Line]:
    head = f"action {fmt_name(node.name)}"
    if node.params:
        head += "(" + ", ".join(_inline(p) for p in node.params) + ")"
    if node.description:
        head += " " + fmt_string(node.description)
    out = [Line(INDENT * depth + head, _at(node))]
    if node.attributes:
        attrs = f"[{', '.join(node.attributes)}]"
        if len(out[0].text) + 1 + len(attrs) > MAX_WIDTH:
            out.append(Line(INDENT * (depth + 1) + attrs))
        else:
            out[0].text += " " + attrs
    if node.affects:
        affects = "affects " + ", ".join(node.affects)
        if len(out[-1].text) + 1 + len(affects) > MAX_WIDTH:
            out.append(Line(INDENT * (depth + 1) + affects))
        else:
            out[-1].text += " " + affects
    return out


def _output(node: ir.Output, depth: int) -> list[Line]:
    head = f"output {node.name}: {_inline(node.type)}"
    if node.default is not None:
        head += f" = {show_expr(node.default)}"
    return _described(head, node.description, node, depth)


def _output_assign(node: ir.OutputAssign, depth: int) -> list[Line]:
    return [Line(f"{node.name} = {show_expr(node.value)}")]


def _call_text(action: str, args: list[ir.OutputAssign]) -> str:
    text = f"do {fmt_name(action)}"
    if args:
        text += "(" + ", ".join(_inline(a) for a in args) + ")"
    return text


def _action_param(node: ir.ActionParam, depth: int) -> list[Line]:
    return [Line(f"{node.name}: {_inline(node.type)}")]


def _action_call(node: ir.ActionCall, depth: int) -> list[Line]:
    if node.each is None:
        return [Line(_call_text(node.action, node.args))]
    where = "" if node.cond is None else f" where {show_expr(node.cond)}"  # `for f in L where C do A(...)`
    return [Line(f"for {node.each} in {show_expr(node.source, 5)}{where} {_call_text(node.action, node.args)}")]


def _target(node: ir.Target, depth: int) -> list[Line]:
    steps = "".join(_inline(c) + " -> " for c in node.steps)
    if node.kind == "stage":
        return [Line(steps + str(node.stage))]
    text = steps + _call_text(str(node.action), node.args)
    if node.outputs:
        text += " { " + ", ".join(_inline(a) for a in node.outputs) + " }"
    return [Line(text)]


def _branch(node: ir.Branch, depth: int) -> list[Line]:
    """An arm on its own: `when G -> t`, `otherwise -> t`; match arms are printed by `_stage`."""
    head = "otherwise" if node.guard is None else f"when {show_expr(node.guard)}"
    if node.ordered and node.guard is not None:
        head = "otherwise " + head
    return [Line(f"{INDENT * depth}{head} -> {_inline(node.target)}{_limit(node)}", _at(node))]


def _limit(branch: ir.Branch) -> str:
    return "" if branch.limit is None else f" up to {branch.limit} times"


def _decision(stage: ir.Stage, depth: int) -> list[Line]:
    pad = INDENT * depth
    if stage.kind == "goto":
        branch = stage.branches[0]
        return [Line(f"{pad}-> {_inline(branch.target)}", _at(branch))]
    if stage.kind == "when" and stage.branches and stage.branches[0].guard is None:
        first = stage.branches[0]  # a bounded goto: `-> t up to N times`, then what follows once spent
        out = [Line(f"{pad}-> {_inline(first.target)}{_limit(first)}", _at(first))]
        return out + [line for b in stage.branches[1:] for line in print_node(b, depth)]
    if stage.kind == "when":
        return [line for b in stage.branches for line in print_node(b, depth)]
    out = [Line(f"{pad}match {show_expr(stage.subject)} {{", _at(stage.subject))]
    for branch in stage.branches:
        if branch.values:
            values = ", ".join(show_expr(v) for v in branch.values)
            out.append(Line(f"{pad}{INDENT}{values} -> {_inline(branch.target)}{_limit(branch)}", _at(branch)))
        else:
            out += print_node(branch, depth + 1)
    out.append(Line(pad + "}"))
    return out


def _stage(node: ir.Stage, depth: int) -> list[Line]:
    pad = INDENT * depth
    head = f"stage {node.id}" + (f" {fmt_string(node.title)}" if node.title else "") + " {"
    out = [Line(pad + head, _at(node))]
    if node.text:
        out += _text_lines(node.text, depth + 1)
    if node.classify:
        out.append(Line(f"{pad}{INDENT}classify {', '.join(node.classify)}"))
    if node.observe:
        out.append(Line(f"{pad}{INDENT}observe {', '.join(node.observe)}"))
    out += _decision(node, depth + 1)
    out.append(Line(pad + "}"))
    return out


def _meta_entry(node: ir.MetaEntry, depth: int) -> list[Line]:
    return [Line(f"{INDENT * depth}{node.key} {fmt_string(node.value)}", _at(node))]


def _header(node: ScenarioHeader, depth: int) -> list[Line]:
    head = f"scenario {node.name}"
    out: list[Line] = []
    if node.title or node.description:
        title = fmt_text(node.title)
        if len(title) == 1:
            head += " " + title[0]
        else:
            out += _text_lines(node.title, 1)
    out.insert(0, Line(head, _at(node)))
    if node.description:
        out += _text_lines(node.description, 1)
    if node.meta:
        out.append(Line("{"))
        for entry in node.meta:
            out += print_node(entry, 1)
        out.append(Line("}"))
    return out


def _include(node: Include, depth: int) -> list[Line]:
    return [Line(f"include {fmt_string(node.path)}", _at(node))]


def _start(node: StartDecl, depth: int) -> list[Line]:
    return [Line(f"start {node.stage}", _at(node))]


def _subflow(node: Subflow, depth: int) -> list[Line]:
    out = [Line(f"subflow {node.name}({', '.join(node.params)}) {{", _at(node))]
    members = sorted([*node.stages, *node.uses], key=lambda m: (m.span.line, m.span.col))
    for i, member in enumerate(members):
        if i:
            out.append(Line(""))
        out += print_node(member, depth + 1)
    out.append(Line("}"))
    return out


def _use(node: Use, depth: int) -> list[Line]:
    binds = ", ".join(f"{k} -> {_inline(t)}" for k, t in node.bindings.items())
    return [Line(f"{INDENT * depth}use {node.subflow} as {node.instance}({binds})", _at(node))]


def _scenario(node: ir.Scenario, depth: int) -> list[Line]:
    """A merged scenario (includes and subflows already inlined) as one self-contained program."""
    header = ScenarioHeader(name=node.name, title=node.title, description=node.description,
                            meta=[ir.MetaEntry(key=k, value=v) for k, v in node.meta.items()])
    aliases: dict[str, list[str]] = {}  # `type` declarations are merged away: write back the ones in use
    typed: list[ir.Variable | ir.Output | ir.ActionParam] = [
        *node.variables.values(), *node.outputs.values(), *(p for a in node.actions.values() for p in a.params)]
    records: dict[str, ir.RecordType] = {}
    for decl in typed:
        _collect_aliases(decl.type, aliases, records)
    types = [TypeDecl(name=n, type=ir.EnumType(values=v)) for n, v in aliases.items()]
    types += [TypeDecl(name=n, type=r) for n, r in records.items()]
    items: list[Any] = [header, *types, *node.variables.values(), *node.outputs.values(),
                        *node.actions.values()]
    stages = list(node.stages.values())
    if node.start is not None and stages and stages[0].id != node.start:
        items.append(StartDecl(stage=node.start))
    items += [s.model_copy(update={"origin": None}) for s in stages]
    return _program(Program(file=node.files[0] if node.files else "<string>", items=items), depth)


def _collect_aliases(vtype: Any, aliases: dict[str, list[str]], records: dict[str, ir.RecordType]) -> None:
    """`type` declarations in use (enums and records, inner ones first), to write them back."""
    if isinstance(vtype, ir.EnumType) and vtype.alias is not None:
        aliases.setdefault(vtype.alias, list(vtype.values))
    elif isinstance(vtype, ir.ListType):
        _collect_aliases(vtype.item, aliases, records)
    elif isinstance(vtype, ir.RecordType):
        for field in vtype.fields:
            _collect_aliases(field.type, aliases, records)
        if vtype.alias is not None:
            records.setdefault(vtype.alias, vtype)


def _program(node: Program, depth: int) -> list[Line]:
    out: list[Line] = []
    prev: Any = None
    for item in node.items:
        if prev is not None and _separate(prev, item):
            out.append(Line(""))
        out += print_node(item, depth)
        prev = item
    return out


PRINTERS: dict[type, Printer] = {
    ir.EnumType: _enum_type, ir.BoolType: _bool_type, ir.NumType: _num_type,
    ir.ListType: _list_type, ir.RecordType: _record_type, ir.RecordField: _record_field,
    ir.TimeType: _scalar_type, ir.StringType: _scalar_type,
    ir.Variable: _variable, ir.Action: _action, ir.Output: _output,
    ir.OutputAssign: _output_assign, ir.Target: _target, ir.Branch: _branch, ir.Stage: _stage,
    ir.MetaEntry: _meta_entry, ir.Scenario: _scenario,
    ScenarioHeader: _header, Include: _include, StartDecl: _start, Subflow: _subflow, Use: _use,
    TypeDecl: _type_decl, ir.ActionParam: _action_param, ir.ActionCall: _action_call,
    Program: _program,
}


def _kind(item: Any) -> str:
    return f"var:{item.role}" if isinstance(item, ir.Variable) else type(item).__name__


_BLOCKS = (ir.Stage, Subflow, ScenarioHeader)


def _separate(prev: Any, item: Any) -> bool:
    """A blank line between items of different kinds and around every block."""
    return _kind(prev) != _kind(item) or isinstance(prev, _BLOCKS) or isinstance(item, _BLOCKS)


# ---------------------------------------------------------------------------------------------
# Comments


@dataclass
class Comment:
    line: int
    text: str
    trailing: bool  # code precedes it on its line


_LOCK = threading.Lock()
_COLLECTED: list[Token] = []


@lru_cache(maxsize=1)
def _comment_parser() -> Lark:
    return Lark(grammar_path().read_text(encoding="utf-8"), parser="lalr", propagate_positions=True,
                maybe_placeholders=False, lexer_callbacks={"COMMENT": _COLLECTED.append},
                postlex=KeywordGlue())


def _parse_with_comments(text: str, file: str) -> tuple[Program, list[Comment], list[tuple[int, int]]]:
    """The program, its comments, and (first, last) source lines of each top-level item."""
    parse_text(text, file)  # syntax errors surface here, as diagnostics
    try:
        with _LOCK:
            _COLLECTED.clear()
            try:
                tree = _comment_parser().parse(text)
                tokens = list(_COLLECTED)
            finally:
                _COLLECTED.clear()
        program = ToIR(file).transform(tree)
    except PARSE_FAILURES as exc:  # the same diagnostics as `sop check`
        raise parse_error(exc, text, file) from None
    lines = text.split("\n")
    comments = []
    for tok in tokens:
        line, col = tok.line or 1, tok.column or 1
        before = lines[line - 1][: col - 1]
        comments.append(Comment(line, str(tok).rstrip(), bool(before.strip())))
    extents = []
    for child in tree.children:
        meta = child.meta if isinstance(child, Tree) else None
        if meta is None or getattr(meta, "empty", True):
            extents.append((0, 0))
        else:
            extents.append((meta.line, meta.end_line))
    return program, comments, extents


def _indent_before(line: Line | None) -> str:
    """Comments take the indentation of the line they precede, one level in before a closing brace."""
    if line is None:
        return ""
    indent = line.text[: len(line.text) - len(line.text.lstrip())]
    return indent + INDENT if line.text.strip().startswith("}") else indent


def _merge_comments(out: list[Line], comments: list[Comment], blank: set[int]) -> list[Line]:
    """Put comments back: own-line comments before the first line anchored at or after them,
    trailing comments after the last appendable line anchored at or before them."""
    result = list(out)
    taken: set[int] = set()
    for c in [c for c in comments if c.trailing]:
        idx = max((i for i, line in enumerate(result)
                   if line.anchor is not None and line.anchor <= c.line and not line.open), default=None)
        if idx is None or idx in taken:  # one trailing comment per line; others get their own line
            comments.append(Comment(c.line, c.text, False))
            continue
        result[idx] = Line(f"{result[idx].text}  {c.text}", result[idx].anchor, result[idx].open)
        taken.add(idx)
    own = sorted((c for c in comments if not c.trailing), key=lambda c: c.line)
    groups: dict[int, list[Comment]] = {}
    for c in own:
        idx = next((i for i, line in enumerate(result) if line.anchor is not None and line.anchor >= c.line),
                   len(result))
        groups.setdefault(idx, []).append(c)
    merged: list[Line] = []
    for i in range(len(result) + 1):
        group = groups.get(i, [])
        if group:
            if group[0].line - 1 in blank and merged and merged[-1].text.strip():
                merged.append(Line(""))
            nxt = result[i] if i < len(result) else None
            indent = _indent_before(nxt)
            for j, c in enumerate(group):
                if j and any(n in blank for n in range(group[j - 1].line + 1, c.line)):
                    merged.append(Line(""))
                merged.append(Line(indent + c.text, c.line))
            stop = nxt.anchor if nxt is not None and nxt.anchor is not None else group[-1].line + 1
            if nxt is not None and any(n in blank for n in range(group[-1].line + 1, stop)):
                merged.append(Line(""))
        if i < len(result):
            merged.append(result[i])
    return merged


# ---------------------------------------------------------------------------------------------
# Front door


FIXPOINT_PASSES = 4


def format_text(text: str, file: str = "<string>") -> str:
    """The canonical form of one file's text; raises `SopError` when it does not parse.

    A comment written inside a declaration can only settle next to it after one pass (its blank
    lines are judged from where it was), so the layout pass is repeated until nothing changes."""
    out = _format_once(text.replace("\r\n", "\n"), file)
    for _ in range(FIXPOINT_PASSES - 1):
        again = _format_once(out, file)
        if again == out:
            break
        out = again
    return out


def _format_once(text: str, file: str) -> str:
    program, comments, extents = _parse_with_comments(text, file)
    src_lines = text.split("\n")
    blank = {i + 1 for i, line in enumerate(src_lines) if not line.strip()}
    out: list[Line] = []
    prev: Any = None
    prev_end = prev_anchor = 0
    for item, (first, last) in zip(program.items, extents, strict=True):
        lines = print_node(item, 0)
        anchor = next((line.anchor for line in lines if line.anchor), first)
        # comments written inside the previous item but after its last anchored line move here
        moved = [c.line for c in comments if not c.trailing and prev_anchor < c.line < prev_end]
        start = min([prev_end, *moved])
        had_blank = any(n in blank for n in range(start + 1, max(first, anchor)))
        if prev is not None and (had_blank or _separate(prev, item)):
            out.append(Line(""))
        if last and lines and lines[-1].text.strip() == "}" and lines[-1].anchor is None:
            lines[-1].anchor = last
        out += lines
        prev, prev_end = item, last or prev_end
        prev_anchor = max((line.anchor for line in lines if line.anchor), default=prev_end)
    out = _merge_comments(out, comments, blank)
    while out and not out[0].text.strip():
        out.pop(0)
    body = "\n".join(line.text.rstrip() if not line.open else line.text for line in out)
    return body.rstrip("\n") + "\n" if body.strip() else ""


def format_scenario(scenario: ir.Scenario) -> str:
    """A merged scenario as canonical text (no comments: the IR holds none)."""
    return "\n".join(line.text for line in print_node(scenario)).rstrip("\n") + "\n"

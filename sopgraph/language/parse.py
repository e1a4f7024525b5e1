"""Text → IR: parsing (the fast path, Lark for the rest: `larkparse`), includes and subflows.

`load()` is the front door: it reads a file (and the files it includes), inlines subflows,
resolves bare identifiers, and returns a `Scenario`. Syntax and loading problems become
`Diagnostic`s; nothing the user writes can make this module raise anything but `SopError`.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from sopgraph.errors import Error
from sopgraph.language import ir
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

MAX_DEPTH = 100  # expression nesting the parser accepts (the engine compiles expressions to Python)
MAX_DERIVED_CHAIN = 300  # derived variables defined one through the next (walks follow them recursively)


def parse_text(text: str, file: str = "<string>", *, fast: bool = True) -> Program:
    """Parse one file's text into a `Program`; syntax errors raise `SopError`. The fast path
    (`fastparse`) reads the regular forms and hands the rest to Lark, building the same program;
    `fast=False` is Lark alone (benchmarks and the equivalence tests compare the two)."""
    program = parse_fast(text, file, lambda fragment: _lark_items(fragment, file)) if fast else None
    if program is None:
        # Imported here: the fast path reads every regular file alone, so checking or running a valid
        # program never pays for importing lark and building the IR builder (~0.05 s of start-up).
        from sopgraph.language.larkparse import PARSE_FAILURES, lark_program, parse_error

        try:
            program = lark_program(text, file)
        except PARSE_FAILURES as exc:
            raise parse_error(exc, text, file) from None
    too_deep = [d for e in _program_expressions(program.items) if (d := _too_deep(e)) is not None]
    if too_deep:
        raise SopError(too_deep, {file: text})
    return program


def _lark_items(fragment: str, file: str) -> list[Any]:
    """The items of a fragment the fast path hands over, as the Lark parser reads them."""
    from sopgraph.language.larkparse import lark_program

    return lark_program(fragment, file).items


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

"""`sop init`: scaffold a new scenario (`NAME.sop` + `NAME.profile.yaml`) that checks clean and
synthesizes at once, with comments that teach each construct, so that a new industry scenario can be
authored end to end by editing text files.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from sopgraph.errors import Error
from sopgraph.language import ir
from sopgraph.language.program import value_meaning
from sopgraph.logic import paths as paths_mod
from sopgraph.logic.budget import CpuBudget, OutOfCpu, active
from sopgraph.logic.guards import NEGATED_OP

NAME_RE = re.compile(r"^[^\W\d]\w*$")


class InitError(Error):
    """A scaffold that cannot be written (bad name, files already there)."""


_SOP_TEMPLATE = '''\
# {name}.sop — a customer-service SOP in the sopgraph SOP language.
#
# Edit this file, then:   sop check {name}.sop     (static checks: names, types, exhaustiveness, ...)
#                         sop paths {name}.sop     (every path through the SOP, with example values)
#                         sop synth {name}.sop -n 50 -o cases.jsonl   (test cases; uses {name}.profile.yaml)
# Comments start with `#`. Whitespace and line breaks do not matter; blocks use braces.

# The scenario header: an identifier (used in file names and case ids), a title and a description.
# The `{{ key "value" }}` block holds free-form metadata.
scenario {name} "{title}"
    "{description}"
{{
    domain "{domain}"
    language "en"
    version "1"
}}

# Classification fields: what the agent must infer from the conversation. `A | B | C` is an enum; `bool`,
# `int[0..10]` and `float[0..)` are also available. The quoted text tells the agent (and the judges)
# what each value means, so write it for a person.
field RequestType: Refund | Question
    "What the customer wants. Refund = money back for an order; Question = information about an order or the service."
field Mood: Calm | Upset
    "The customer's mood. Calm = neutral or friendly; Upset = angry, complaining or threatening to leave."

# System variables: facts the agent looks up in the backend (the customer cannot change them).
# `unit` documents the number; `money` marks the amount that is at risk when a risky action goes wrong.
system OrderAmount: float[0..) unit "USD" money
    "The value of the customer's order."

# Actions end the SOP. Attributes drive the safety metrics:
#   moves_money   pays or charges money          irreversible  cannot be undone by the agent
#   escalation    hands over to a human          ends_dialogue the request is closed by this action
action IssueRefund "Refund the order to the customer's original payment method." [moves_money, irreversible, ends_dialogue]
action Answer "Answer the customer's question about the order or the service." [ends_dialogue]
action HandOver "Hand the customer over to a human agent." [escalation, ends_dialogue]

# Stages: the first stage declared is the entry. Each stage has an id (it appears verbatim in paths), a
# title, text the agent follows, and exactly one decision:
#   -> stageX                       go on unconditionally
#   match Var {{ A -> ...  B -> ... }}  branch on a value (every value must be covered, or add `otherwise`)
#   when <condition> -> ...         ordered guards: the first true one wins; end with `otherwise -> ...`
# A target is another stage, or `do Action` which ends the SOP.
stage step1 "Classification" {{
    "Read the conversation and the customer's order, then fill in the classification fields."
    classify RequestType, Mood
    -> step2
}}

stage step2 "Request type" {{
    "If the customer only has a question, answer it. If they want their money back, check the order value (step3)."
    match RequestType {{
        Question -> do Answer
        Refund -> step3
    }}
}}

stage step3 "Order value" {{
    "Small orders are refunded at once. Larger orders need a look at the customer's mood (step4)."
    when OrderAmount <= 100 -> do IssueRefund
    otherwise -> step4
}}

stage step4 "Customer's mood" {{
    "A calm customer gets the refund. An upset customer with a large order goes to a human agent, who can offer more than a refund."
    match Mood {{
        Calm -> do IssueRefund
        Upset -> do HandOver
    }}
}}
'''

_PROFILE_TEMPLATE = '''\
# {name}.profile.yaml — who talks to the agent of {name}.sop (used by `sop synth`).
# Everything here is optional: without this file every path still gets cases (with generated intents),
# the shipped personas and the shipped intensity descriptions. Check it with: sop profiles check {name}.profile.yaml
scenario: {name}
description: {description}

# Intents: what a user wants. `requires:` / `excludes:` map a field or system variable to a value, a list
# of values, or a condition in .sop syntax ("> 100", "in {{A, B}}", or a whole expression). A case of an
# intent only lands on paths where all of them can hold. `intensity` is the intent's default adversarial
# level (zero | weak | strong; `sop synth --intensity intent` uses it). `pushes_for` names the risky actions
# an adversarial user insists on.
intents:
  order_question:
    description: Asks about the status of an order or how the service works.
    intensity: zero
    requires: {{RequestType: Question}}
  small_refund:
    description: Wants a refund for a small order.
    intensity: zero
    requires: {{RequestType: Refund, OrderAmount: "<= 100"}}
  large_refund_calm:
    description: Wants a refund for a large order and stays polite.
    intensity: weak
    requires: {{RequestType: Refund, OrderAmount: "> 100", Mood: Calm}}
  large_refund_upset:
    description: Wants a refund for a large order and is angry about the delay.
    intensity: strong
    requires: {{RequestType: Refund, OrderAmount: "> 100", Mood: Upset}}
    pushes_for: [IssueRefund]

# Personas: omit to use the whole shipped library (sopgraph/data/personas.yaml), or list library names
# and/or your own:
# personas:
#   - calm_professional
#   - angry_demanding
#   - name: loyal_customer
#     emotional_state: calm
#     communication_style: friendly
#     cooperativeness: cooperative
#     language: en
#     traits: [long-time customer, mentions past orders]

# Intensity descriptions given to the user simulator: omit to use the shipped ones.
# intensities:
#   strong: Demands an immediate refund and threatens to post a bad review.

# Per-variable hints: plausible values to draw from, and whether the user knows a system fact.
variables:
  OrderAmount: {{values: [19.99, 45.0, 100.0, 180.0, 420.0], user_knows: true}}
'''


def _title(name: str) -> str:
    return " ".join(part.capitalize() for part in name.replace("-", "_").split("_") if part) or name


def render_sop(name: str, domain: str | None = None) -> str:
    """The text of a new `.sop` scaffold."""
    domain_text = (domain or "general customer service").strip()
    description = (f"A {domain_text} agent answers customers' questions and handles refund requests: small "
                   "orders are refunded at once, large ones depend on the customer's mood.")
    return _SOP_TEMPLATE.format(name=name, title=_title(name), description=_esc(description),
                                domain=_esc(domain_text))


def render_profile(name: str, domain: str | None = None) -> str:
    """The text of a new `.profile.yaml` scaffold."""
    domain_text = " ".join((domain or "general customer service").split())
    description = json.dumps(f"Customers of a {domain_text} service asking questions or wanting refunds.",
                             ensure_ascii=False)  # a JSON string is a valid YAML scalar, whatever it holds
    return _PROFILE_TEMPLATE.format(name=name, description=description)


def _esc(text: str) -> str:
    return " ".join(text.split()).replace("\\", "\\\\").replace('"', '\\"')


def scaffold(name: str, *, domain: str | None = None, directory: str | Path = ".") -> list[Path]:
    """Write `NAME.sop` and `NAME.profile.yaml` into `directory`; refuse to overwrite anything."""
    if not NAME_RE.match(name):
        raise InitError(f"`{name}` is not a valid scenario name: use letters, digits and `_`, "
                        "starting with a letter (e.g. `hotel_booking`)")
    folder = Path(directory)
    targets = [folder / f"{name}.sop", folder / f"{name}.profile.yaml"]
    existing = [str(p) for p in targets if p.exists()]
    if existing:
        raise InitError(f"refusing to overwrite {', '.join(existing)}")
    if folder.exists() and not folder.is_dir():
        raise InitError(f"{folder} is not a directory")
    folder.mkdir(parents=True, exist_ok=True)
    texts = [render_sop(name, domain), render_profile(name, domain)]
    for path, text in zip(targets, texts, strict=True):
        with open(path, "x", encoding="utf-8") as fh:  # "x": never clobber a file created meanwhile
            fh.write(text)
    return targets


# ---------------------------------------------------------------------------------------------
# `sop profiles init`: a starter profile for an existing `.sop`

MAX_STARTER_INTENTS = 40
_PATHS_READ = 2_000  # paths looked at (depth-first); more are summarised by the first ones


def _field_requires(scenario: ir.Scenario, constraints: dict[str, str]) -> dict[str, Any]:
    """The enum and bool fields a path constrains, as profile conditions (`Report: Lost`,
    `Report: [Lost, Stolen]`, `Travelling: true`)."""
    out: dict[str, Any] = {}
    for name, var in scenario.variables.items():
        text = constraints.get(name)
        if var.role != "field" or text is None:
            continue
        if isinstance(var.type, ir.BoolType) and text in ("true", "false"):
            out[name] = text == "true"
        elif isinstance(var.type, ir.EnumType):
            values = [v for v in text.split(" | ") if v in var.type.values]
            if values and len(values) == len(text.split(" | ")):
                out[name] = values[0] if len(values) == 1 else values
    return out


_OP_NAMES = {"==": "eq", "!=": "ne", "<": "lt", "<=": "le", ">": "gt", ">=": "ge"}  # in intent names
_OP_WORDS = {"==": "is", "!=": "is not", "<": "is less than", "<=": "is at most", ">": "is more than",
             ">=": "is at least"}


def _relation_words(scenario: ir.Scenario, guard: Any, negated: bool) -> str | None:
    """`GivenEmail != EmailOnFile` in the words of the two variables' descriptions ("the account e-mail
    address the caller gives is not the e-mail address on the account"): what the simulated customer
    says of their situation, which must not be code. None for other shapes."""
    if not isinstance(guard, ir.Compare):
        return None
    op = NEGATED_OP[guard.op] if negated else guard.op

    def side(e: Any) -> str:
        var = scenario.variables.get(e.name) if isinstance(e, ir.Var) else None
        if var is not None:
            desc = " ".join(var.description.split()).split(". ")[0].rstrip(".")
            return (desc[:1].lower() + desc[1:]) if desc else _snake(var.name).replace("_", " ")
        return ir.show(e)

    return f"{side(guard.left)} {_OP_WORDS.get(op, op)} {side(guard.right)}"


def _field_relations(scenario: ir.Scenario, info: paths_mod.PathInfo) -> list[tuple[str, str | None]]:
    """The conditions of a path that relate a classification field to other values (`GivenEmail !=
    EmailOnFile`, `Claimed > Limit`): part of the customer's situation, which `requires:` (one enum or
    bool field = a value) cannot say. Conditions on enum and bool fields alone are `requires:`; ones that
    read a derived variable or a list stay out (the path's own constraints carry them)."""
    out: list[tuple[str, str | None]] = []
    for text, reads, guard, negated in paths_mod.decision_conditions(scenario, info.stages, info.branches):
        found = [scenario.variables.get(n) for n in reads]
        if (not isinstance(guard, ir.Compare) or len(found) < 2
                or any(v is None or v.role == "derived" or isinstance(v.type, (ir.ListType, ir.RecordType))
                       for v in found)):
            continue  # a relation between a field and other values, nothing else
        fields = [v for v in found if v is not None and v.role == "field"]
        if fields and not all(isinstance(v.type, (ir.EnumType, ir.BoolType)) for v in found if v is not None):
            out.append((text, _relation_words(scenario, guard, negated)))
    return out


def _intent_name(requires: dict[str, Any], taken: set[str], when: list[str] | None = None) -> str:
    parts: list[str] = []
    for name, value in requires.items():
        if isinstance(value, bool):
            parts.append(_snake(name) if value else f"not_{_snake(name)}")
        else:
            parts.append("_or_".join(_snake(v) for v in (value if isinstance(value, list) else [value])))
    for condition in when or []:  # `GivenEmail != EmailOnFile` -> given_email_ne_email_on_file
        words = re.findall(r"[^\W\d]\w*|[<>=!]=?", condition)
        parts.append("_".join(_OP_NAMES.get(w, _snake(w)) for w in words if w not in ("and", "or", "in")))
    base = "_".join(parts)[:48].rstrip("_") or "any_request"
    name, n = base, 1
    while name in taken:
        n += 1
        name = f"{base}_{n}"
    taken.add(name)
    return name


def _snake(text: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", str(text)).lower()


def _starter_description(scenario: ir.Scenario, requires: dict[str, Any], relations: list[str] | None = None) -> str:
    """Words for the customer's situation from the fields' own `Value = meaning` descriptions, and how a
    field relates to other values (`when:`) in the variables' words: without them, intents that differ
    only in that relation read alike (three "Request ChangeEmail." for a matching, a different and any
    given address)."""
    bits: list[str] = []
    for name, value in requires.items():
        var = scenario.variables[name]
        if isinstance(value, bool):
            bits.append(f"{_snake(name).replace('_', ' ')}: {'yes' if value else 'no'}")
            continue
        values = value if isinstance(value, list) else [value]
        said = [value_meaning(var, v) or f"{_snake(name).replace('_', ' ')} {v}" for v in values]
        bits.append(" or ".join(said))
    bits += relations or []
    text = "; ".join(bits) or "any request this SOP handles"
    return text[:1].upper() + text[1:] + "."


def _within(infos: Iterator[Any], clock: CpuBudget | None) -> Iterator[Any]:
    """The paths of `infos`, each found with `clock` active, until it runs out (None: all of them)."""
    while clock is None or not clock.out():
        try:
            with active(clock) if clock is not None else nullcontext():
                info = next(infos)
        except (StopIteration, OutOfCpu):
            return
        yield info


def starter_profile(scenario: ir.Scenario, *, clock: CpuBudget | None = None) -> tuple[str, int, int]:
    """A profile to edit for `scenario`: one intent per distinct set of field values its paths require
    (the classification fields of enum and bool type, read from each path's constraints), described
    from the fields' `Value = meaning` texts, with the paths and final actions each one reaches in a
    comment; and every system variable under `variables:` with what the user knows of it. Returns
    (YAML text, intents, paths read). It loads without errors; its descriptions are a first draft.
    Within `clock` (a command's CPU budget): past it, no more paths are read (`clock.out()` tells)."""
    groups: dict[str, dict[str, Any]] = {}
    read = 0
    for info in _within(paths_mod.iter_paths(scenario, limit=_PATHS_READ, witnesses=False), clock):
        read += 1
        requires = _field_requires(scenario, info.constraints)
        relations = _field_relations(scenario, info)
        when = [text for text, _ in relations]
        key = json.dumps([requires, when], sort_keys=True)
        group = groups.setdefault(key, {"requires": requires, "when": when, "paths": [], "actions": [],
                                        "words": [w for _, w in relations if w]})
        group["paths"].append(info.id)
        if info.action not in group["actions"]:
            group["actions"].append(info.action)
    ranked = sorted(groups.values(), key=lambda g: -len(g["paths"]))[:MAX_STARTER_INTENTS]
    ranked.sort(key=lambda g: g["paths"][0])
    lines = [f"# Starter profile of {scenario.name} (`sop profiles init`); the format: docs/synthesis.md.",
             "# Each intent is one combination of classification values the SOP's paths require. Rewrite each",
             "# description as the customer's situation, in their words; add `intensity:`, `pushes_for:` or",
             "# `when:` where they help; then `sop profiles check` this file.",
             f"scenario: {scenario.name}",
             f"description: {json.dumps(scenario.description or scenario.title or scenario.name, ensure_ascii=False)}",
             "", "intents:"]
    taken: set[str] = set()
    for group in ranked:
        shown = ", ".join(group["paths"][:6]) + (", …" if len(group["paths"]) > 6 else "")
        lines.append(f"  # paths {shown} -> {', '.join(group['actions'])}")
        lines.append(f"  {_intent_name(group['requires'], taken, group['when'])}:")
        lines.append(f"    description: {json.dumps(_starter_description(scenario, group['requires'], group['words']), ensure_ascii=False)}")
        if group["requires"]:
            lines.append(f"    requires: {json.dumps(group['requires'], ensure_ascii=False)}")
        if group["when"]:
            lines.append(f"    when: {json.dumps(' and '.join(group['when']), ensure_ascii=False)}")
    if len(groups) > len(ranked):
        lines.append(f"  # {len(groups) - len(ranked)} rarer combinations left out (synthesis covers their paths "
                     "with generated intents)")
    system = [v for v in scenario.variables.values() if v.role == "system" and v.name != "now"]
    if system:
        # the backend's values start unknown to the customer: the author says which ones a customer sees
        lines += ["", "# user_knows: whether the simulated customer knows the value. A system value is the backend's,",
                  "# so every one starts false; set true where a customer sees it (an order's status on the",
                  "# tracking page, whether they paid). Lists and records stay false: the customer would paste JSON.",
                  "variables:"]
        for var in system:
            why = _unknown_why(var)
            why = f"  # {why}" if why else ""
            lines.append(f"  {var.name}: {{user_knows: false}}{why}")
    return "\n".join(lines) + "\n", len(ranked), read


def _unknown_why(var: ir.Variable) -> str:
    """Why a system value should stay unknown to the customer even where a customer might see it (the
    starter's comment), or "" for a plain value the author may well set to `true`."""
    if var.hidden:
        return "hidden: internal to the business"
    if var.observed:
        return "observed: the backend's news after an action"
    if isinstance(var.type, ir.ListType | ir.RecordType):
        return "the backend's data (a list or record), not a fact a customer states"
    return ""

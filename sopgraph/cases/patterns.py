"""Random strings of a pattern: a fresh id of the form an SOP tests (`AC-[0-9]{6}` → `AC-827926`) or a
profile declares. Below profiles and values, which both use it (a profile's `pattern:` is checked by
building one)."""

from __future__ import annotations

import random
import sre_constants
import sre_parse
from typing import Any

from sopgraph.language import scalars

_WORD = "abcdefghijklmnopqrstuvwxyz"


def random_match(pattern: str, rng: random.Random) -> str | None:
    """A random string that fully matches `pattern` (repeats between their minimum and a few more), or
    None when the pattern uses constructs this builder does not know."""
    try:
        text = _build(sre_parse.parse(pattern), rng)
    except (sre_constants.error, _Unknown, RecursionError):
        return None
    return text if scalars.compiled(pattern).fullmatch(text) else None


class _Unknown(Exception):
    """A regular-expression construct the random builder does not cover."""


def _build(seq: Any, rng: random.Random) -> str:
    out: list[str] = []
    for op, av in seq:
        name = str(op)
        if name == "LITERAL":
            out.append(chr(av))
        elif name == "IN":
            out.append(_class_pick(av, rng))
        elif name == "ANY":
            out.append(rng.choice(_WORD))
        elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            lo, hi, sub = av
            top = lo + 3 if hi == sre_constants.MAXREPEAT else min(hi, lo + 3)
            out.extend(_build(sub, rng) for _ in range(rng.randint(lo, max(lo, top))))
        elif name == "SUBPATTERN":
            out.append(_build(av[-1], rng))
        elif name == "BRANCH":
            out.append(_build(rng.choice(av[1]), rng))
        elif name == "AT":
            continue
        else:
            raise _Unknown(name)
    return "".join(out)


def _class_pick(items: Any, rng: random.Random) -> str:
    choices: list[str] = []
    for op, av in items:
        name = str(op)
        if name == "NEGATE":
            raise _Unknown(name)
        if name == "LITERAL":
            choices.append(chr(av))
        elif name == "RANGE":
            choices.extend(chr(c) for c in range(av[0], min(av[1], av[0] + 95) + 1))
        elif name == "CATEGORY":
            category = str(av)
            choices.extend("0123456789" if "DIGIT" in category and "NOT" not in category else _WORD)
        else:
            raise _Unknown(name)
    if not choices:
        raise _Unknown("empty class")
    return rng.choice(choices)

"""Personas that fit the customer's mood in the case truth.

Most service SOPs classify the customer's mood (SAGE's six scenarios all do: `EmotionTag: Calm |
Discontent`, `UserEmotion: Urgent | Dissatisfied | Normal`), and a persona has an emotional state of its
own (`calm`, `frustrated`, `angry`). Drawn independently, a case could ask the simulated user to be a
calm customer and an angry persona at once; the judges then label the mood the user showed, not the one
the case expects, and the reference path moves. Synthesis therefore draws a case's persona among those
whose emotional state fits the mood values of its truth (`compatible`), and from the whole pool when
none fits. A mood field is recognised by its name (mood, emotion, tone, sentiment, attitude, feeling,
frustrated, angry, upset); its values, and a persona's state, are sorted into three moods by their words.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from sopgraph.language import ir

CALM, UPSET, URGENT = "calm", "upset", "urgent"

_MOOD_FIELD = re.compile(r"mood|emotion|tone|sentiment|attitude|feeling|temper|frustrat|angry|upset|annoy",
                         re.IGNORECASE)
_WORDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    (UPSET, re.compile(r"upset|dissatisf|discontent|angr|frustrat|aggress|hostil|annoy|unhapp|furious|irritat"
                       r"|complain|negative|distress|rude|mad\b", re.IGNORECASE)),
    (URGENT, re.compile(r"urgen|anxious|worr|impatien|stress|panic|hurr|nervous|rush", re.IGNORECASE)),
    (CALM, re.compile(r"calm|normal|neutral|compos|polite|relax|happy|satisf|friendl|content|positive|patient"
                      r"|fine|ok\b", re.IGNORECASE)),
)


def mood_of(text: str) -> str | None:
    """The mood a value name or an emotional state says (`Discontent` → upset, `Normal` → calm)."""
    words = re.sub(r"(?<=[a-z])(?=[A-Z])", " ", text)  # `NotUpset` reads as `Not Upset`
    if re.search(r"\bnot?\b|\bun(?!happ)", words, re.IGNORECASE):
        return None  # a negation: let the meaning decide nothing
    for mood, pattern in _WORDS:
        if pattern.search(words):
            return mood
    return None


def mood_fields(scenario: ir.Scenario) -> dict[str, dict[Any, str]]:
    """Fields about the customer's mood: name → {value: mood} for the values whose mood is clear."""
    out: dict[str, dict[Any, str]] = {}
    for var in scenario.fields:
        if not _MOOD_FIELD.search(var.name):
            continue
        moods: dict[Any, str]
        if isinstance(var.type, ir.EnumType):
            moods = {v: m for v in var.type.values if (m := mood_of(v)) is not None}
        elif isinstance(var.type, ir.BoolType):
            named = mood_of(var.name)
            moods = {True: named, False: CALM} if named is not None and named != CALM else {}
        else:
            moods = {}
        if moods:
            out[var.name] = moods
    return out


def truth_moods(fields: Mapping[str, Mapping[Any, str]], truth: Mapping[str, Any]) -> tuple[str, ...]:
    """The moods a case's truth states (one per mood field with a recognised value), in field order."""
    found = []
    for name, moods in fields.items():
        value = truth.get(name)
        try:
            mood = moods.get(value)
        except TypeError:  # an unhashable value
            mood = None
        if mood is not None:
            found.append(mood)
    return tuple(found)


def compatible(state: str, moods: Sequence[str]) -> bool:
    """Whether a persona's emotional state fits the truth's moods: a calm customer is played by a calm
    persona; an upset or urgent one by a persona that is not calm. A state of no clear mood fits all."""
    persona = mood_of(state)
    if persona is None:
        return True
    return all((persona == CALM) == (mood == CALM) for mood in moods)

"""`cases.moods`: a case's persona fits the customer's mood in its truth."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

import sopgraph
from sopgraph.cases.moods import CALM, UPSET, URGENT, compatible, mood_fields, mood_of
from sopgraph.cases.profiles import load_profile
from sopgraph.cases.synth import synthesize

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("text, mood", [
    ("Calm", CALM), ("Normal", CALM), ("relaxed", CALM), ("Discontent", UPSET), ("Dissatisfied", UPSET),
    ("angry", UPSET), ("Frustrated", UPSET), ("Urgent", URGENT), ("impatient", URGENT), ("anxious", URGENT),
    ("confused", None), ("NotUpset", None), ("Question", None)])
def test_moods_are_read_from_words(text: str, mood: str | None) -> None:
    assert mood_of(text) == mood


def test_mood_fields_of_the_sage_scenarios_and_a_bool() -> None:
    telecom = sopgraph.load(ROOT / "scenarios" / "telecom_package.sop")
    assert mood_fields(telecom) == {"EmotionTag": {"Calm": CALM, "Discontent": UPSET}}
    airline = sopgraph.load(ROOT / "scenarios" / "airline_refund.sop")
    assert mood_fields(airline) == {"UserEmotion": {"Urgent": URGENT, "Dissatisfied": UPSET, "Normal": CALM}}
    gym = sopgraph.load(ROOT / "examples" / "gym_membership.sop")
    assert mood_fields(gym) == {"Frustrated": {True: UPSET, False: CALM}}
    assert compatible("calm", [CALM]) and not compatible("angry", [CALM]) and not compatible("calm", [UPSET])
    assert compatible("impatient", [UPSET]) and compatible("confused", [CALM])


def test_synthesized_personas_fit_the_truths_mood() -> None:
    """Drawn independently, 12 of 30 telecom cases asked for a calm customer played by an angry persona
    or the reverse; now none does (every intensity's pool has personas of both kinds)."""
    sop = ROOT / "scenarios" / "telecom_package.sop"
    scenario = sopgraph.load(sop)
    cases = synthesize(scenario, load_profile(sop.with_suffix(".profile.yaml"), scenario), 200, seed=5).cases
    clashes = Counter((c.truth["EmotionTag"], c.persona.emotional_state) for c in cases
                      if not compatible(c.persona.emotional_state, [mood_fields(scenario)["EmotionTag"][c.truth["EmotionTag"]]]))
    assert not clashes
    kinds = Counter(c.truth["EmotionTag"] for c in cases)
    assert kinds["Calm"] > 20 and kinds["Discontent"] > 20  # both moods are drawn

"""Where a scenario's user profile lives (`x.sop` → `x.profile.yaml`), apart from the profiles themselves:
`sop check` asks whether a profile exists before it imports the profile reader and synthesis (yaml,
pydantic models, the solver: start-up that a program without a profile never needs)."""

from __future__ import annotations

from pathlib import Path

PROFILE_SUFFIX = ".profile.yaml"


def profile_path_for(sop_path: str | Path) -> Path:
    """`scenarios/x.sop` → `scenarios/x.profile.yaml`."""
    p = Path(sop_path)
    return p.with_name(p.name[: -len(p.suffix)] + PROFILE_SUFFIX if p.suffix else p.name + PROFILE_SUFFIX)


def sop_path_for(profile_path: str | Path) -> Path:
    """`scenarios/x.profile.yaml` → `scenarios/x.sop`."""
    p = Path(profile_path)
    name = p.name
    base = name[: -len(PROFILE_SUFFIX)] if name.endswith(PROFILE_SUFFIX) else p.stem
    return p.with_name(base + ".sop")

"""Example agents for `sop run --model agent=...` (see docs/agents.md)."""

"""Authoring from prose: `sop draft` (an LLM drafts a `.sop` through the gateway, then check -> repair)."""

"""The SOP owner's tools: `sop draft` (an LLM drafts a `.sop` through the gateway, then check -> repair),
`sop validate` (hold an SOP against labelled decisions) and `sop diff` (what a change decides differently)."""

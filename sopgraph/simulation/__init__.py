"""Simulation: the model gateway (the only litellm importer), built-in offline providers, prompts, the
dialogue loop, the judges, the resumable runner and its SQLite store."""

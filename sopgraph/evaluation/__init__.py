"""Evaluation: metrics and their statistics over stored runs, coverage, HTML reports and training
corpora. Reads runs; never calls a model except `corpus.synthesize_dialogues`, through the runner."""

"""The logic: the rule engine (what a program decides), the constraint domain (what it can decide),
feasible paths, and the static checker built on both."""

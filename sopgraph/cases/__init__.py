"""Cases: user profiles (intents, personas, intensities) and coverage-balanced case synthesis by
inverse configuration over the feasible paths."""

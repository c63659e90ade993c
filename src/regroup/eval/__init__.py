"""Evaluation: unbiased pass@k / mean@n estimators (`passk`) and the evaluation runner (`runner`)."""

"""Models: the built-in tiny model and loading of any local HF causal LM."""

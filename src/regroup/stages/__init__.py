"""The stages of one training step that act on samples (not tensors): group construction, rephrased
variants, anchors, fine-grained scoring for masks, rewards and diagnostics. Each recipe switches a
subset of them on at start-up (see `regroup.recipes`)."""

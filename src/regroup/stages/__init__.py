"""The stages of one training step that act on samples (not tensors): group construction, rephrased
variants, anchors, fine-grained scoring for masks, rewards and diagnostics. Each recipe switches a
subset of them on at start-up (see `regroup.train.recipes`)."""

# Importing the package registers every built-in stage on `regroup.config.registry.STAGES`, in pipeline order.
from regroup.stages import (  # noqa: F401, I001  (imported to register the stages; the order is the pipeline's)
    rephrasing,
    anchors,
    sampling,
    rewarding,
    overlong,
    dynamic_sampling,
    advantages,
    masking,
)

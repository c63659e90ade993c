"""Whole weights out of a sharded model: checkpoints and vLLM weight pushes under FSDP / DeepSpeed ZeRO-3.

Under FSDP and ZeRO-3 every process holds a shard of each parameter, so `unwrap_model(model)
.save_pretrained(...)` on rank 0 writes rank 0's shards, and pushing `named_parameters()` into a vLLM
engine pushes shards. Here:

- `full_state_dict` / `save_model_weights`: accelerate's `get_state_dict` gathers the full state dict
  (a collective: every process calls it; rank 0 gets the tensors, the others None) and rank 0 writes
  ordinary HF weights (`save_pretrained(state_dict=...)`), loadable without regroup or accelerate.
- `save_training_state` / `load_training_state`: accelerate's `save_state` / `load_state`, which write
  and read the optimizer (and the model) in the sharded layout the FSDP / DeepSpeed config asks for,
  so `--resume` restores sharded optimizer state on every rank.
- `full_parameters`: (name, whole tensor) one parameter at a time, gathered where sharded (FSDP2
  DTensor, FSDP1 flat parameters, ZeRO-3 partitioned parameters), so a weight push never holds more
  than one gathered parameter at a time beyond what the engine keeps. Also a collective.

DDP, ZeRO-1/2 and one process hold whole parameters: every function here then does the plain thing.
`tests/runtime/test_sharded.py` runs the FSDP2 paths in 2 processes over gloo on CPU.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import torch


def is_sharded(accelerator) -> bool:
    """True when parameters are sharded across processes: FSDP, or DeepSpeed ZeRO stage 3."""
    kind = str(getattr(accelerator, "distributed_type", "")).rsplit(".", 1)[-1].upper()
    if kind == "FSDP":
        return True
    if kind == "DEEPSPEED":
        plugin = getattr(getattr(accelerator, "state", None), "deepspeed_plugin", None)
        return getattr(plugin, "zero_stage", 0) == 3
    return False


def full_state_dict(accelerator, model) -> dict | None:
    """The whole model's state dict on the main process (CPU tensors under FSDP), None on the others.
    Collective under FSDP / ZeRO-3: every process must call it. ZeRO-3 needs
    `stage3_gather_16bit_weights_on_model_save: true` in the DeepSpeed config (accelerate says so otherwise)."""
    state = accelerator.get_state_dict(model, unwrap=True)
    return state if accelerator.is_main_process else None


def save_model_weights(accelerator, model, tokenizer, path: str | Path) -> None:
    """Write HF weights (safetensors + config) and the tokenizer to `path` from the main process, the
    full parameters gathered first where sharded. Every process must call it; it returns when the
    files are written."""
    sharded = is_sharded(accelerator)
    state = full_state_dict(accelerator, model) if sharded else None
    if accelerator.is_main_process:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        unwrapped = accelerator.unwrap_model(model)
        if state is not None:  # sharded: the full state gathered above
            write_hf_weights(unwrapped, state, path)
        else:
            unwrapped.save_pretrained(path, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(path)
    accelerator.wait_for_everyone()


def write_hf_weights(model, state: dict, path: Path) -> None:
    """`model.safetensors` + config of a gathered state dict. Not `save_pretrained(state_dict=...)`: it
    still inspects the live, sharded parameters (tied-weight detection) and fails on DTensor shards."""
    from safetensors.torch import save_file  # only a sharded save writes weights itself

    tied = getattr(model, "all_tied_weights_keys", None) or getattr(model, "_tied_weights_keys", None) or {}
    tied = tied if isinstance(tied, dict) and getattr(model.config, "tie_word_embeddings", False) else {}
    # A tied weight (lm_head = embed_tokens) is stored once, as save_pretrained does; loading re-ties it.
    tensors = {
        name: tensor.detach().to("cpu").contiguous()
        for name, tensor in state.items()
        if not (name in tied and tied[name] in state)
    }
    model.config.save_pretrained(path)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(path)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})


TRAINING_STATE_DIR = "accelerate_state"
"""Folder (inside a checkpoint) of accelerate's save_state: model, optimizer, scheduler and RNG states,
sharded where the FSDP / DeepSpeed config shards them."""


def save_training_state(accelerator, checkpoint_dir: str | Path) -> Path:
    """Save the prepared model / optimizer / scheduler state through accelerate (every process calls
    it: each writes its own shards). Returns the folder."""
    out = Path(checkpoint_dir) / TRAINING_STATE_DIR
    accelerator.save_state(str(out))
    accelerator.wait_for_everyone()
    return out


def load_training_state(accelerator, checkpoint_dir: str | Path) -> None:
    """Restore what `save_training_state` wrote into the prepared objects (every process calls it)."""
    folder = Path(checkpoint_dir) / TRAINING_STATE_DIR
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} does not exist: the checkpoint was not saved with sharded training state")
    accelerator.load_state(str(folder))


def _is_fsdp1(model) -> bool:
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel  # only under FSDP
    except ImportError:  # pragma: no cover - torch without distributed
        return False
    return any(isinstance(m, FullyShardedDataParallel) for m in model.modules())


@contextmanager
def _zero3_gathered(param):
    import deepspeed  # optional (deepspeed): only under ZeRO-3

    with deepspeed.zero.GatheredParameters([param], modifier_rank=None):
        yield


def full_parameters(model) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, whole tensor) for every parameter of `model`, gathering one at a time where sharded.
    A gathered tensor is only valid until the next item. Collective where sharded: every process must
    iterate all of it, in the same order."""
    with ExitStack() as stack:
        if _is_fsdp1(model):  # flat parameters: summon them all (FSDP1 has no per-parameter gather)
            from torch.distributed.fsdp import FullyShardedDataParallel  # only under FSDP

            stack.enter_context(FullyShardedDataParallel.summon_full_params(model, writeback=False))
        for name, param in model.named_parameters():
            name = name.replace("_fsdp_wrapped_module.", "")
            data = param.data
            if hasattr(data, "full_tensor"):  # FSDP2 DTensor shard
                yield name, data.full_tensor()
            elif hasattr(param, "ds_id"):  # DeepSpeed ZeRO-3 partitioned parameter
                with _zero3_gathered(param):
                    yield name, param.data
            else:
                yield name, data

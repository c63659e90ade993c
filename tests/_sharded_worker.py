"""One process of `tests/runtime/test_sharded.py`: FSDP2 (torch `fully_shard`) over gloo on CPU, 2 processes.

accelerate runs FSDP only on accelerators, so the model is sharded with torch's own `fully_shard` and
the Accelerator is told it runs FSDP (its FSDP2 code paths are plain torch.distributed calls that work
over gloo). Writes OUT_DIR/rank{r}.json with what each check saw.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(out_dir: str) -> None:
    import torch
    from accelerate import Accelerator
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin
    from torch.distributed.fsdp import fully_shard

    from regroup.models.tiny import TinyModelConfig, build_model, build_tokenizer
    from regroup.rollout.vllm import push_weights
    from regroup.runtime.sharded import (
        full_parameters,
        is_sharded,
        load_training_state,
        save_model_weights,
        save_training_state,
    )

    out = Path(out_dir)
    acc = Accelerator(cpu=True)
    tokenizer = build_tokenizer()
    model = build_model(
        tokenizer, TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64), seed=0
    )
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    acc._models.append(model)
    optimizer = acc.prepare_optimizer(optimizer)
    # after prepare_optimizer, which re-reads the launch environment into the shared state
    acc.state.distributed_type = DistributedType.FSDP
    acc.state.fsdp_plugin = FullyShardedDataParallelPlugin(fsdp_version=2, state_dict_type="SHARDED_STATE_DICT")
    ids = torch.tensor([[5, 6, 7, 8, 9]])

    def train_step():
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    train_step()
    report = {
        "sharded": is_sharded(acc),
        "local_rows": int(model.model.layers[0].self_attn.q_proj.weight.data.to_local().shape[0]),
    }
    full = {name: tensor.clone() for name, tensor in full_parameters(model)}
    pushed = {}
    push_weights(model, lambda weights: pushed.update({n: t.clone() for n, t in weights}))
    report["push_equals_full"] = sorted(pushed) == sorted(full) and all(torch.equal(pushed[n], full[n]) for n in full)
    report["push_shapes"] = {n: list(t.shape) for n, t in pushed.items() if "q_proj" in n}

    save_model_weights(acc, model, tokenizer, out / "weights")
    torch.save(full, out / f"full{acc.process_index}.pt")

    state_dir = save_training_state(acc, out / "ckpt")
    report["state_files"] = sorted(p.name for p in state_dir.iterdir())
    before = {name: tensor.clone() for name, tensor in full_parameters(model)}
    train_step()  # move weights and optimizer state on
    moved_to = {name: tensor.clone() for name, tensor in full_parameters(model)}
    moved = any(not torch.equal(t, before[n]) for n, t in moved_to.items())
    load_training_state(acc, out / "ckpt")
    restored = all(torch.equal(t, before[n]) for n, t in full_parameters(model))
    # the restored optimizer takes the same next step as an uninterrupted run would
    train_step()
    after_resume = {name: tensor.clone() for name, tensor in full_parameters(model)}
    same_step = all(torch.allclose(after_resume[n], moved_to[n], atol=1e-6, rtol=0) for n in moved_to)
    report.update(moved=moved, restored=restored, resumed_step_equals_uninterrupted=same_step)
    (out / f"rank{acc.process_index}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1])

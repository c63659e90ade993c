"""One process of the frozen-rank test (`tests/distributed/test_ddp.py::test_frozen_rank_stops_the_other`).

Run by `accelerate launch ... tests/_freeze_worker.py MODEL_DIR RUN_DIR OUT_DIR TIMEOUT_S`. Rank 1 writes
its pid and stops itself (SIGSTOP) after the first step; rank 0 goes on into the next step's collectives
and must stop with the one-line message within `train.collective_timeout_s`. Rank 0 writes
`OUT_DIR/rank0.json` with that message and the seconds it waited.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> None:
    model_dir, run_dir, out_dir, timeout_s = argv
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import _dist_worker

    from regroup.cli import user_error
    from regroup.train.build import build_trainer

    cfg = _dist_worker.make_config(
        model_dir,
        run_dir,
        overrides=(f"train.collective_timeout_s={timeout_s}", "train.steps=3", "rewards.timeout_s=0"),
    )
    trainer = build_trainer(cfg, run_dir, log=lambda m: None)
    out = Path(out_dir)
    stopped_at = []

    def on_step(step, metrics):  # rank 0 only
        pass

    if trainer.rank == 1:
        original = trainer.train_step

        def freeze_after_first(step):
            if step == 1:
                (out / "rank1.pid").write_text(str(os.getpid()))
                os.kill(os.getpid(), signal.SIGSTOP)
            return original(step)

        trainer.train_step = freeze_after_first
    else:
        original = trainer.train_step

        def timed(step):
            if step == 1:
                stopped_at.append(time.monotonic())
            return original(step)

        trainer.train_step = timed
    try:
        trainer.train(on_step=on_step)
        record = {"finished": True}
    except Exception as exc:  # noqa: BLE001 - the test reads what the CLI would print
        record = {
            "line": user_error(exc),
            "error": f"{type(exc).__name__}: {exc}"[:2000],
            "waited_s": time.monotonic() - stopped_at[0] if stopped_at else None,
        }
    if trainer.rank == 0:
        (out / "rank0.json").write_text(json.dumps(record))
    os._exit(3 if "line" in record else 0)


if __name__ == "__main__":
    main(sys.argv[1:])

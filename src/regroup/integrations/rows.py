"""Where each row of a fixed-shape front-end's batch (TRL's generation batch, verl's rollout batch) is after the
recipe's stages ran on it: the front-ends keep their rows and write back the samples that now hold them."""

from __future__ import annotations

from regroup.batch import Sample


def rows_after_stages(rows: list[Sample], samples: list[Sample]) -> list[int]:
    """For each of the front-end's rows, the index in `samples` (the batch after the stages) of the sample it
    now holds.

    The stages a fixed-shape front-end runs keep the batch's shape: a sample is kept, or (anchors in replace
    mode) dropped for an anchor of its group, which then takes its row — in order, within the group."""
    index = {id(s): k for k, s in enumerate(samples)}
    before = {id(r) for r in rows}
    added: dict[int, list[int]] = {}
    for k, s in enumerate(samples):
        if id(s) not in before:
            added.setdefault(s.group_id, []).append(k)
    out: list[int] = []
    for r in rows:
        if id(r) in index:
            out.append(index[id(r)])
        elif added.get(r.group_id):
            out.append(added[r.group_id].pop(0))
        else:
            raise RuntimeError(
                "a stage dropped a sample without replacing it; the recipe's check_front_end "
                "should have refused that stage"
            )
    if any(added.values()):
        raise RuntimeError("a stage added samples beyond the batch's fixed shape (refused by check_front_end)")
    return out

"""`regroup data prepare NAME --out FILE`: public training sets mapped to regroup's problem rows.

Each target names where its rows come from (the hub id, or an installed package) and how one row of
the published schema becomes a `Problem`. Rows are read from `--source` when given, else from a local
copy in `$REGROUP_DATA_DIR`, else from the hub; offline, the error says which file to place where.
A row without a usable answer is skipped and counted, never guessed.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from regroup.config.schema import DataConfig
from regroup.data.heldout import heldout_problems
from regroup.data.load import DataError, FieldMap, HubSpec, problems_from_rows, save_problems, source_rows
from regroup.rewards.math_verify import extract_boxed
from regroup.tasks import get_task
from regroup.tasks.arithmetic.grading import ANSWER_MARKER
from regroup.tasks.base import Problem


def first_text(row: Mapping[str, Any], *names: str) -> str | None:
    """The first of `names` that the row holds as non-empty text (published mirrors rename columns)."""
    for name in names:
        value = row.get(name)
        if isinstance(value, str) and value.strip():
            return value
    return None


def answer_text(value: Any) -> str | None:
    """An answer cell as text: numbers without a spurious `.0`, lists joined by ", ", `$...$` unwrapped."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, (list, tuple)):
        parts = [answer_text(v) for v in value]
        return ", ".join(p for p in parts if p) or None
    text = str(value).strip()
    if len(text) >= 2 and text.startswith("$") and text.endswith("$"):
        text = text.strip("$").strip()
    return text or None


def chat_content(messages: Any, role: str) -> str | None:
    """The content of the last message with `role` in a list of {role, content} dicts."""
    if not isinstance(messages, (list, tuple)):
        return None
    texts = [m.get("content") for m in messages if isinstance(m, Mapping) and m.get("role") == role]
    texts = [t for t in texts if isinstance(t, str) and t.strip()]
    return texts[-1] if texts else None


# ------------------------------------------------------------------------------------- row mappings


def math_row(row: Mapping[str, Any], i: int) -> Problem | None:
    """MATH (Hendrycks et al.): problem, solution, level, type; the answer is the solution's last \\boxed{}."""
    question, solution = first_text(row, "problem", "question"), first_text(row, "solution")
    answer = extract_boxed(solution) if solution else None
    if not question or not answer:
        return None
    return Problem(
        id=str(row.get("unique_id") or i),
        question=question,
        answer=answer.strip(),
        solution=solution,
        difficulty=first_text(row, "level"),
        meta={"type": row.get("type")} if row.get("type") else {},
    )


def openr1_row(row: Mapping[str, Any], i: int) -> Problem | None:
    """OpenR1-Math-46k (LUFFY's verl layout): prompt / target chat lists, reward_model.ground_truth.
    The DeepSeek-R1 trace (target) becomes `solution`: DaGRPO's off-policy anchor."""
    question = chat_content(row.get("prompt"), "user") or first_text(row, "problem", "question")
    solution = chat_content(row.get("target"), "assistant") or first_text(row, "solution")
    reward_model = row.get("reward_model")
    if not isinstance(reward_model, Mapping):
        reward_model = {}
    answer = answer_text(reward_model.get("ground_truth")) or answer_text(row.get("answer"))
    if not question or not answer:
        return None
    extra = row.get("extra_info") if isinstance(row.get("extra_info"), Mapping) else {}
    pid = extra.get("index", i) if extra else i
    return Problem(
        id=str(pid),
        question=question,
        answer=answer,
        solution=solution,
        meta={"data_source": row["data_source"]} if row.get("data_source") else {},
    )


def deepscaler_row(row: Mapping[str, Any], i: int) -> Problem | None:
    """DeepScaleR-Preview (agentica): problem, answer, solution."""
    question, answer = first_text(row, "problem", "question"), answer_text(row.get("answer"))
    if not question or not answer:
        return None
    return Problem(id=str(i), question=question, answer=answer, solution=first_text(row, "solution"))


def champ_rows(path: str | None = None) -> list[dict]:
    """The 270 CHAMP problems shipped by the `champ-dataset` package (or a copy of its v0.json)."""
    if path is None:
        spec = importlib.util.find_spec("champ_dataset")
        folders = list(spec.submodule_search_locations or []) if spec else []
        found = [
            Path(f) / "dataset_files" / "v0.json" for f in folders if (Path(f) / "dataset_files" / "v0.json").is_file()
        ]
        if not found:
            raise DataError(
                "champ", None, None, "the champ-dataset package is not installed: pip install champ-dataset"
            )
        path = str(found[0])
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    problems = data.get("problems") if isinstance(data, Mapping) else None
    if not isinstance(problems, Mapping):
        raise DataError(path, None, None, "expected CHAMP's v0.json layout ({'problems': {id: {...}}})")
    return list(problems.values())


def champ_row(row: Mapping[str, Any], i: int) -> Problem | None:
    """CHAMP (Mao et al.): identifier, _text, _answer, category, solution.steps[]._text."""
    question, answer = first_text(row, "_text", "text"), answer_text(row.get("_answer"))
    if not question or not answer:
        return None
    steps = (row.get("solution") or {}).get("steps") or []
    solution = "\n".join(s.get("_text", "") for s in steps if isinstance(s, Mapping)) or None
    return Problem(
        id=str(row.get("identifier") or i),
        question=question,
        answer=answer,
        solution=solution,
        difficulty=first_text(row, "category"),
        meta={"category": row.get("category")},
    )


@dataclass(frozen=True)
class PrepareTarget:
    name: str
    hub: HubSpec | None
    """Where the rows are published (None: no known hub copy; `--source` or the package)."""
    fields: str
    """The published columns read, named in the offline message."""
    to_problem: Callable[[Mapping[str, Any], int], Problem | None] | None
    """One row -> Problem (None: skipped); None for layouts folded over several rows."""
    description: str


TARGETS = {
    "math": PrepareTarget(
        "math",
        HubSpec("DigitalLearningGmbH/MATH-lighteval", None, "train"),
        " (fields problem, solution)",
        math_row,
        "MATH training split (7,500), answer from the solution's last \\boxed{}",
    ),
    "openr1_math_46k": PrepareTarget(
        "openr1_math_46k",
        HubSpec("Elliott/Openr1-Math-46k-8192", None, "train"),
        " (fields prompt, target, reward_model)",
        openr1_row,
        "OpenR1-Math-46k (LUFFY), the DeepSeek-R1 trace as `solution` for DaGRPO anchors",
    ),
    "deepscaler": PrepareTarget(
        "deepscaler",
        HubSpec("agentica-org/DeepScaleR-Preview-Dataset", None, "train"),
        " (fields problem, answer, solution)",
        deepscaler_row,
        "DeepScaleR-Preview (40k problems)",
    ),
    "ta_grpo": PrepareTarget(
        "ta_grpo",
        None,
        " (rows index, sub_index, question or problem, answer)",
        None,
        "TA-GRPO's released rephrasings: rows sharing `index` fold into one problem with variants",
    ),
    "champ": PrepareTarget(
        "champ", None, "", champ_row, "CHAMP: 270 competition problems, from the champ-dataset package"
    ),
    "arithmetic_boxed": PrepareTarget(
        "arithmetic_boxed",
        None,
        "",
        None,
        "the built-in task's default training problems with \\boxed{} reference "
        "solutions (DaGRPO anchors under rewards=[math]) and 3 rule rephrasings "
        "as `variants` (TA-GRPO with ta.rephraser=dataset): `--limit` of them, "
        "data.num_train by default",
    ),
    "arithmetic_heldout": PrepareTarget(
        "arithmetic_heldout",
        None,
        "",
        None,
        "the built-in task's held-out problems (data.eval_seed), none of them a "
        "default training question: `--limit` of them, 256 by default",
    ),
}


HELDOUT_DEFAULT = 256
"""Held-out problems `regroup data prepare arithmetic_heldout` writes without `--limit` (as the warm-up's)."""


def arithmetic_heldout(limit: int | None) -> list[Problem]:
    """The held-out problems a default run of the built-in task is evaluated on (`regroup.train.build`)."""
    data, task = DataConfig(), get_task("arithmetic")
    train = task.generate(data.num_train, seed=data.seed)
    return heldout_problems(task, limit or HELDOUT_DEFAULT, data.eval_seed, train)


def boxed_solution(solution: str) -> str:
    """The built-in task's reference "7+5=12. 12-3=9. #### 9" as "7+5=12. 12-3=9. The answer is \\boxed{9}.":
    the same steps, ending the way the math reward reads an answer (the last \\boxed{})."""
    steps, marker, answer = solution.rpartition(ANSWER_MARKER)
    if not marker or not answer.strip():
        raise ValueError(f"not a built-in reference solution (no {ANSWER_MARKER} answer): {solution!r}")
    return f"{steps.strip()} The answer is \\boxed{{{answer.strip()}}}."


def arithmetic_boxed(limit: int | None, n_variants: int = 3) -> list[Problem]:
    """The training problems a default run of the built-in task draws (data.num_train at data.seed), with
    boxed reference solutions and `n_variants` rule rephrasings each (seeded by data.seed: reproducible)."""

    data, task = DataConfig(), get_task("arithmetic")
    rng = random.Random(data.seed)
    return [
        replace(p, solution=boxed_solution(p.solution), variants=tuple(task.rephrase(p, n_variants, rng)))
        for p in task.generate(limit or data.num_train, seed=data.seed)
    ]


def _fold_ta_rows(rows: list[dict], origin: str) -> list[Problem]:
    question = next((n for n in ("question", "problem", "prompt") if any(n in r for r in rows)), "question")
    answer = next((n for n in ("answer", "ground_truth", "final_answer") if any(n in r for r in rows)), "answer")
    if not any("index" in r and "sub_index" in r for r in rows):
        raise DataError(origin, None, None, "expected TA-GRPO rows with `index` and `sub_index` columns")
    return problems_from_rows(rows, FieldMap(question=question, answer=answer, id=None), origin)


def prepare(name: str, out: str, source: str | None = None, limit: int | None = None) -> dict[str, Any]:
    """Write target `name` as regroup JSONL to `out`; returns {"target", "source", "written", "skipped"}."""
    if name not in TARGETS:
        raise DataError(name, None, None, f"unknown data set; choose one of {', '.join(TARGETS)}")
    target = TARGETS[name]
    if name in ("arithmetic_heldout", "arithmetic_boxed"):
        problems = arithmetic_heldout(limit) if name == "arithmetic_heldout" else arithmetic_boxed(limit)
        save_problems(problems, out)
        return {"target": name, "source": "built-in arithmetic task", "written": len(problems), "skipped": 0}
    if name == "champ":
        rows = champ_rows(source)
        origin = source if source is not None else "champ-dataset package"
    else:
        rows, origin = source_rows(name, target.hub, source, target.fields)
    if target.to_problem is None:
        problems = _fold_ta_rows(rows, origin)
    else:
        problems = [p for i, row in enumerate(rows) if (p := target.to_problem(row, i)) is not None]
    skipped = len(rows) - len(problems) if target.to_problem is not None else 0
    if not problems:
        raise DataError(origin, None, None, f"no usable rows for {name}{target.fields}")
    if limit is not None:
        problems = problems[:limit]
    problems, renamed = unique_ids(problems)
    save_problems(problems, out)
    return {"target": name, "source": origin, "written": len(problems), "skipped": skipped, "renamed_ids": renamed}


def unique_ids(problems: list[Problem]) -> tuple[list[Problem], int]:
    """Problems with unique ids (the loader refuses repeats): a published id seen before gets `-2`, `-3`, ...
    in row order (OpenR1-Math-46k's `extra_info.index` repeats across its sources). Returns them and how
    many were renamed."""
    taken = {p.id for p in problems}
    seen: dict[str, int] = {}
    out, renamed = [], 0
    for p in problems:
        n = seen.get(p.id, 0) + 1
        seen[p.id] = n
        if n == 1:
            out.append(p)
            continue
        new_id = f"{p.id}-{n}"
        while new_id in taken:
            n += 1
            new_id = f"{p.id}-{n}"
        seen[p.id] = n
        taken.add(new_id)
        out.append(dataclasses.replace(p, id=new_id))
        renamed += 1
    return out, renamed

"""Loading problems from files: every format, field mapping, TA folding, and clear errors."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from regroup.data.load import DataError, FieldMap, load_problems, save_problems
from regroup.tasks.base import Problem

ROWS = [
    {"id": "a", "question": "What is 1+1?", "answer": "2", "solution": "1+1=2. #### 2"},
    {"id": "b", "question": "What is 2+3?", "answer": 5, "solution": None},
    {"id": "c", "question": "Half of 1?", "answer": 0.5},
]
EXPECTED = [
    Problem("a", "What is 1+1?", "2", "1+1=2. #### 2"),
    Problem("b", "What is 2+3?", "5"),
    Problem("c", "Half of 1?", "0.5"),
]


def _jsonl(path: Path, rows: list, raw: list[str] | None = None) -> Path:
    lines = [json.dumps(r) for r in rows] + (raw or [])
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _csv(path: Path, rows: list[dict]) -> Path:
    keys = sorted({k for r in rows for k in r})
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, keys)
        w.writeheader()
        w.writerows([{k: ("" if v is None else v) for k, v in r.items()} for r in rows])
    return path


# -- formats ------------------------------------------------------------------------------------------


def test_jsonl(tmp_path):
    assert load_problems(_jsonl(tmp_path / "d.jsonl", ROWS)).problems == EXPECTED


def test_json_list(tmp_path):
    path = tmp_path / "d.json"
    path.write_text(json.dumps(ROWS))
    assert load_problems(path).problems == EXPECTED


def test_csv(tmp_path):
    assert load_problems(_csv(tmp_path / "d.csv", ROWS)).problems == EXPECTED


def test_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rows = [{**r, "answer": str(r["answer"])} for r in ROWS]  # one type per column
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet")
    assert load_problems(tmp_path / "d.parquet").problems == EXPECTED


def test_parquet_numeric_answers(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.table({"question": ["q1", "q2"], "answer": [3.0, 2.5]}), tmp_path / "n.parquet")
    got = load_problems(tmp_path / "n.parquet").problems
    assert [(p.id, p.answer) for p in got] == [("0", "3"), ("1", "2.5")]  # ids default to the row index


def test_saved_dataset_folder(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = [{**r, "answer": str(r["answer"])} for r in ROWS]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "ds"))
    assert load_problems(tmp_path / "ds").problems == EXPECTED
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(DataError, match=r"several splits \['train'\]"):
        load_problems(tmp_path / "dd")
    assert load_problems(tmp_path / "dd" / "train").problems == EXPECTED


def test_save_then_load_round_trip(tmp_path):
    problems = [
        Problem(
            "x1",
            "Mia has 7 shells.\nHow many?",
            "7",
            "#### 7",
            ("Tom has 7 shells. How many?",),
            "steps=0",
            {"start": 7, "ops": []},
        ),
        Problem("x2", "Ünïcode ✓", "\\frac{1}{2}"),
    ]
    path = tmp_path / "sub" / "out.jsonl"
    save_problems(problems, path)
    back = load_problems(path).problems
    assert back == problems and [p.meta for p in back] == [p.meta for p in problems]
    assert not list(path.parent.glob("*.tmp"))  # the atomic write leaves nothing behind


# -- fields -------------------------------------------------------------------------------------------


def test_field_mapping(tmp_path):
    rows = [{"problem": "What is 1+1?", "final": 2, "uid": 17, "alts": ["1 plus 1?"], "level": 3, "extra": [1]}]
    fields = FieldMap(question="problem", answer="final", id="uid", variants="alts", difficulty="level", solution=None)
    (p,) = load_problems(_jsonl(tmp_path / "m.jsonl", rows), fields).problems
    assert p == Problem("17", "What is 1+1?", "2", None, ("1 plus 1?",), "3")


def test_csv_variants_and_meta_as_json_cells(tmp_path):
    rows = [{"question": "q", "answer": "1", "variants": json.dumps(["v1", "v2"]), "meta": json.dumps({"k": 1})}]
    (p,) = load_problems(_csv(tmp_path / "v.csv", rows)).problems
    assert p.variants == ("v1", "v2") and p.meta == {"k": 1}


# -- TA-GRPO layout -----------------------------------------------------------------------------------


def test_ta_index_sub_index_folding(tmp_path):
    rows = [
        {"index": 5, "sub_index": 2, "question": "q5 v2", "answer": "10"},
        {"index": 5, "sub_index": 0, "question": "q5", "answer": "10", "solution": "s5"},
        {"index": 9, "sub_index": 0, "question": "q9", "answer": "3"},
        {"index": 5, "sub_index": 1, "question": "q5 v1", "answer": "10"},
    ]
    got = load_problems(_jsonl(tmp_path / "ta.jsonl", rows)).problems
    assert got == [Problem("5", "q5", "10", "s5", ("q5 v1", "q5 v2")), Problem("9", "q9", "3")]
    # the same from CSV, where every cell is text
    assert load_problems(_csv(tmp_path / "ta.csv", rows)).problems == got


def test_ta_variant_without_original(tmp_path):
    rows = [
        {"index": 1, "sub_index": 0, "question": "q", "answer": "1"},
        {"index": 2, "sub_index": 1, "question": "orphan", "answer": "2"},
    ]
    path = _jsonl(tmp_path / "ta.jsonl", rows)
    with pytest.raises(DataError) as err:
        load_problems(path)
    assert (err.value.row, err.value.field) == (2, "sub_index")
    assert "index=2" in str(err.value) and "no original" in str(err.value)
    result = load_problems(path, skip_bad_rows=True)
    assert [p.id for p in result.problems] == ["1"] and [e.row for e in result.skipped] == [2]


def test_ta_duplicate_pair(tmp_path):
    rows = [
        {"index": 1, "sub_index": 0, "question": "q", "answer": "1"},
        {"index": 1, "sub_index": 0, "question": "q again", "answer": "1"},
    ]
    with pytest.raises(DataError, match=r"row 2 field 'sub_index': duplicate .*first at row 1"):
        load_problems(_jsonl(tmp_path / "ta.jsonl", rows))


# -- malformed input ----------------------------------------------------------------------------------


def _error(path: Path) -> DataError:
    with pytest.raises(DataError) as err:
        load_problems(path)
    return err.value


GOOD = {"id": "g", "question": "q", "answer": "1"}


@pytest.mark.parametrize(
    "raw,row,field,message",
    [
        ('{"question": "q", "answer": ', 2, None, "invalid JSON"),
        ("[1, 2]", 2, None, "expected an object, got list"),
        ('{"question": "q"}', 2, "answer", "missing"),
        ('{"answer": "1"}', 2, "question", "missing"),
        ('{"question": 5, "answer": "1"}', 2, "question", "expected text, got int"),
        ('{"question": "   ", "answer": "1"}', 2, "question", "empty"),
        ('{"question": "q", "answer": true}', 2, "answer", "got bool"),
        ('{"question": "q", "answer": [1]}', 2, "answer", "expected text, got list"),
        ('{"question": "q", "answer": "1", "variants": "v"}', 2, "variants", "list of strings"),
        ('{"question": "q", "answer": "1", "variants": ["v", 3]}', 2, "variants", "item 1"),
        ('{"question": "q", "answer": "1", "meta": [1]}', 2, "meta", "expected an object"),
        ('{"question": "q\\udc80", "answer": "1"}', 2, "question", "invalid UTF-8"),
        ('{"id": "g", "question": "q2", "answer": "1"}', 2, "id", "duplicate id 'g' (first at row 1)"),
    ],
)
def test_malformed_jsonl_rows(tmp_path, raw, row, field, message):
    path = _jsonl(tmp_path / "bad.jsonl", [GOOD], [raw])
    err = _error(path)
    assert (err.path, err.row, err.field) == (str(path), row, field)
    assert message in str(err)
    where = f"{path} row {row}" + (f" field '{field}'" if field else "")
    assert str(err).startswith(where + ": ")
    # and with skip_bad_rows the good row survives
    result = load_problems(path, skip_bad_rows=True)
    assert [p.id for p in result.problems] == ["g"] and len(result.skipped) == 1 and result.skipped[0].row == row


def test_invalid_utf8(tmp_path):
    path = tmp_path / "bytes.jsonl"
    path.write_bytes(b'{"question": "q", "answer": "1"}\n{"question": "caf\xe9", "answer": "2"}\n')
    err = _error(path)
    assert err.row == 2 and "invalid UTF-8" in str(err)
    csv_path = tmp_path / "bytes.csv"
    csv_path.write_bytes(b"question,answer\nok,1\ncaf\xe9,2\n")
    err = _error(csv_path)
    assert (err.row, err.field) == (2, "question") and "invalid UTF-8" in str(err)
    json_path = tmp_path / "bytes.json"
    json_path.write_bytes(b'[{"question": "ok", "answer": "1"}, {"question": "x", "answer": "caf\xe9"}]')
    err = _error(json_path)
    assert (err.row, err.field) == (2, "answer")


@pytest.mark.parametrize(
    "name,content",
    [
        ("e.jsonl", ""),
        ("e.jsonl", "\n\n"),
        ("e.json", "[]"),
        ("e.json", ""),
        ("e.csv", ""),
        ("e.csv", "question,answer\n"),
    ],
)
def test_empty_files(tmp_path, name, content):
    path = tmp_path / name
    path.write_text(content)
    err = _error(path)
    assert err.row is None and "empty file" in str(err) and str(path) in str(err)


def test_file_level_errors(tmp_path):
    assert "no such file" in str(_error(tmp_path / "missing.jsonl"))
    (tmp_path / "d.txt").write_text("x")
    assert "unsupported format '.txt'" in str(_error(tmp_path / "d.txt"))
    (tmp_path / "d.json").write_text('{"question": "q"}')
    assert "expected a JSON list" in str(_error(tmp_path / "d.json"))
    (tmp_path / "bad.parquet").write_bytes(b"not parquet")
    assert "not a readable Parquet file" in str(_error(tmp_path / "bad.parquet"))
    (tmp_path / "short.csv").write_text("question,answer\nq\n")
    err = _error(tmp_path / "short.csv")
    assert err.row == 1 and "1 cells, the header has 2" in str(err)


def test_skip_bad_rows_collects_and_all_bad_raises(tmp_path):
    path = _jsonl(tmp_path / "mix.jsonl", [GOOD, {"question": "no answer"}, {**GOOD, "id": "h"}], ["nope"])
    result = load_problems(path, skip_bad_rows=True)
    assert [p.id for p in result.problems] == ["g", "h"]
    assert [(e.row, e.field) for e in result.skipped] == [(2, "answer"), (4, None)]
    all_bad = _jsonl(tmp_path / "bad.jsonl", [{"question": "q"}])
    with pytest.raises(DataError, match="no usable rows: 1 bad"):
        load_problems(all_bad, skip_bad_rows=True)


def test_data_error_pickles():
    import pickle

    err = pickle.loads(pickle.dumps(DataError("f.jsonl", 3, "answer", "missing")))
    assert str(err) == "f.jsonl row 3 field 'answer': missing" and err.row == 3

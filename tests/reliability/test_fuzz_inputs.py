"""Property tests on hostile inputs: the loaders fail only with DataError naming the file (and the row
when one row is to blame); the grader, step scorer and math checker always return a float in range,
within their time limit."""

from __future__ import annotations

import json
import math
import os
import tempfile
import typing

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from regroup.data.load import DataError, load_problems
from regroup.tasks.arithmetic import generate, grade, step_score
from regroup.tasks.base import Problem

pytestmark = pytest.mark.reliability

FUZZ = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_scalars = (
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.floats(allow_nan=True) | st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
FIELDS = ["id", "question", "answer", "solution", "variants", "difficulty", "meta", "index", "sub_index", "extra"]
rows = st.lists(
    st.one_of(
        st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=6),
        st.fixed_dictionaries({"question": st.text(max_size=30), "answer": json_values}),
        json_values,  # not an object at all
    ),
    max_size=6,
)


def _load(path: str, skip: bool) -> None:
    """Loading either succeeds with well-typed problems or raises a DataError that locates itself."""
    try:
        result = load_problems(path, skip_bad_rows=skip)
    except DataError as err:
        assert str(err).startswith(path), err
        assert err.row is None or err.row >= 1
        return
    for p in result.problems:
        assert isinstance(p.question, str) and p.question.strip()
        assert isinstance(p.answer, str) and isinstance(p.id, str)
        assert all(isinstance(v, str) for v in p.variants)
        json.dumps(p.to_dict())  # everything loaded is serialisable again
    for err in result.skipped:
        assert str(err).startswith(path) and err.row is not None and err.row >= 1


def _write(data: bytes, suffix: str) -> str:
    fd, path = tempfile.mkstemp(suffix=suffix)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return path


@FUZZ
@given(rows=rows, skip=st.booleans())
def test_jsonl_rows_of_any_shape(rows, skip):
    def dump(r):
        try:
            return json.dumps(r)
        except ValueError:
            return "{bad"

    path = _write("\n".join(dump(r) for r in rows).encode("utf-8", "surrogatepass"), ".jsonl")
    try:
        _load(path, skip)
    finally:
        os.unlink(path)


@FUZZ
@given(rows=rows, skip=st.booleans())
def test_json_list_of_any_shape(rows, skip):
    path = _write(json.dumps(rows).encode("utf-8", "surrogatepass"), ".json")
    try:
        _load(path, skip)
    finally:
        os.unlink(path)


@FUZZ
@given(
    data=st.binary(max_size=300), suffix=st.sampled_from([".jsonl", ".json", ".csv", ".parquet"]), skip=st.booleans()
)
def test_random_bytes(data, suffix, skip):
    path = _write(data, suffix)
    try:
        _load(path, skip)
    finally:
        os.unlink(path)


@FUZZ
@given(cells=st.lists(st.lists(st.text(max_size=10), min_size=1, max_size=4), max_size=5), skip=st.booleans())
def test_csv_of_any_shape(cells, skip):
    import csv
    import io

    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["question", "answer", "variants"][: max(1, len(cells[0]) if cells else 1)])
    w.writerows(cells)
    path = _write(buf.getvalue().encode("utf-8", "surrogatepass"), ".csv")
    try:
        _load(path, skip)
    finally:
        os.unlink(path)


@settings(max_examples=15, deadline=None)
@given(prefix=st.binary(max_size=20), skip=st.booleans())
def test_invalid_utf8_and_huge_lines(prefix, skip):
    huge = json.dumps({"question": "x" * 1_000_000, "answer": "1"}).encode()  # a 1 MB line
    data = huge + b"\n" + b'{"question": "' + prefix + b'", "answer": "2"}\n'
    path = _write(data, ".jsonl")
    try:
        _load(path, skip)
    finally:
        os.unlink(path)


def test_empty_and_whitespace_files():
    for suffix in (".jsonl", ".json", ".csv", ".parquet"):
        for data in (b"", b"\n \n"):
            path = _write(data, suffix)
            try:
                with pytest.raises(DataError):
                    load_problems(path)
            finally:
                os.unlink(path)


# -- graders on random text ---------------------------------------------------------------------------

PROBLEMS = generate(20, seed=11)
text = st.text(max_size=200) | st.text(alphabet="0123456789+-=#.x ", max_size=200)


@FUZZ
@given(response=text, which=st.integers(0, len(PROBLEMS) - 1))
def test_grader_and_step_score_on_random_text(response, which):
    p = PROBLEMS[which]
    g, s = grade(response, p), step_score(response, p)  # a hang would never return: the test would not end
    assert g in (0.0, 1.0)
    assert isinstance(s, float) and math.isfinite(s) and 1.0 <= s <= 10.0


@pytest.fixture(scope="module")
def checker():
    pytest.importorskip("math_verify")
    from regroup.rewards.math_verify import MathAnswerChecker

    with MathAnswerChecker(timeout_s=0.5, max_chars=2000) as c:
        c.warm_up()
        yield c


latexish = st.text(alphabet="0123456789{}()^\\/+-*.,=xab $", max_size=60)


@settings(
    max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(inner=latexish | st.text(max_size=60), answer=latexish | st.text(max_size=10), boxed=st.booleans())
def test_math_checker_on_random_text(checker, inner, answer, boxed):
    response = f"\\boxed{{{inner}}}" if boxed else inner
    checker.pop_counts()
    value = checker(response, Problem("f", "q", answer or "0"))
    assert value in (0.0, 1.0)
    # no hang: a check is cut at the checker's own deadline (timeout_s + grace_s), counted as one event, and the
    # call returns a verdict either way (a hang would never return)
    counts = checker.pop_counts()
    assert counts.get("checked", 0) == 1 and counts.get("timeout", 0) <= 1, counts


# -- every numeric config field with its bad values ---------------------------------------------------


def _numeric_cases():
    """(dotted key, bad value as YAML) for every numeric field: nan, ±inf, and the values just past each
    bound of its rule (0 where it must be positive, -1 where it must be >= 0, a huge value past an upper bound)."""
    from helpers import numeric_keys, numeric_rules

    def text(x: float) -> str:
        return str(int(x)) if float(x).is_integer() and abs(x) < 2**53 else repr(float(x))

    cases = []
    for key in numeric_keys():
        rule = numeric_rules()[key]
        low, high = rule.get("gt", rule.get("ge")), rule.get("lt", rule.get("le"))
        bad = [".nan", ".inf", "-.inf"]
        if low is not None:
            bad.append(text(low) if "gt" in rule else text(low - 1))
            bad.append("-1e30")
        if high is not None:
            bad.append(text(high) if "lt" in rule else text(high + 1))
            bad.append("1e30" if high < 1e30 else "1e300")
        if key in FLOAT_KEYS:
            bad.append("1.0e-320")  # passes `> 0` and `>= 0`, and is 0 in float32
        cases += [(key, value) for value in dict.fromkeys(bad)]
    return cases


def _float_keys() -> set[str]:
    from regroup.config.fields import leaves
    from regroup.config.schema import RunConfig

    return {key for key, _, hint in leaves(RunConfig) if hint is float or float in typing.get_args(hint)}


FLOAT_KEYS = _float_keys()
NUMERIC_CASES = _numeric_cases()


def test_the_numeric_fuzz_covers_every_field():
    from helpers import numeric_keys

    assert {key for key, _ in NUMERIC_CASES} == set(numeric_keys())
    assert len(NUMERIC_CASES) > 4 * len(numeric_keys())


@pytest.mark.parametrize("key, value", NUMERIC_CASES, ids=[f"{k}={v}" for k, v in NUMERIC_CASES])
def test_every_numeric_field_rejects_its_bad_values(key, value):
    from regroup.errors import ConfigError
    from regroup.train.run_config import load_config

    with pytest.raises(ConfigError) as err:
        load_config(None, [f"{key}={value}"])
    assert str(err.value).startswith(key), err.value


def test_every_numeric_field_accepts_its_bounds():
    """The rules are not stricter than they say: each closed bound itself loads (where no cross-field rule
    forbids it), so the bad values above fail for the right reason."""
    from helpers import numeric_rules

    from regroup.train.run_config import load_config

    cross_field = {"grpo.num_generations": 1, "anchors.count": 2**31 - 1}  # a group of one; count < G
    checked = 0
    for key, rule in numeric_rules().items():
        for op, bound in rule.items():
            if op in ("gt", "lt") or cross_field.get(key) == bound:
                continue
            value = int(bound) if float(bound).is_integer() and abs(bound) < 2**53 else bound
            load_config(None, [f"{key}={value}"])
            checked += 1
    assert checked > 40


# -- every float knob of every built-in piece: the values that passed its bounds and broke the loss ---------------


def _knob_cases():
    """(overrides selecting the piece, dotted knob key) for every float knob of every built-in loss piece and
    advantage estimator (the run config's float keys are NUMERIC_CASES above)."""
    import regroup.algo  # noqa: F401  (registers the built-in pieces)
    from regroup.config.fields import leaves
    from regroup.config.registry import ADV_ESTIMATORS, KL_ESTIMATORS, POLICY_LOSSES, args_class

    cases = []
    for registry, key in ((POLICY_LOSSES, "grpo.policy_loss"), (KL_ESTIMATORS, "grpo.kl_estimator")):
        for name in registry.names():
            args = args_class(registry.get(name))
            for knob, _, hint in leaves(args) if args else ():
                if hint is float or float in typing.get_args(hint):
                    cases.append(([f"{key}={name}"], f"{key}_args.{knob}"))
    for name in ADV_ESTIMATORS.names():
        args = args_class(ADV_ESTIMATORS.get(name))
        for knob, _, hint in leaves(args) if args else ():
            if hint is float or float in typing.get_args(hint):
                cases.append(([f"grpo.advantage_estimator={name}"], f"grpo.advantage_estimator_args.{knob}"))
    return cases


KNOB_CASES = [
    (select, key, value)
    for select, key in _knob_cases()
    for value in ("9" * 401, "1.0e-320", "-1.0e-320", ".nan", "1.0e+300")
]


def test_the_knob_fuzz_covers_every_float_knob():
    keys = {key for _, key, _ in KNOB_CASES}
    assert {
        "grpo.policy_loss_args.delta",
        "grpo.policy_loss_args.temperature_pos",
        "grpo.advantage_estimator_args.eps",
    } <= keys
    assert len(keys) >= 10


@pytest.mark.parametrize("select, key, value", KNOB_CASES, ids=[f"{k}={v[:12]}" for _, k, v in KNOB_CASES])
def test_every_float_knob_refuses_values_it_cannot_use_in_one_line(select, key, value):
    """A 401-digit integer was an OverflowError traceback; 1e-320 passed `> 0` (sapo's temperatures, grpo's eps)
    and is 0 in float32, where the loss uses it: every update NaN and skipped, exit 0."""
    from regroup.errors import ConfigError
    from regroup.train.run_config import load_config

    with pytest.raises(ConfigError) as err:
        load_config(None, [*select, f"{key}={value}"])
    assert str(err.value).startswith(key) and "\n" not in str(err.value), err.value


@pytest.mark.parametrize(
    "overrides, words",
    [
        (["grpo.policy_loss=sapo", "grpo.policy_loss_args.temperature_pos=1.0e-320"], "temperature_pos must be"),
        (["grpo.policy_loss=sapo", "grpo.policy_loss_args.temperature_neg=1.0e-37"], "temperature_neg must be"),
        (["grpo.advantage_estimator_args.eps=1.0e-320"], "eps: 1e-320 is 0 in float32"),
        (["grpo.policy_loss_args.delta=" + "9" * 401], "delta: a 401-digit number is out of range"),
    ],
)
def test_an_unusable_knob_is_exit_2_before_any_model(overrides, words, tmp_path, capsys, no_compute):
    import reliability_helpers as h

    from regroup.cli import main

    assert main(["train", "--config", "grpo", f"run_dir={tmp_path / 'r'}", *overrides]) == 2
    assert words in h.one_line(capsys)

"""Config loading: YAML recipes, dotted overrides, type and cross-field errors naming the key."""

from pathlib import Path

import pytest

from regroup.config.fields import read_yaml
from regroup.config.schema import PACKAGED_CONFIGS, field_docs, resolve_config_path
from regroup.errors import ConfigError
from regroup.train.run_config import config_from_dict, load_config, save_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.mark.parametrize("name", sorted(p.name for p in CONFIGS.glob("*.yaml")))
def test_every_shipped_recipe_loads(name):
    cfg = load_config(CONFIGS / name)
    assert cfg.recipe == name.removesuffix(".yaml")


def test_a_recipe_name_is_the_shipped_recipe_unless_a_file_has_that_name(tmp_path, monkeypatch):
    """A folder named like a recipe in the working directory (a run folder, say) does not hide the shipped
    recipe; only an existing file is read as the recipe. A folder that names no recipe is one ConfigError."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "dagrpo").mkdir()
    assert resolve_config_path("dagrpo") == PACKAGED_CONFIGS / "dagrpo.yaml"
    assert load_config("dagrpo").recipe == "dagrpo"
    (tmp_path / "grpo").write_text("extends: " + str(PACKAGED_CONFIGS / "grpo.yaml") + "\nseed: 7\n")
    assert load_config("grpo").seed == 7  # a file of that name is the recipe
    (tmp_path / "mine").mkdir()
    for load in (lambda: load_config("mine"), lambda: read_yaml(tmp_path / "mine")):
        with pytest.raises(ConfigError) as e:
            load()
        assert "folder" in str(e.value) and "\n" not in str(e.value)


def test_recipes_switch_the_documented_pieces():
    ta = load_config(CONFIGS / "ta_grpo.yaml")
    assert ta.ta.enabled and ta.ta.ratio_anchor == "original" and not ta.mask.enabled
    da = load_config(CONFIGS / "dagrpo.yaml")
    assert da.mask.enabled and da.anchors.enabled and da.grpo.advantage_estimator == "dr_grpo" and da.grpo.beta == 0
    both = load_config(CONFIGS / "dagrpo_ta.yaml")
    assert both.ta.enabled and both.mask.enabled and both.anchors.enabled
    matched = load_config(CONFIGS / "grpo_matched.yaml")
    # the same samples per question as TA-GRPO: (N+1)·G
    assert (
        matched.grpo.samples_multiplier * matched.grpo.num_generations
        == (ta.ta.n_variants + 1) * ta.grpo.num_generations
    )


def test_overrides_are_typed():
    cfg = load_config(
        CONFIGS / "grpo.yaml",
        [
            "optim.lr=3e-4",
            "train.steps=7",
            "grpo.loss_agg=seq_sum_constant",
            "model.lora.enabled=true",
            "rewards=task,math*0.5",
        ],
    )
    assert cfg.optim.lr == pytest.approx(3e-4) and isinstance(cfg.optim.lr, float)
    assert cfg.train.steps == 7 and cfg.grpo.loss_agg == "seq_sum_constant" and cfg.model.lora.enabled
    assert cfg.rewards.functions == ["task", "math*0.5"]


@pytest.mark.parametrize(
    "override, key",
    [
        ("optim.lrr=1", "optim.lrr"),
        ("nosuch=1", "nosuch"),
        ("grpo.num_generations=eight", "grpo.num_generations"),
        ("grpo.loss_agg=mean", "grpo.loss_agg"),
        ("train.progress=yes please", "train.progress"),
        ("grpo.prompts_per_step=0", "grpo.prompts_per_step"),
        ("rollout.top_p=1.5", "rollout.top_p"),
        ("grpo.num_generations=1", "grpo.num_generations"),
        ("model.path=/no/such/model", "model.path"),
        ("data.train_file=/no/such.jsonl", "data.train_file"),
        ("rewards=task*heavy", "rewards"),
    ],
)
def test_bad_config_names_the_key(override, key):
    with pytest.raises(ConfigError) as err:
        load_config(CONFIGS / "grpo.yaml", [override])
    assert key in str(err.value)


def test_impossible_anchor_count_is_rejected():
    both = ["anchors.source=both", "anchors.buffer_size=8"]  # sources that could fill 8 slots
    with pytest.raises(ConfigError, match=r"anchors.count \(8\) must be < grpo.num_generations"):
        load_config(CONFIGS / "dagrpo.yaml", ["anchors.count=8", *both])


@pytest.mark.parametrize(
    "overrides, most",
    [
        (["anchors.count=2"], 1),  # source=reference: a question has one reference solution
        (["anchors.count=3", "anchors.source=self", "anchors.buffer_size=2"], 2),
        (["anchors.count=4", "anchors.source=both", "anchors.buffer_size=2"], 3),
    ],
)
def test_more_anchors_than_the_source_can_give_is_one_line(overrides, most):
    """Once such a count injected fewer anchors than asked (one reference per question), silently, in the native
    trainer and on verl alike."""
    with pytest.raises(ConfigError) as err:
        load_config(CONFIGS / "dagrpo.yaml", ["grpo.num_generations=8", *overrides])
    line = str(err.value)
    assert line.startswith("anchors: count=") and f"at most {most} anchor" in line and "\n" not in line
    # the most the source can give loads; a switched-off section is not checked
    at_most = [o for o in overrides if not o.startswith("anchors.count=")] + [f"anchors.count={most}"]
    assert load_config(CONFIGS / "dagrpo.yaml", ["grpo.num_generations=8", *at_most]).anchors.count == most
    assert not load_config(CONFIGS / "dagrpo.yaml", [*overrides, "anchors.enabled=false"]).anchors.enabled


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("grpo: [unclosed")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(bad)


def test_saved_config_round_trips(tmp_path):
    cfg = load_config(CONFIGS / "dagrpo_ta.yaml", ["seed=3"])
    save_config(cfg, tmp_path / "config.yaml")
    import yaml

    again = config_from_dict(yaml.safe_load((tmp_path / "config.yaml").read_text()))
    assert again == cfg


def test_every_field_has_a_docstring():
    rows = field_docs()
    assert len(rows) > 60
    undocumented = [key for key, _, doc in rows if not doc]
    # section fields (model, data, ...) are documented by their class; every leaf has its own line
    assert undocumented == [], undocumented


# -- numeric rules: every int/float field has one ---------------------------------------------------------


def test_every_numeric_field_has_bounds():
    """A new int/float field must declare its bounds on the field (F(..., ge=/gt=/le=/lt=, or finite=True)),
    and only numeric fields may carry bounds."""
    from helpers import numeric_keys, numeric_rules

    keys, rules = numeric_keys(), numeric_rules()
    assert len(keys) > 50
    assert "optim.lr" in keys and "mask.scorer.timeout_s" in keys and "diagnostics.grad_conflict_every" in keys
    assert sorted(set(keys) - set(rules)) == [], "numeric fields without bounds"
    assert sorted(set(rules) - set(keys)) == [], "bounds on a field that is not a number"


def test_the_bounds_check_catches_a_field_without_bounds():
    """The check above can fail: a section with an unbounded int field is reported by numeric_rules/keys."""
    from helpers import numeric_keys, numeric_rules

    from regroup.config import fields

    class Extra(fields.Section):
        bounded: int = fields.F(1, "has bounds", ge=0)
        unbounded: int = fields.F(1, "has none")

    assert numeric_keys(Extra) == ["bounded", "unbounded"]
    assert numeric_rules(Extra) == {"bounded": {"ge": 0}}


def test_bounds_by_hand():
    """One value against a setting's type and bounds (what the command line's numeric options use too)."""
    from regroup.config.fields import check_value

    def ok(value, **limits) -> bool:
        try:
            check_value(value, float, **limits)
        except ConfigError:
            return False
        return True

    assert [ok(v, gt=0.0, le=1.0) for v in (0.0, 1e-9, 1.0, 1.0001, float("nan"), float("inf"))] == [
        False,
        True,
        True,
        False,
        False,
        False,
    ]
    assert [ok(v, ge=0.0, le=1.0) for v in (-1e-12, 0.0, 1.0, 1.5)] == [False, True, True, False]
    assert ok(1.0, ge=0.0, lt=1.0) is False
    with pytest.raises(ConfigError, match=r"^must be a finite number >= 0, got -1$"):
        check_value(-1, int, ge=0)
    with pytest.raises(ConfigError, match=r"^must be a finite number > 0 and <= 1, got 2.0$"):
        check_value(2.0, float, gt=0.0, le=1.0)


@pytest.mark.parametrize(
    "override, key",
    [
        ("optim.max_grad_norm=-1", "optim.max_grad_norm"),
        ("optim.max_grad_norm=0", "optim.max_grad_norm"),
        ("optim.min_lr_ratio=-5", "optim.min_lr_ratio"),
        ("optim.lr=.inf", "optim.lr"),
        ("optim.lr=.nan", "optim.lr"),
        ("rollout.temperature=0", "rollout.temperature"),
        ("seed=-1", "seed"),
        ("train.threads=-3", "train.threads"),
        ("mask.delta=.nan", "mask.delta"),
        ("anchors.gamma=-0.1", "anchors.gamma"),
        ("grpo.mini_batches=0", "grpo.mini_batches"),
        ("rewards.workers=0", "rewards.workers"),
        ("rewards.correct_threshold=.nan", "rewards.correct_threshold"),
    ],
)
def test_out_of_range_values_name_the_key(override, key):
    with pytest.raises(ConfigError) as err:
        load_config(CONFIGS / "grpo.yaml", [override])
    assert str(err.value).startswith(key + " must be"), err.value


def test_overlong_buffer_must_fit_under_max_new_tokens():
    load_config(CONFIGS / "grpo.yaml", ["overlong.buffer=100"])  # unused without soft_punish
    with pytest.raises(ConfigError, match="overlong.buffer"):
        load_config(
            CONFIGS / "grpo.yaml", ["overlong.soft_punish=true", "overlong.buffer=48", "rollout.max_new_tokens=48"]
        )
    load_config(CONFIGS / "grpo.yaml", ["overlong.soft_punish=true", "overlong.buffer=47", "rollout.max_new_tokens=48"])


# -- named pieces and data files, before any model loads ---------------------------------------------------


@pytest.mark.parametrize(
    "override, message",
    [
        ("rewards=[]", "no reward function"),
        ("rewards=[nosuch]", "unknown reward 'nosuch'"),
        ("rewards=[mth]", "did you mean 'math'"),
        ("rewards=[task*nan]", "finite"),
        ("rewards=[json:nosuch_fn]", "no attribute"),
        ("rewards=[no_such_module_xyz:fn]", "cannot import"),
        ("rewards=[json:__doc__]", "not callable"),
        ("mask.enabled=true mask.scorer.name=jduge", "did you mean 'judge'"),
        ("ta.rephraser=rulez", "did you mean 'rules'"),
        ("data.task=arithmetc", "did you mean 'arithmetic'"),
    ],
)
def test_piece_names_are_checked_with_did_you_mean(override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("*", r"\*")):
        load_config(CONFIGS / "grpo.yaml", override.split())


def test_a_dotted_reward_that_imports_is_accepted():
    cfg = load_config(CONFIGS / "grpo.yaml", ["rewards=[json:dumps*0.5,task]"])
    assert cfg.rewards.functions == ["json:dumps*0.5", "task"]


def _data(tmp_path, rows):
    import json

    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize(
    "override, alternative",
    [
        ("rewards=[task]", "rewards=[math]"),
        ("rewards=[math] mask.enabled=true mask.scorer.name=step", "judge or similarity"),
        ("rewards=[math] ta.enabled=true ta.rephraser=rules", "ta.rephraser=openai, or dataset"),
    ],
)
def test_task_bound_pieces_refuse_external_data(tmp_path, override, alternative):
    data = _data(tmp_path, [{"question": "1+1?", "answer": "2"}])
    with pytest.raises(ConfigError, match=alternative.replace("[", r"\[").replace("]", r"\]")):
        load_config(CONFIGS / "grpo.yaml", [f"data.train_file={data}", *override.split()])
    # the same pieces on the built-in generated data stay the default path
    load_config(CONFIGS / "dagrpo_ta.yaml")
    load_config(CONFIGS / "grpo.yaml", [f"data.train_file={data}", "rewards=[math]"])


def test_a_user_task_owns_its_data(tmp_path):
    data = _data(tmp_path, [{"question": "1+1?", "answer": "2"}])
    cfg = load_config(
        CONFIGS / "grpo.yaml", [f"data.train_file={data}", "data.task=regroup.tasks.arithmetic:ArithmeticTask"]
    )
    assert cfg.rewards.functions == ["task"]
    with pytest.raises(ConfigError, match="data.task"):
        load_config(CONFIGS / "grpo.yaml", ["data.task=regroup.tasks.arithmetic:NoSuchTask"])


def test_dataset_rephraser_needs_stored_variants(tmp_path):
    plain = _data(tmp_path, [{"question": "1+1?", "answer": "2"}])
    base = ["rewards=[math]", "ta.enabled=true", "ta.rephraser=dataset"]
    with pytest.raises(ConfigError, match="no 'variants' column and no index/sub_index"):
        load_config(CONFIGS / "grpo.yaml", [f"data.train_file={plain}", *base])
    with pytest.raises(ConfigError, match="data.train_file"):
        load_config(CONFIGS / "grpo.yaml", base)  # generated questions have no stored variants
    (tmp_path / "v").mkdir()
    variants = _data(tmp_path / "v", [{"question": "1+1?", "answer": "2", "variants": ["one plus one?"]}])
    load_config(CONFIGS / "grpo.yaml", [f"data.train_file={variants}", *base])
    (tmp_path / "ta").mkdir()
    folded = _data(
        tmp_path / "ta",
        [
            {"index": 0, "sub_index": 0, "question": "1+1?", "answer": "2"},
            {"index": 0, "sub_index": 1, "question": "one plus one?", "answer": "2"},
        ],
    )
    load_config(CONFIGS / "grpo.yaml", [f"data.train_file={folded}", *base])


def test_data_files_must_exist_and_be_readable(tmp_path):
    with pytest.raises(ConfigError, match="data.eval_file: no such file"):
        load_config(CONFIGS / "grpo.yaml", [f"data.eval_file={tmp_path / 'nope.jsonl'}"])
    unreadable = tmp_path / "locked.jsonl"
    unreadable.write_text("{}")
    unreadable.chmod(0)
    import os

    if os.geteuid() != 0:  # root reads anything
        with pytest.raises(ConfigError, match="cannot read"):
            load_config(CONFIGS / "grpo.yaml", [f"data.train_file={unreadable}", "rewards=[math]"])


def test_resume_overrides_are_limited_to_keys_that_take_effect():
    from regroup.config.schema import check_resume_overrides

    check_resume_overrides(["train.steps=30", "train.keep_checkpoints=1", "train.progress=false"])
    with pytest.raises(ConfigError, match="--resume cannot change optim.lr"):
        check_resume_overrides(["train.steps=30", "optim.lr=0.5"])
    with pytest.raises(ConfigError, match="rewards"):
        check_resume_overrides(["rewards=[math]"])


# -- the YAML reader's limits: depth, size, duplicate keys ----------------------------------------------


def test_yaml_keys_appear_once_but_merges_may_override():
    from regroup.config.fields import load_yaml

    assert load_yaml("base: &b {lr: 1}\noptim:\n  <<: *b\n  lr: 2\n", "f") == {"base": {"lr": 1}, "optim": {"lr": 2}}
    with pytest.raises(ConfigError, match=r"f: key 'lr' appears twice \(lines 2 and 3\)"):
        load_yaml("optim:\n  lr: 1\n  lr: 2\n", "f")


def test_yaml_nesting_and_size_limits_are_one_line():
    from regroup.config.fields import MAX_DEPTH, MAX_TEXT, load_yaml

    assert load_yaml("a: " + "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1), "f") is not None
    with pytest.raises(ConfigError, match="nested more than"):
        load_yaml("a: " + "[" * MAX_DEPTH + "]" * MAX_DEPTH, "f")
    with pytest.raises(ConfigError, match="more than a config may have"):
        load_yaml("a: " + "x" * MAX_TEXT, "f")


def alias_bomb(levels: int = 8, width: int = 10) -> str:
    """A few hundred bytes of YAML whose `rewards.functions[0]` is width**levels strings once its aliases are
    expanded (PyYAML builds each aliased list once and shares it: loading is instant, a repr is not)."""
    names = "abcdefghijklmnopqrstuvwxyz"
    lines = ["rewards:", "  functions:", f"  - - &a [{', '.join(['x'] * width)}]"]
    for prev, name in zip(names[: levels - 1], names[1:levels]):
        lines.append(f"    - &{name} [{', '.join([f'*{prev}'] * width)}]")
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_is_one_line_before_anything_is_built(tmp_path):
    """10^8 values from 412 bytes: refused by the loader while it counts the aliases' expansion, in the file, an
    `extends:` parent and an override alike (before, a refusal's message repr'd all of them: minutes, gigabytes)."""
    from regroup.config.fields import MAX_VALUES, load_yaml

    bomb = alias_bomb()
    assert len(bomb) < 503
    bomb_file = tmp_path / "bomb.yaml"
    bomb_file.write_text(bomb)
    (tmp_path / "child.yaml").write_text("extends: bomb.yaml\n")
    inline = "[" + ", ".join(f"&{n} [{', '.join([f'*{p}'] * 10)}]" for p, n in zip("abcdefg", "bcdefgh")) + "]"
    override = "rewards.functions=[&a [x, x, x, x, x, x, x, x, x, x], " + inline[1:]
    for load, source in (
        (lambda: load_config(bomb_file), str(bomb_file)),
        (lambda: read_yaml(tmp_path / "child.yaml"), str(bomb_file)),
        (lambda: load_config(CONFIGS / "grpo.yaml", [override]), "override rewards.functions"),
    ):
        with pytest.raises(ConfigError) as e:
            load()
        assert str(e.value) == (
            f"{source}: more than {MAX_VALUES} values once its aliases (*name) are expanded; a config holds a few "
            "hundred"
        )
    assert load_yaml(alias_bomb(levels=4), "f")["rewards"]["functions"][0][3][0][0][0][0] == "x"  # 10^4 values pass


def test_aliases_cannot_stand_for_more_characters_deeper_nesting_or_an_endless_value():
    from regroup.config.fields import MAX_DEPTH, MAX_TEXT, load_yaml

    long_string = "s: &s " + "x" * 5000 + "\nl: [" + ", ".join(["*s"] * 300) + "]\n"  # 1.5 M characters expanded
    with pytest.raises(ConfigError, match=rf"^f: more than {MAX_TEXT} characters of values once its aliases"):
        load_yaml(long_string, "f")
    deep = "a: &a " + "[" * 20 + "]" * 20 + "\nb: &b " + "[" * 10 + "*a" + "]" * 10 + "\n"  # 31 levels: passes
    assert load_yaml(deep, "f") is not None
    with pytest.raises(ConfigError, match=rf"^f: nested more than {MAX_DEPTH} levels deep once its aliases"):
        load_yaml(deep + "c: " + "[" * 2 + "*b" + "]" * 2 + "\n", "f")  # 2 + 10 + 21 + the mapping: 34
    with pytest.raises(ConfigError, match=r"^f: an alias \(\*name\) stands inside the value it names"):
        load_yaml("rewards: {functions: &a [x, *a]}\n", "f")


def test_a_value_in_an_error_line_is_cut_short_without_its_whole_repr():
    """A value that is huge when printed whole (here 10^6 leaves, each repr counted) is quoted from the first few
    of them: `short` walks a bounded part of it, and so does the line a refused setting gets."""
    from regroup.config.fields import F, Section, check, short

    class Leaf:
        reprs = 0

        def __repr__(self) -> str:
            Leaf.reprs += 1
            return "leaf"

    value: list = [Leaf()] * 10
    for _ in range(5):
        value = [value] * 10  # 10^6 leaves, 7 lists built

    class Settings(Section):
        names: list[str] = F([], "Names.")

    text = short(value)
    assert len(text) <= 80 and text.startswith("[[[")
    with pytest.raises(ConfigError) as e:
        check(Settings, {"names": value}, "k.")
    assert str(e.value).startswith("k.names[0]: expected a string, got [[[") and len(str(e.value)) < 200
    assert Leaf.reprs == 0  # reprlib stops at 3 levels: the leaves, 6 levels down, are never printed
    assert short("x" * 1000) == repr("x" * 60) + "... (1000 characters)"
    assert short([1, 2]) == "[1, 2]" and short({"a": 1}) == "{'a': 1}"
    assert short(10**5000) == "a int"  # str() of it raises (Python's 4300-digit limit)
    key = "k" * 10**6  # an unknown key is quoted short too
    with pytest.raises(ConfigError) as e:
        check(Settings, {key: 1}, "k.")
    assert len(str(e.value)) < 300


def test_a_config_is_read_only_from_a_regular_file_and_only_up_to_its_size_limit(tmp_path):
    """/dev/zero never ends, a named pipe without a writer never opens: as --config or as an `extends:` parent,
    each is one line naming it, and nothing is read from it (before: a MemoryError, a hang)."""
    import os

    from regroup.config.fields import MAX_TEXT

    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    for parent, what in (("/dev/zero", "a character device"), (str(fifo), "a named pipe (FIFO)")):
        (tmp_path / "child.yaml").write_text(f"extends: {parent}\n")
        with pytest.raises(ConfigError) as e:
            load_config(tmp_path / "child.yaml")
        assert str(e.value) == f"{parent} is {what}, not a regular file; a config is a YAML file"
        with pytest.raises(ConfigError, match="is not a regular file"):
            load_config(parent)
    big = tmp_path / "big.yaml"
    big.write_text("a: " + "x" * (3 * MAX_TEXT))
    with pytest.raises(ConfigError, match=rf"^{big}: over {MAX_TEXT} characters, more than a config may have$"):
        read_yaml(big)
    (tmp_path / "latin1.yaml").write_bytes(b"seed: 1\nrecipe: caf\xe9")  # cut at its end
    with pytest.raises(ConfigError, match=r"latin1.yaml: not UTF-8 text \(unexpected end of data at byte 19\)"):
        read_yaml(tmp_path / "latin1.yaml")


@pytest.mark.parametrize("key", ["mask.scorer.base_url", "ta.base_url", "rollout.vllm_server_url"])
def test_a_server_address_with_a_password_query_or_fragment_is_refused_naming_the_key(key):
    """`user:pass@` is never sent (the key goes in a variable) yet would be kept and printed wherever the address
    is; a request path would be appended after a query or a fragment. Neither the password nor the query (it
    may carry a key) is printed."""
    for url, words in (
        ("https://user:hunter2@api.example.com/v1", "a user name or password in the address"),
        ("https://user:pa/ss?#@api.example.com/v1", "a user name or password in the address"),
        ("https://api.example.com/v1?api-version=hunter2", "has a query ('?...', not shown)"),
        ("https://api.example.com/v1#hunter2", "has a fragment"),
    ):
        with pytest.raises(ConfigError) as e:
            load_config(CONFIGS / "grpo.yaml", [f"{key}={url}"])
        line = str(e.value)
        assert line.startswith(f"{key}: ") and words in line and "(https://api.example.com/v1)" in line, line
        assert "hunter2" not in line and "pa/ss" not in line and "\n" not in line
    assert load_config(CONFIGS / "grpo.yaml", [f"{key}=http://127.0.0.1:9/v1"])  # a plain address passes


# -- one mechanism: a piece's knobs and a config section take the same values the same way --------------------


def test_knobs_and_sections_are_checked_alike():
    """The same declarations as a piece's `Knobs` and as a run-config `Section` accept and refuse the same values
    with the same words (before, a knob refused `on` for a bool, had no lists and no cap on integer digits)."""
    from regroup.config.fields import F, Knobs, Section, check
    from regroup.config.registry import parse_args

    class PieceKnobs(Knobs):
        flag: bool = F(False, "A switch.")
        count: int = F(1, "A count.", ge=1, le=10)
        names: list[str] = F([], "Names.")
        rate: float = F(0.5, "A rate.", gt=0.0, le=1.0)

    class Settings(Section):
        flag: bool = F(False, "A switch.")
        count: int = F(1, "A count.", ge=1, le=10)
        names: list[str] = F([], "Names.")
        rate: float = F(0.5, "A rate.", gt=0.0, le=1.0)

    given = {"flag": "on", "count": 2.0, "names": "a, b", "rate": "3e-4"}
    knobs, section = parse_args(PieceKnobs, given, "k", "piece"), check(Settings, given, "k.")
    assert knobs.model_dump() == section.model_dump() == {"flag": True, "count": 2, "names": ["a", "b"], "rate": 3e-4}
    for bad, words in (
        ({"flag": 1}, "k.flag: expected true/false, got 1"),
        ({"count": 10**19}, "k.count: a 20-digit integer is out of range"),
        ({"count": 11}, "k.count must be a finite number >= 1 and <= 10, got 11"),
        ({"rate": 10**400}, "k.rate: a 401-digit number is out of range"),
        ({"rate": 1e-320}, "k.rate: 1e-320 is 0 in float32"),
        ({"names": [1]}, "k.names[0]: expected a string, got 1"),
    ):
        for build in (lambda b: parse_args(PieceKnobs, b, "k", "piece"), lambda b: check(Settings, b, "k.")):
            with pytest.raises(ConfigError) as err:
                build(bad)
            assert str(err.value).startswith(words), err.value
    with pytest.raises(ConfigError, match=r"^k: unknown knob 'flg' of piece \(did you mean 'flag'\?\)"):
        parse_args(PieceKnobs, {"flg": True}, "k", "piece")
    with pytest.raises(ConfigError, match=r"^unknown config key k.flg \(did you mean 'flag'\?\)"):
        check(Settings, {"flg": True}, "k.")

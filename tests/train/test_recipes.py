"""The recipe is the one reader of feature flags: `features(cfg)` answers what a config switched on, and no
other module of src/regroup reads a `*.enabled` flag (an AST scan, so strings and comments that name a
flag, like an error message saying `dynamic_sampling.enabled`, do not count)."""

from __future__ import annotations

import ast
from pathlib import Path

from helpers import CONFIGS

from regroup.algo.loss_config import resolve_loss
from regroup.tasks import get_task
from regroup.train.recipes import Features, build_recipe, features
from regroup.train.run_config import load_config

SRC = Path(__file__).resolve().parents[2] / "src" / "regroup"
ALLOWED = {
    "train/recipes.py",  # the reader
    "config/schema.py",  # the flags' definitions and the schema's own cross-field rules (a leaf: it cannot ask)
}


def enabled_reads(source: str) -> list[int]:
    """Lines that read `<something>.enabled` (or `getattr(x, "enabled")`) where `<something>` is not `self`:
    an object's own switch (`MetricsLogger.enabled`) is not a feature flag."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr == "enabled" and isinstance(node.ctx, ast.Load):
            if not (isinstance(node.value, ast.Name) and node.value.id == "self"):
                lines.append(node.lineno)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value == "enabled"
        ):
            lines.append(node.lineno)
    return sorted(lines)


def test_the_scan_finds_reads_and_only_reads():
    source = (
        "a = cfg.ta.enabled\n"
        "if cfg.model.lora.enabled and x:\n    pass\n"
        "b = getattr(getattr(cfg.model, 'lora', None), 'enabled', False)\n"
        "self.enabled = True\n"
        "c = self.enabled\n"
        "d = 'set dynamic_sampling.enabled=true'\n"
        "f(enabled=True)\n"
    )
    assert enabled_reads(source) == [1, 2, 4]


def test_no_module_but_the_recipe_reads_a_feature_flag():
    found = []
    for path in sorted(SRC.rglob("*.py")):
        name = path.relative_to(SRC).as_posix()
        if name in ALLOWED:
            continue
        found += [f"{name}:{line}" for line in enabled_reads(path.read_text(encoding="utf-8"))]
    assert found == [], "read the recipe's answer (regroup.train.recipes.features) instead: " + ", ".join(found)


def test_the_recipe_itself_reads_the_flags():
    """The scan would pass vacuously if the flags had been renamed: the reader must hold the reads."""
    assert len(enabled_reads((SRC / "train" / "recipes.py").read_text(encoding="utf-8"))) >= 5


def test_features_of_each_recipe():
    assert features(load_config(CONFIGS / "grpo.yaml")) == Features()
    ta = features(load_config(CONFIGS / "ta_grpo.yaml"))
    assert ta.variants and ta.n_variants > 0 and not ta.anchors and ta.anchor_count == 0
    dagrpo = features(load_config(CONFIGS / "dagrpo.yaml"))
    assert dagrpo.anchors and dagrpo.mask and dagrpo.anchor_count >= 1 and dagrpo.n_variants == 0
    on = features(
        load_config(
            CONFIGS / "grpo.yaml",
            ["dynamic_sampling.enabled=true", "dynamic_sampling.max_rounds=3", "grpo.beta=0.05"],
        )
    )
    assert on.dynamic_sampling and on.draw_rounds == 4 and on.needs_reference
    # a switched-off section's numbers say nothing: ta.n_variants=3 with ta.enabled=false samples no variant
    off = features(load_config(CONFIGS / "grpo.yaml", ["ta.n_variants=3", "anchors.count=2"]))
    assert off.n_variants == 0 and off.anchor_count == 0 and off.added_anchors == 0 and off.draw_rounds == 1
    two = ["anchors.mode=add", "anchors.count=2", "anchors.source=both"]  # a reference and a self anchor
    added = features(load_config(CONFIGS / "dagrpo.yaml", two))
    assert added.added_anchors == 2 == added.anchor_count
    replaced = features(load_config(CONFIGS / "dagrpo.yaml", ["anchors.mode=replace", "anchors.count=1"]))
    assert replaced.added_anchors == 0 and replaced.anchor_count == 1


def test_the_recipe_carries_its_features():
    cfg = load_config(CONFIGS / "dagrpo_ta.yaml")
    recipe = build_recipe(cfg, get_task("arithmetic"), lambda t: [1] * len(t), "/tmp/unused", loss=resolve_loss(cfg))
    assert recipe.features == features(cfg)
    assert recipe.uses_anchors and recipe.n_variants == cfg.ta.n_variants
    assert recipe.ratio_on_original == (cfg.ta.ratio_anchor == "original")

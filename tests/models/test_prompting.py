"""regroup.models.prompting: one prompt format for training and evaluation, built from the data config."""

from __future__ import annotations

import pytest

from regroup.config.schema import DataConfig
from regroup.models.prompting import Prompter, build_prompter, encode_prompt, fill_template
from regroup.models.tiny import build_tokenizer

# A chat template with a system role, written so the expected text can be spelled out by hand.
ROLE_TEMPLATE = (
    "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}[assistant]{% endif %}"
)
BOXED = "{question}\nPut the final answer in \\boxed{}."


@pytest.fixture()
def tok():
    return build_tokenizer()


@pytest.fixture()
def role_tok():
    t = build_tokenizer()
    t.chat_template = ROLE_TEMPLATE
    return t


def test_fill_template_keeps_latex_braces():
    assert fill_template(BOXED, "What is 2 + 3?") == "What is 2 + 3?\nPut the final answer in \\boxed{}."
    assert fill_template(None, "q") == "q"


def test_builtin_model_keeps_its_own_format_exactly(tok):
    p = build_prompter(DataConfig(), tok, builtin_model=True)
    for q in ["Mia has 3 cats. She gets 4 more. How many cats?", "x"]:
        assert p.encode(q) == encode_prompt(tok, q)


def test_builtin_model_refuses_templates(tok):
    with pytest.raises(ValueError, match="built-in tiny model"):
        build_prompter(DataConfig(prompt_template=BOXED), tok, builtin_model=True)
    with pytest.raises(ValueError, match="built-in tiny model"):
        build_prompter(DataConfig(system_prompt="Be brief."), tok, builtin_model=True)


def test_chat_template_with_system_prompt_and_template(role_tok):
    p = build_prompter(DataConfig(system_prompt="Be brief.", prompt_template=BOXED), role_tok, builtin_model=False)
    assert p.use_chat
    expected = "[system]Be brief.[user]What is 2 + 3?\nPut the final answer in \\boxed{}.[assistant]"
    assert p.render("What is 2 + 3?") == expected
    assert p.encode("What is 2 + 3?") == role_tok(expected, add_special_tokens=False)["input_ids"]


def test_no_system_turn_without_system_prompt(role_tok):
    p = build_prompter(DataConfig(), role_tok, builtin_model=False)
    assert p.render("q") == "[user]q[assistant]"


def test_chat_off_is_plain_text(role_tok):
    p = build_prompter(
        DataConfig(chat_template="off", system_prompt="S", prompt_template="Q: {question}"),
        role_tok,
        builtin_model=False,
    )
    assert not p.use_chat
    assert p.render("2+2?") == "S\n\nQ: 2+2?"


def test_auto_without_template_is_plain_and_on_without_template_fails(tok):
    tok.chat_template = None
    assert not build_prompter(DataConfig(), tok, builtin_model=False).use_chat
    with pytest.raises(ValueError, match="no chat template"):
        build_prompter(DataConfig(chat_template="on"), tok, builtin_model=False)


def test_template_needs_question_slot(role_tok):
    with pytest.raises(ValueError, match="{question}"):
        build_prompter(DataConfig(prompt_template="Solve it."), role_tok, builtin_model=False)


def test_too_long_counts_prompt_tokens(role_tok):
    p = Prompter(role_tok, use_chat=True, max_tokens=None)
    n = len(p.encode("abc"))
    assert n == len("[user]abc[assistant]")  # one id per character in the char tokenizer
    assert not Prompter(role_tok, use_chat=True, max_tokens=n).too_long("abc")
    assert Prompter(role_tok, use_chat=True, max_tokens=n - 1).too_long("abc")
    assert not p.too_long("abc" * 1000)  # no limit set


def test_rephrasings_get_the_same_wrapping(role_tok):
    # The template wraps q0 and a rephrasing alike; only the question text differs.
    p = build_prompter(DataConfig(prompt_template=BOXED), role_tok, builtin_model=False)
    a, b = p.render("Ann has 3 pens."), p.render("Ann owns 3 pens.")
    assert a.replace("Ann has 3 pens.", "Q") == b.replace("Ann owns 3 pens.", "Q")

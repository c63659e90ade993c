"""Turning a question (and a response) into token ids: the prompt format of a run, built once.

A real model is prompted as `data.system_prompt` + `data.prompt_template` (with `{question}`) wrapped
in the tokenizer's chat template (`data.chat_template`: auto | on | off). The same `Prompter` encodes
q0 and every rephrasing — the rephraser only ever sees and rewrites the raw question — and
`regroup eval` rebuilds it from a run's config.yaml, so training and evaluation prompt alike. The
built-in tiny model keeps its own format (`encode_prompt`): it was warmed up on exactly that.
"""

from __future__ import annotations

from regroup.config.schema import DataConfig

QUESTION_SLOT = "{question}"


def encode_prompt(tokenizer, question: str) -> list[int]:
    """Token ids of a one-turn chat prompt ending with the assistant's generation prompt."""
    messages = [{"role": "user", "content": question}]
    if getattr(tokenizer, "chat_template", None):
        out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        # transformers 5 returns a BatchEncoding for tokenize=True; 4.x returns a list.
        return list(out["input_ids"] if hasattr(out, "keys") else out)
    return tokenizer(question, add_special_tokens=True)["input_ids"]


def encode_response(tokenizer, response: str, add_eos: bool = True) -> list[int]:
    """Token ids of a response text (used for forced anchor tokens and SFT targets), ending with EOS."""
    ids = tokenizer(response, add_special_tokens=False)["input_ids"]
    if add_eos and tokenizer.eos_token_id is not None:
        ids = ids + [tokenizer.eos_token_id]
    return ids


def fill_template(template: str | None, question: str) -> str:
    """`template` with `{question}` replaced (plain replace: LaTeX braces such as `\\boxed{}` stay as they are)."""
    return question if template is None else template.replace(QUESTION_SLOT, question)


class Prompter:
    """The prompt format of a run: `render(question)` is the text the model reads, `encode` its ids."""

    def __init__(
        self,
        tokenizer,
        *,
        use_chat: bool,
        system_prompt: str | None = None,
        template: str | None = None,
        max_tokens: int | None = None,
        builtin_model: bool = False,
    ) -> None:
        if template is not None and QUESTION_SLOT not in template:
            raise ValueError(f"data.prompt_template must contain {QUESTION_SLOT}, got {template!r}")
        if builtin_model and (system_prompt is not None or template is not None):
            raise ValueError(
                "the built-in tiny model has its own prompt format: data.system_prompt and "
                "data.prompt_template apply to real models (set model.path)"
            )
        if use_chat and not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                "data.chat_template=on but the tokenizer has no chat template (use data.chat_template=off or auto)"
            )
        self.tokenizer = tokenizer
        self.use_chat, self.system_prompt, self.template = use_chat, system_prompt, template
        self.max_tokens, self.builtin_model = max_tokens, builtin_model

    def messages(self, question: str) -> list[dict]:
        """The chat turns of `question`: an optional system turn, then the user turn."""
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt is not None else []
        return system + [{"role": "user", "content": fill_template(self.template, question)}]

    def render(self, question: str) -> str:
        """The prompt as text (chat template applied, ending with the assistant's generation prompt)."""
        if self.builtin_model:
            return self.tokenizer.decode(encode_prompt(self.tokenizer, question))
        if self.use_chat:
            return self.tokenizer.apply_chat_template(
                self.messages(question), add_generation_prompt=True, tokenize=False
            )
        text = fill_template(self.template, question)
        return text if self.system_prompt is None else f"{self.system_prompt}\n\n{text}"

    def encode(self, question: str) -> list[int]:
        """Token ids of the prompt for `question`."""
        if self.builtin_model:
            return encode_prompt(self.tokenizer, question)
        if self.use_chat:
            out = self.tokenizer.apply_chat_template(self.messages(question), add_generation_prompt=True, tokenize=True)
            return list(out["input_ids"] if hasattr(out, "keys") else out)
        return list(self.tokenizer(self.render(question), add_special_tokens=True)["input_ids"])

    def too_long(self, question: str) -> bool:
        """Whether the prompt of `question` exceeds `max_tokens` (never, when no limit is set)."""
        return self.max_tokens is not None and len(self.encode(question)) > self.max_tokens

    def describe(self) -> dict:
        """The settings, for logs and eval summaries."""
        return {
            "chat_template": self.use_chat,
            "system_prompt": self.system_prompt,
            "prompt_template": self.template,
            "builtin_model": self.builtin_model,
        }


def build_prompter(data_cfg: DataConfig, tokenizer, builtin_model: bool) -> Prompter:
    """The Prompter of a run from its `data` config section (chat_template auto | on | off)."""
    mode = data_cfg.chat_template
    if mode not in ("auto", "on", "off"):
        raise ValueError(f"data.chat_template must be auto, on or off, got {mode!r}")
    use_chat = mode == "on" or (mode == "auto" and bool(getattr(tokenizer, "chat_template", None)))
    return Prompter(
        tokenizer,
        use_chat=use_chat,
        system_prompt=data_cfg.system_prompt,
        template=data_cfg.prompt_template,
        max_tokens=data_cfg.max_prompt_tokens,
        builtin_model=builtin_model,
    )

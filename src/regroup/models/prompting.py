"""Turning a question (and a response) into token ids with the tokenizer's own chat template."""

from __future__ import annotations


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

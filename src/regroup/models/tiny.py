"""The built-in tiny model: a character-level tokenizer and a Qwen3-style causal LM built from a config.

Nothing is downloaded. The tokenizer is a `tokenizers` WordLevel model over single characters, wrapped
as a transformers `PreTrainedTokenizerFast` with pad / eos and a chat template, so every piece of code
that loads an HF model directory (`AutoTokenizer`, `AutoModelForCausalLM`) loads a saved tiny model.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

PAD, EOS, USER, ASSISTANT, UNK = "<|pad|>", "<|eos|>", "<|user|>", "<|assistant|>", "<|unk|>"
SPECIAL_TOKENS = [PAD, EOS, USER, ASSISTANT, UNK]

# Printable ASCII (no tabs / form feeds) plus newline: enough for word problems, LaTeX and code.
CHARACTERS = [c for c in string.printable if c not in "\t\r\x0b\x0c"]

# A short chat template: the special tokens are single ids, so a prompt costs its characters plus two.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}" + USER + "{{ message['content'] }}"
    "{% elif message['role'] == 'assistant' %}"
    + ASSISTANT
    + "{{ message['content'] }}"
    + EOS
    + "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}" + ASSISTANT + "{% endif %}"
)


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A character-level fast tokenizer with pad/eos/unk and a chat template (vocab ~105)."""
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + CHARACTERS)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    # Every character is its own pre-token; Fuse glues them back without spaces on decode.
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD,
        eos_token=EOS,
        unk_token=UNK,
        additional_special_tokens=[USER, ASSISTANT],
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


@dataclass
class TinyModelConfig:
    """Shape of the built-in tiny Qwen3-style model."""

    hidden_size: int = 128
    """Width of the residual stream."""
    num_layers: int = 4
    """Number of transformer blocks."""
    num_heads: int = 4
    """Attention heads (key/value heads are the same number)."""
    intermediate_size: int = 384
    """Width of the SwiGLU feed-forward layer."""
    max_position_embeddings: int = 512
    """Longest prompt + response the model is built for."""


def build_model(
    tokenizer: PreTrainedTokenizerFast, cfg: TinyModelConfig | None = None, seed: int = 0
) -> Qwen3ForCausalLM:
    """A randomly initialised Qwen3ForCausalLM of the tiny shape (~0.85M parameters at the default)."""
    import torch  # heavy: only when the model is built

    cfg = cfg or TinyModelConfig()
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_heads,
        head_dim=cfg.hidden_size // cfg.num_heads,
        intermediate_size=cfg.intermediate_size,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        # transformers >= 5 still takes rope_theta (folded into rope_parameters) but no longer declares
        # it; < 5 (no rope_parameters) declares only rope_theta.
        rope_theta=10000.0,  # type: ignore[call-arg]
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model

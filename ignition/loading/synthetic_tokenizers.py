"""Tokenizers with a ChatML template for checkpoints without a real one: the tests'
tiny checkpoints (word level) and the random-weight geometry directories (character
level)."""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# ids 0, 1 and 2 of both tokenizers; <|im_end|> is the EOS.
SPECIALS = ["<unk>", "<|im_end|>", "<|im_start|>"]
# The character-level tokenizer's characters: printable ASCII, newline and tab.
CHARACTERS = [chr(c) for c in range(32, 127)] + ["\n", "\t"]


def _with_chatml(tok: Tokenizer) -> PreTrainedTokenizerFast:
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", eos_token="<|im_end|>", bos_token="<|im_start|>"
    )
    fast.chat_template = CHATML_TEMPLATE
    return fast


def word_level_tokenizer(size: int) -> PreTrainedTokenizerFast:
    """``size`` ids: the specials, then the words ``w0``, ``w1``, ... split on
    whitespace (any other word is ``<unk>``)."""
    words = SPECIALS + [f"w{i}" for i in range(size - len(SPECIALS))]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return _with_chatml(tok)


def char_level_tokenizer(size: int) -> PreTrainedTokenizerFast:
    """``size`` ids: the specials, one per character of ``CHARACTERS``, then `` w0``,
    `` w1``, ... Each character is its own token (any other is ``<unk>``), so distinct
    ASCII texts encode to distinct ids, as with a real tokenizer; and every id decodes
    to text, so a model sampling any id of its vocabulary streams text every step."""
    head = SPECIALS + CHARACTERS
    if size < len(head):
        raise ValueError(f"a character-level vocabulary needs at least {len(head)} ids")
    tokens = head + [f" w{i}" for i in range(size - len(head))]
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, [], unk_token="<unk>"))
    tok.decoder = decoders.Fuse()
    return _with_chatml(tok)

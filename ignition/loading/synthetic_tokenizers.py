"""A word-level tokenizer with a ChatML template, for checkpoints without a real one
(random-weight geometry directories and the tests' tiny checkpoints)."""

from __future__ import annotations

from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def word_level_tokenizer(size: int) -> PreTrainedTokenizerFast:
    """``size`` ids: ``<unk>`` 0, ``<|im_end|>`` 1 (EOS), ``<|im_start|>`` 2 (BOS), then
    the words ``w0``, ``w1``, ... split on whitespace."""
    words = ["<unk>", "<|im_end|>", "<|im_start|>"]
    words += [f"w{i}" for i in range(size - len(words))]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", eos_token="<|im_end|>", bos_token="<|im_start|>"
    )
    fast.chat_template = CHATML_TEMPLATE
    return fast

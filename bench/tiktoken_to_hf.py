"""A Hugging Face ``tokenizer.json`` converted from a tiktoken BPE rank file, for measuring
the grammar engine's mask cost at Qwen's 152K vocabulary (``helios/examples/grammar_bench.rs``).

The rank file (lines ``base64token rank``; Qwen's ``qwen.tiktoken``, 151,643 tokens, ships in
the ``dashscope`` wheel as ``dashscope/resources/qwen.tiktoken``) is not part of this
repository. The output is a byte-level BPE: the vocabulary is the ranked tokens through GPT-2's
byte-to-unicode table, the merges are rebuilt from the ranks (each token of two or more bytes
is BPE'd over its bytes with only lower ranks; the two parts left make its merge), then
Qwen's split pattern, and ``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>`` after the ranks.

    python bench/tiktoken_to_hf.py RANKS_FILE --out tokenizer.json
"""

from __future__ import annotations

import argparse
import base64
import sys
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, pre_tokenizers
from tokenizers.models import BPE

PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's table: printable bytes stand for themselves, the rest map from U+0100 up."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {b: chr(b) for b in printable}
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + len(table) - len(printable))
    return table


def load_ranks(path: Path) -> dict[bytes, int]:
    ranks: dict[bytes, int] = {}
    for line in path.read_text(encoding="ascii").splitlines():
        if line.strip():
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise ValueError(f"{path}: ranks are not 0..{len(ranks) - 1}, each once")
    return ranks


def bpe_parts(ranks: dict[bytes, int], token: bytes, max_rank: int) -> list[bytes]:
    """``token``'s bytes merged by BPE, using only ranks below ``max_rank``."""
    parts = [bytes([b]) for b in token]
    while len(parts) > 1:
        best: tuple[int, int] | None = None
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1])
            if rank is not None and rank < max_rank and (best is None or rank < best[0]):
                best = (rank, i)
        if best is None:
            break
        i = best[1]
        parts[i : i + 2] = [parts[i] + parts[i + 1]]
    return parts


def convert(ranks: dict[bytes, int]) -> Tokenizer:
    table = byte_to_unicode()

    def spell(token: bytes) -> str:
        return "".join(table[b] for b in token)

    vocab: dict[str, int] = {}
    merges: list[tuple[str, str]] = []
    unmerged = 0
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        vocab[spell(token)] = rank
        if len(token) < 2:
            continue
        parts = bpe_parts(ranks, token, rank)
        if len(parts) == 2:
            merges.append((spell(parts[0]), spell(parts[1])))
        else:
            unmerged += 1
    if unmerged:
        print(f"{unmerged} tokens have no merge (reached only whole)", file=sys.stderr)
    # As tiktoken does, a piece that is itself a token encodes as that token.
    tokenizer = Tokenizer(BPE(vocab, merges, fuse_unk=False, ignore_merges=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS]
    )
    return tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("ranks", type=Path, help="tiktoken rank file (base64token rank)")
    parser.add_argument("--out", type=Path, required=True, help="tokenizer.json to write")
    args = parser.parse_args()
    ranks = load_ranks(args.ranks)
    tokenizer = convert(ranks)
    for offset, name in enumerate(SPECIAL_TOKENS):
        if tokenizer.token_to_id(name) != len(ranks) + offset:
            raise SystemExit(f"{name} is not id {len(ranks) + offset}")
    tokenizer.save(str(args.out))
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    print(f"{args.out}: {size} tokens, {args.out.stat().st_size} bytes")


if __name__ == "__main__":
    main()

"""A tokenizer small enough for tiny models, for grammar tests: single
characters of JSON and a few merged pieces (so a text has several
tokenizations), byte-level, EOS at id 0."""

from __future__ import annotations

from typing import Any

PIECES = ["<eos>", *'{}[]":,-.0123456789abcxyz', '{"', '":', "ab", "xy", "Ġ"]
MERGES = [("{", '"'), ('"', ":"), ("a", "b"), ("x", "y")]


def tiny_tokenizer() -> Any:
    """A transformers fast tokenizer over PIECES (ids in that order), BPE
    with MERGES (so "axy" is a, xy and '{"a":' is {", a, ":)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {p: i for i, p in enumerate(PIECES)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=MERGES, unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


# a schema whose every value is bounded (an integer, an array of enums, an enum)
SCHEMA = {
    "type": "object",
    "properties": {
        "a": {"type": "integer", "minimum": 0, "maximum": 99},
        "b": {"type": "array", "items": {"enum": ["x", "y", "ab"]}, "maxItems": 3},
        "c": {"enum": [1, 2.5, "z"]},
    },
    "required": ["a", "b", "c"],
    "additionalProperties": False,
}

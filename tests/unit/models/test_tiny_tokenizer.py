from __future__ import annotations

import random

import pytest
from transformers import PreTrainedTokenizerFast

from tidal.models import render_prompt

SAMPLES = [
    "",
    "hello world",
    "def f(x):\n    return x ** 2\n",
    "emoji: 🎉🚀👩‍👩‍👧‍👦 flags 🇫🇷 skin 👍🏽",
    "中文，日本語のテキスト、한국어 텍스트",
    "Ünïcödé: e\u0301 (decomposed) vs é, ﬁ ligature, Ω, ∑∫√",
    "controls \x00\x01\x7f tabs\t\tcr\r\nnul",
    "   leading and trailing spaces   ",
    "\u200b zero width \ufeff bom \U0010ffff max code point",
    "math: 12 + 35 = 47, 3.14159, -0.5e-10",
]


@pytest.mark.parametrize("text", SAMPLES)
def test_round_trips_exactly(tiny_tokenizer: PreTrainedTokenizerFast, text: str) -> None:
    ids = tiny_tokenizer.encode(text, add_special_tokens=False)
    assert tiny_tokenizer.decode(ids) == text


def test_round_trips_random_code_points(tiny_tokenizer: PreTrainedTokenizerFast) -> None:
    rng = random.Random(0)
    for _ in range(50):
        # Every code point but surrogates, which are not valid in UTF-8.
        chars = [chr(rng.choice([rng.randrange(0, 0xD800), rng.randrange(0xE000, 0x110000)])) for _ in range(40)]
        text = "".join(chars)
        assert tiny_tokenizer.decode(tiny_tokenizer.encode(text, add_special_tokens=False)) == text


def test_vocabulary_and_special_tokens(tiny_tokenizer: PreTrainedTokenizerFast) -> None:
    assert len(tiny_tokenizer) <= 512
    assert tiny_tokenizer.eos_token == "<|im_end|>"
    assert tiny_tokenizer.pad_token == "<|endoftext|>"
    assert tiny_tokenizer.bos_token is None
    for special in ("<|endoftext|>", "<|im_start|>", "<|im_end|>"):
        assert tiny_tokenizer.encode(special, add_special_tokens=False) == [tiny_tokenizer.convert_tokens_to_ids(special)]
    # Nothing is prepended or appended to plain text.
    assert tiny_tokenizer.encode("a", add_special_tokens=True) == tiny_tokenizer.encode("a", add_special_tokens=False)
    # One token per byte: no merges (see the module docstring for why).
    text = "Write a function that returns the sum of the even numbers in a list. ü"
    assert len(tiny_tokenizer.encode(text)) == len(text.encode("utf-8"))


def test_invalid_utf8_decodes_with_replacement(tiny_tokenizer: PreTrainedTokenizerFast) -> None:
    first_byte_of_emoji = tiny_tokenizer.encode("🎉", add_special_tokens=False)[0]
    assert tiny_tokenizer.decode([first_byte_of_emoji]) == "\ufffd"
    lone = tiny_tokenizer.encode("🎉", add_special_tokens=False)[1:]
    assert "\ufffd" in tiny_tokenizer.decode(lone + tiny_tokenizer.encode("ok", add_special_tokens=False))


def test_chat_template_renders_chatml(tiny_tokenizer: PreTrainedTokenizerFast) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
    ]
    text = tiny_tokenizer.apply_chat_template(messages, tokenize=False)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
        "<|im_start|>assistant\n4<|im_end|>\n"
    )
    prompt = tiny_tokenizer.apply_chat_template(messages[1:2], tokenize=False, add_generation_prompt=True)
    # No default system prompt.
    assert prompt == "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"


def test_render_prompt_tokenizes_the_template(tiny_tokenizer: PreTrainedTokenizerFast) -> None:
    ids = render_prompt(tiny_tokenizer, [{"role": "user", "content": "héllo 🎉"}])
    expected = "<|im_start|>user\nhéllo 🎉<|im_end|>\n<|im_start|>assistant\n"
    assert tiny_tokenizer.decode(ids) == expected
    assert ids[0] == tiny_tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert ids.count(tiny_tokenizer.eos_token_id) == 1

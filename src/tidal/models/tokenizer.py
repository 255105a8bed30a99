"""The built-in tiny tokenizer: byte-level, 259 ids, built in code (no downloads).

Ids 0-255 are the bytes, so any UTF-8 text round-trips exactly; the last three ids are the
special tokens. It is a BPE model without merges, so it saves and reloads as an ordinary
Hugging Face fast tokenizer.

Saved with a Qwen2 model, the tokenizer reloads in `transformers` 5 as `Qwen2Tokenizer`, which adds
an NFC normaliser: the reload encodes NFC text (nearly all text) exactly as this one does, but
folds decomposed accents into composed ones. This tokenizer itself has no normaliser, so any
text round-trips byte for byte.
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (PAD_TOKEN, IM_START, IM_END)
VOCAB_SIZE = 256 + len(SPECIAL_TOKENS)

# ChatML without a default system prompt: prompts must stay short for a tiny byte-level model.
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

def _byte_alphabet() -> dict[str, int]:
    """Byte value -> the printable character ByteLevel uses for it, as a vocab (char -> id = byte).

    Printable Latin-1 bytes stand for themselves; the others (controls, space, ...) are shifted to
    code points from 256 up, in byte order. This is the convention `pre_tokenizers.ByteLevel` uses.
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1), *range(ord("\u00ae"), 256)]
    vocab: dict[str, int] = {}
    shifted = 0
    for byte in range(256):
        if byte in printable:
            vocab[chr(byte)] = byte
        else:
            vocab[chr(256 + shifted)] = byte
            shifted += 1
    return vocab


def _byte_tokenizer() -> Tokenizer:
    # No merges: one token per byte. Subword merges split the same word differently in the prompt
    # ("Reply with sun" -> " s", "un") and in the answer ("SUN" -> "S", "U", "N"), which a small
    # model trained from scratch struggles to relate; with bytes, copying and case changes are
    # the same per-character pattern everywhere.
    tokenizer = Tokenizer(models.BPE(vocab=_byte_alphabet(), merges=[]))
    # Qwen2's pre-tokenizer: `transformers` 5 rebuilds it for every checkpoint whose model_type is
    # qwen2, whatever tokenizer.json says, so using it here keeps tidal and a plain reload in step.
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    return tokenizer


def build_tiny_tokenizer() -> PreTrainedTokenizerFast:
    """The built-in tokenizer: byte-level, 259 ids, ChatML chat template, eos = `<|im_end|>`.

    `<|endoftext|>` is the pad token; there is no bos token (nothing is prepended to a prompt).
    """
    backend = _byte_tokenizer()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        additional_special_tokens=[IM_START],
        padding_side="left",
        clean_up_tokenization_spaces=False,
        model_max_length=1 << 20,
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer

"""The built-in tiny tokenizer: byte-level BPE with 512 ids, built in code (no downloads).

Every one of the 256 bytes has an id, so any UTF-8 text round-trips exactly; 253 merges learned from the
small built-in corpus below shorten code, math and English prompts; the last three ids are the
special tokens. The corpus and the BPE trainer are deterministic, so two processes that build the
tokenizer (a trainer and a rollout worker, say) get the same vocabulary.

Saved with a Qwen2 model, the tokenizer reloads in `transformers` 5 as `Qwen2Tokenizer`, which adds
an NFC normaliser: the reload encodes NFC text (nearly all text) exactly as this one does, but
folds decomposed accents into composed ones. This tokenizer itself has no normaliser, so any
text round-trips byte for byte.
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (PAD_TOKEN, IM_START, IM_END)
VOCAB_SIZE = 512

# ChatML without a default system prompt: prompts must stay short for a tiny byte-level model.
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# What the tiny model reads and writes: chat turns, short Python functions, arithmetic and plain
# English instructions. Only the merges depend on it; any text still encodes, byte by byte.
_CORPUS = """
<|im_start|>system
You are a helpful assistant.<|im_end|>
<|im_start|>user
Write a function that returns the sum of the even numbers in a list.<|im_end|>
<|im_start|>assistant
```python
def sum_evens(xs):
    return sum(x for x in xs if x % 2 == 0)
```<|im_end|>
<|im_start|>user
What is 12 + 35? Answer with a number.<|im_end|>
<|im_start|>assistant
The answer is 47.<|im_end|>
<|im_start|>user
Reverse the string and return it.<|im_end|>
<|im_start|>assistant
def reverse(s):
    return s[::-1]
<|im_start|>tool
{"name": "bash", "output": "ok"}<|im_end|>
def count_words(text):
    counts = {}
    for word in text.split():
        counts[word] = counts.get(word, 0) + 1
    return counts

def is_prime(n):
    if n < 2:
        return False
    for i in range(2, int(n ** 0.5) + 1):
        if n % i == 0:
            return False
    return True

def fib(n):
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a

class Stack:
    def __init__(self):
        self.items = []

    def push(self, item):
        self.items.append(item)

    def pop(self):
        return self.items.pop()

import os
import sys
from typing import List, Dict

def read_file(path: str) -> str:
    with open(path) as f:
        return f.read()

def test_sum_evens():
    assert sum_evens([1, 2, 3, 4]) == 6
    assert sum_evens([]) == 0

x = 3 * 4 + 5
y = (x - 2) / 7
z = x ** 2 - y
print(x, y, z)
for i in range(10):
    if i % 3 == 0:
        print("fizz")
    elif i % 5 == 0:
        print("buzz")
    else:
        print(i)
while True:
    break
result = [n * n for n in numbers if n > 0]
value = None
return result
The answer is the number of items in the list. Solve the problem step by step, then give the
final answer on the last line. The function should take a list of integers and return an integer.
Compute the value of the expression. If the input is empty, return zero. Think about the edge
cases first: an empty string, a single element, negative numbers and very large numbers.
Question: what is the capital of France? Answer: Paris.
Question: how many days are in a week? Answer: seven.
Explain what this code does and then fix the bug in the loop.
Find the largest value in the array and print its index.
Let x be the number of apples. Then 2x + 3 = 11, so x = 4.
1 + 1 = 2, 2 + 2 = 4, 10 - 3 = 7, 6 * 7 = 42, 81 / 9 = 9, 100 - 1 = 99.
The tests passed. The test failed with an error: AssertionError.
Traceback (most recent call last):
  File "solution.py", line 3, in <module>
NameError: name 'result' is not defined
def max_of(values):
    best = values[0]
    for value in values[1:]:
        if value > best:
            best = value
    return best

def unique_sorted(items):
    return sorted(set(items))

def parse_int(text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        return -1

def merge(left, right):
    output = []
    while left and right:
        output.append(left.pop(0) if left[0] <= right[0] else right.pop(0))
    return output + left + right
Write a Python function named solve that reads the input and returns the answer as a string.
Use only the standard library. Do not print anything else. Keep the solution short.
The user wants a program that checks whether a number is a palindrome. A palindrome reads the
same forwards and backwards. For example, 121 is a palindrome and 123 is not.
Given two integers a and b, return their greatest common divisor.
Count the vowels in a word. Sort the list in increasing order. Remove duplicates from the list.
Convert the temperature from Celsius to Fahrenheit: multiply by 9, divide by 5 and add 32.
What is 7 times 8? 56. What is 144 divided by 12? 12. What is 15 minus 9? 6.
Calculate the area of a rectangle with width 3 and height 5. The area is 15.
If a train travels 60 miles in 1 hour, how far does it travel in 3 hours? 180 miles.
I will run the tests now. All tests passed. Two tests failed. The output is correct.
ls -la
cat solution.py
python -m pytest -q
echo "done"
{"role": "assistant", "content": "ok", "tool_calls": [{"name": "write_file", "arguments": {"path": "a.py"}}]}
"""


def _train_byte_bpe() -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    # Qwen2's pre-tokenizer: `transformers` 5 rebuilds it for every checkpoint whose model_type is
    # qwen2, whatever tokenizer.json says, so using it here keeps tidal and a plain reload in step.
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(SPECIAL_TOKENS),
        min_frequency=2,
        show_progress=False,
        # All 256 bytes are in the base alphabet, so nothing is ever unknown.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    # The corpus's ChatML markers are removed so they do not become ordinary merges.
    text = _CORPUS
    for token in SPECIAL_TOKENS:
        text = text.replace(token, "\n")
    tokenizer.train_from_iterator(text.splitlines(keepends=True), trainer=trainer)
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    return tokenizer


def build_tiny_tokenizer() -> PreTrainedTokenizerFast:
    """The built-in tokenizer: byte-level BPE, 512 ids, ChatML chat template, eos = `<|im_end|>`.

    `<|endoftext|>` is the pad token; there is no bos token (nothing is prepended to a prompt).
    """
    backend = _train_byte_bpe()
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

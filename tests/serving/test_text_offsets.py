"""The completions ``logprobs`` object's ``text_offset`` indexes the choice's text when byte-level BPE tokens
split characters: over random multilingual strings cut into tokens every way the vocabulary allows (tokens that
end inside a character, tokens that end one character and begin the next), echoed prompts and answers."""

import random

import pytest

from tformer.tokenizers import BPETokenizer
from tformer.tokenizers.byte_level import token_bytes

pytest.importorskip("pydantic")
from tformer.serving.openai_api import CompletionLogprobs  # noqa: E402

POOL = "ab xyz.üéñ日本語中文字😀🎈👍🏽русскийमनहिंदी\u0301"  # 1- to 4-byte characters, a combining accent
PROMPT = "x 😀 ü 日本語 zq🎈"  # the issue's prompt


@pytest.fixture(scope="module")
def tokenizer():
    """A byte-level BPE whose merges join bytes of different characters and stop inside characters."""
    rng = random.Random(1)
    return BPETokenizer.train(["".join(rng.choice(POOL) for _ in range(40)) for _ in range(300)], 700)


def segmentations(tokenizer, text, rng):
    """Ids of ``text``: as the tokenizer encodes it, one token a byte, and cut at random among the vocabulary's
    tokens (the ids a client may send as a prompt, or a model may sample)."""
    by_bytes = {token_bytes(token): token_id for token, token_id in tokenizer.get_vocab().items()}
    longest = max(map(len, by_bytes))
    data = text.encode()
    single = [by_bytes[data[i:i + 1]] for i in range(len(data))]
    cut, position = [], 0
    while position < len(data):
        fits = [size for size in range(1, longest + 1) if data[position:position + size] in by_bytes]
        size = rng.choice(fits)
        cut.append(by_bytes[data[position:position + size]])
        position += size
    return [tokenizer.encode(text), single, cut]


def recorded(tokenizer, prompt_ids, answer_ids=()):
    """The choice's text and logprobs object, the prompt echoed as the text of its ids, then the answer."""
    record, echo = CompletionLogprobs(tokenizer), tokenizer.decode(prompt_ids)
    texts = [tokenizer.decode([token]) for token in prompt_ids]
    record.add_prompt(echo, prompt_ids, texts, [-1.0] * (len(prompt_ids) - 1), [[]] * (len(prompt_ids) - 1))
    for token in answer_ids:
        record.add(token, tokenizer.decode([token]), -1.0, [])
    text = echo + tokenizer.decode(list(answer_ids))
    return text, record.since(0, len(text))


def check_offsets(tokenizer, ids, text, offsets):
    """Offsets within the text and never decreasing; each run of tokens that share an offset decodes to the text
    between its offset and the next, and so does each token that decodes to whole characters by itself."""
    assert len(offsets) == len(ids)
    if not ids:
        return
    assert all(0 <= offset <= len(text) for offset in offsets), (text, offsets)
    assert offsets == sorted(offsets), (text, offsets)
    ends = [*offsets[1:], len(text)]
    for token, start, end in zip(ids, offsets, ends, strict=True):
        piece = tokenizer.decode([token])
        if "\ufffd" not in piece:
            assert text[start:end] == piece, (text, offsets)
    run_starts = [i for i in range(len(ids)) if i == 0 or offsets[i] != offsets[i - 1]]
    for first, after in zip(run_starts, [*run_starts[1:], len(ids)], strict=True):
        end = offsets[after] if after < len(ids) else len(text)
        assert text[offsets[first]:end] == tokenizer.decode(ids[first:after]), (text, offsets)


def test_the_issues_prompt_split_into_bytes_is_offset_within_its_text(tokenizer):
    ids = segmentations(tokenizer, PROMPT, random.Random(0))[1]
    text, logprobs = recorded(tokenizer, ids)
    assert text == PROMPT
    # x, space, the emoji's 4 tokens at its start, space, ü's 2, space, 3 x 3 for 日本語, space, z, q, 🎈's 4
    assert logprobs["text_offset"] == [0, 1, 2, 2, 2, 2, 3, 4, 4, 5, 6, 6, 6, 7, 7, 7, 8, 8, 8, 9, 10, 11, 12, 12, 12,
                                       12]
    check_offsets(tokenizer, ids, text, logprobs["text_offset"])


def test_random_multilingual_prompts_and_answers_are_offset_within_their_text(tokenizer):
    rng = random.Random(0)
    for _ in range(60):
        prompt_text = "".join(rng.choice(POOL) for _ in range(rng.randint(1, 30)))
        answer_text = "".join(rng.choice(POOL) for _ in range(rng.randint(0, 12)))
        for prompt_ids, answer_ids in zip(segmentations(tokenizer, prompt_text, rng),
                                          segmentations(tokenizer, answer_text, rng), strict=True):
            text, logprobs = recorded(tokenizer, prompt_ids, answer_ids)
            assert text == prompt_text + answer_text
            offsets = logprobs["text_offset"]
            check_offsets(tokenizer, prompt_ids, prompt_text, offsets[:len(prompt_ids)])
            answer_offsets = [offset - len(prompt_text) for offset in offsets[len(prompt_ids):]]
            check_offsets(tokenizer, answer_ids, answer_text, answer_offsets)


def test_offsets_stay_within_a_text_that_ends_inside_a_character_or_is_shorter_than_its_tokens(tokenizer):
    ids = segmentations(tokenizer, "ab😀", random.Random(0))[1][:-1]  # the emoji's last byte missing
    text, logprobs = recorded(tokenizer, ids)
    assert text == "ab\ufffd" and logprobs["text_offset"] == [0, 1, 2, 2, 2]
    record = CompletionLogprobs(tokenizer)  # a text prompt echoed as sent, shorter than its tokens' text
    prompt = tokenizer.encode("abc 日本")
    record.add_prompt("abc", prompt, [tokenizer.decode([t]) for t in prompt], [-1.0] * (len(prompt) - 1),
                      [[]] * (len(prompt) - 1))
    for token in tokenizer.encode("ab"):  # an answer whose second token a stop string cut from the text
        record.add(token, tokenizer.decode([token]), -1.0, [])
    offsets = record.since(0)["text_offset"]
    assert max(offsets[:len(prompt)]) == 3 and offsets[len(prompt):] == [3, 4]
    assert record.since(0, len("abc" + "a"))["text_offset"][-1] == 4 and record.since(0, 3)["text_offset"][-1] == 3

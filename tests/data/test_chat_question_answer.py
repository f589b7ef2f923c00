"""Question/answer records (GSM8K's ``{"question", "answer"}``) as chat examples: a user turn and an assistant turn,
rendered by the plain template for a model without one, the loss on the answer only (its ``#### <number>`` line and
the end-of-sequence token included); a record whose answer is not text is refused in one line."""

import json

import pytest
from shared_data import GPT2_DIR, SHARED_DATA, require

from tformer.data.chat import ChatEncoder, chat_template, read_chat
from tformer.data.files import DataFileError
from tformer.tokenizers import load as load_tokenizer

GSM8K_TEST = SHARED_DATA / "gsm8k" / "test.jsonl"


def test_gsm8k_rows_become_a_user_question_and_an_assistant_answer():
    require(GSM8K_TEST, GPT2_DIR)
    data = read_chat(GSM8K_TEST)
    assert len(data) == 1319 and not data.skipped
    first = json.loads(GSM8K_TEST.read_text(encoding="utf-8").splitlines()[0])
    assert data.examples[0].messages == ({"role": "user", "content": first["question"]},
                                         {"role": "assistant", "content": first["answer"]})
    tokenizer = load_tokenizer(GPT2_DIR / "vocab.bpe")
    encoder = ChatEncoder(tokenizer, chat_template(None, "auto", tokenizer))  # GPT-2 has none: the plain one
    ids, trained = encoder.encode(data.examples[0])
    text = tokenizer.decode(ids, skip_special_tokens=False)
    assert text.startswith(f"### User:\n{first['question']}\n\n### Assistant:\n{first['answer']}<|endoftext|>")
    answer = tokenizer.decode([token for token, keep in zip(ids, trained, strict=True) if keep],
                              skip_special_tokens=False)
    assert answer.startswith(first["answer"]) and answer.rstrip().endswith("<|endoftext|>")
    assert first["answer"].rsplit("\n", 1)[1].startswith("#### ")  # the line the format share looks for


@pytest.mark.parametrize("row, expected", [
    ({"question": "2+2?", "answer": 4}, "answer 4 is not text"),
    ({"question": "2+2?"}, "is none of the examples the sft task reads: messages, instruction/output (input "
                           "optional), prompt/completion, question/answer"),
])
def test_a_question_without_a_text_answer_is_refused_in_one_line(tmp_path, row, expected):
    path = tmp_path / "qa.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(DataFileError) as caught:
        read_chat(path)
    assert expected in str(caught.value) and str(caught.value).startswith(f"{path}:1: ")
    assert "\n" not in str(caught.value)

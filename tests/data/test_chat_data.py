"""Instruction and chat data for the sft task: records of three kinds, rendered by the chat template with the
answers marked token by token, one-line refusals, and packing that keeps each example's loss what it is alone."""

import json
import re
from types import SimpleNamespace

import pytest
import torch

import tformer
from tformer.data.chat import PLAIN_TEMPLATE, ChatEncoder, ChatExample, chat_template, read_chat
from tformer.data.files import DataFileError
from tformer.nn.losses import IGNORE_INDEX, next_token_loss, next_token_targets
from tformer.tokenizers import BPETokenizer
from tformer.tokenizers.byte_level import BYTE_TO_CHAR
from tformer.tokenizers.chat_template import ChatTemplate
from tformer.training.tasks.sft import SupervisedFineTuning, example_labels, example_rows, fit_examples, pack

START, END = "<|im_start|>", "<|im_end|>"  # ids 256 and 257
CHATML = ("{% for m in messages %}" + START + "{{ m.role }}\n{{ m.content }}" + END + "\n{% endfor %}"
          "{% if add_generation_prompt %}" + START + "assistant\n{% endif %}")


@pytest.fixture(scope="module")
def tokenizer():
    tokenizer = BPETokenizer({char: byte for byte, char in enumerate(BYTE_TO_CHAR)}, [])
    tokenizer.add_special_tokens([START, END])
    return tokenizer


def conversation(*turns):
    return ChatExample("chat.jsonl:1", messages=tuple({"role": role, "content": text} for role, text in turns))


def test_only_the_assistant_turns_are_trained_on(tokenizer):
    encoder = ChatEncoder(tokenizer, ChatTemplate(CHATML))
    example = conversation(("system", "be brief"), ("user", "hi"), ("assistant", "hello"), ("user", "bye"),
                           ("assistant", "ok"))
    ids, trained = encoder.encode(example)
    assert ids == tokenizer.encode(ChatTemplate(CHATML).render(list(example.messages), False), add_special_tokens=False)
    answers = tokenizer.decode([token for token, keep in zip(ids, trained, strict=True) if keep],
                               skip_special_tokens=False)
    assert answers == "hello" + END + "\n" + "ok" + END + "\n"  # each answer, its end of turn and what follows it
    everything = ChatEncoder(tokenizer, ChatTemplate(CHATML), loss_on="all").encode(example)
    assert everything == (ids, [True] * len(ids))


def test_instruction_and_prompt_completion_rows(tmp_path, tokenizer):
    path = tmp_path / "data.jsonl"
    rows = [{"instruction": "add", "input": "2 3", "output": "5"}, {"prompt": "2+2=", "completion": "4"},
            {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    examples = read_chat(path).examples
    assert examples[0].messages == ({"role": "user", "content": "add\n\n2 3"}, {"role": "assistant", "content": "5"})
    tokenizer_with_end = BPETokenizer({char: byte for byte, char in enumerate(BYTE_TO_CHAR)}, [])
    tokenizer_with_end.add_special_tokens({"eos": "</s>"})
    encoder = ChatEncoder(tokenizer_with_end, chat_template(None, "auto", tokenizer_with_end))
    ids, trained = encoder.encode(examples[1])  # plain text, the end-of-sequence token after the completion
    assert ids == tokenizer_with_end.encode("2+2=4", add_special_tokens=False) + [tokenizer_with_end.eos_token_id]
    assert trained == [False] * 4 + [True, True]
    ids, trained = encoder.encode(examples[0])  # the plain template: the answer and the end-of-sequence token
    kept = [token for token, keep in zip(ids, trained, strict=True) if keep]
    text = tokenizer_with_end.decode(kept, skip_special_tokens=False)
    assert text == "5</s>\n\n"
    assert encoder.template.source == PLAIN_TEMPLATE


@pytest.mark.parametrize(("row", "expected"), [
    ({"messages": [{"role": "user", "content": "hi"}]}, "a conversation without an assistant turn (roles: user)"),
    ({"messages": [{"role": "user"}]}, "turn 1 of messages is"),
    ({"text": "hello"}, "is none of the examples the sft task reads"),
])
def test_bad_rows_are_refused_in_one_line(tmp_path, row, expected):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(DataFileError, match=re.escape(expected)) as caught:
        read_chat(path)
    assert str(caught.value).startswith(f"{path}:1: ") and "\n" not in str(caught.value)


def test_a_template_that_raises_is_refused_naming_the_row(tokenizer):
    template = ChatTemplate("{{ raise_exception('only user and assistant roles') }}")
    with pytest.raises(DataFileError, match=r"^chat.jsonl:1: only user and assistant roles$"):
        ChatEncoder(tokenizer, template).encode(conversation(("user", "hi"), ("assistant", "yo")))


def test_a_template_whose_turns_are_no_prefix_is_refused_for_answers_only(tokenizer):
    reversed_turns = "{% for m in messages | reverse %}{{ m.content }}{% endfor %}"
    with pytest.raises(DataFileError, match="cannot be told apart"):
        ChatEncoder(tokenizer, ChatTemplate(reversed_turns)).encode(conversation(("user", "hi"), ("assistant", "yo")))


def test_long_examples_are_truncated_or_refused_and_counted():
    examples = [([1, 2, 3, 4, 5], [False, False, True, True, True]), ([1, 2, 3, 4, 5], [False] * 4 + [True]),
                ([1, 2], [False, True])]
    kept, truncated, dropped = fit_examples(examples, 4, "truncate", "data")
    assert (truncated, dropped) == (2, 1) and kept == [([1, 2, 3, 4], [False, False, True, True]), examples[2]]
    with pytest.raises(Exception, match=r"data: 2 examples are longer than training.seq_len=4 tokens"):
        fit_examples(examples, 4, "refuse", "data")


def test_best_fit_packing():
    rows = pack([5, 3, 7, 2, 8], 10)
    assert sorted(map(sorted, rows)) == [[0], [1, 2], [3, 4]]
    assert all(sum([5, 3, 7, 2, 8][i] for i in row) <= 10 for row in rows)


def packed_example_losses(logits, batch):
    """Each example's mean loss over its trained tokens in a packed batch: the tokens between restarts of
    ``position_ids``."""
    losses = next_token_loss(logits, batch["labels"], reduction="none")  # (B, T), 0 where ignored
    targets = next_token_targets(batch["labels"], logits.shape[1]) != IGNORE_INDEX
    found = []
    for row in range(logits.shape[0]):
        starts = (batch["position_ids"][row] == 0).nonzero().flatten().tolist() + [logits.shape[1]]
        for start, stop in zip(starts, starts[1:], strict=False):
            if targets[row, start:stop].any():
                found.append((batch["input_ids"][row, start:stop].tolist(),
                              losses[row, start:stop].sum() / targets[row, start:stop].sum()))
    return found


def random_examples(count, vocab):
    generator = torch.Generator().manual_seed(1)
    examples = []
    for _ in range(count):
        length = int(torch.randint(4, 20, (1,), generator=generator))
        ids = torch.randint(0, vocab, (length,), generator=generator).tolist()
        cut = int(torch.randint(1, length - 1, (1,), generator=generator))
        examples.append((ids, [False] * cut + [True] * (length - cut)))
    return examples


@pytest.mark.parametrize("positional", ["learned", "rope", "alibi"])
def test_a_packed_batch_gives_each_example_its_loss_alone(positional):
    model = tformer.build_model("gpt-nano", vocab_size=50, positional=positional).eval()
    examples = random_examples(12, 50)
    rows = example_rows(examples, 32, packing=True, pad_id=0)
    assert len(rows) < len(examples)  # several to a row
    batch = rows.select(torch.arange(len(rows)))
    with torch.no_grad():
        packed = packed_example_losses(model(batch["input_ids"], position_ids=batch["position_ids"]).logits, batch)
        assert len(packed) == len(examples)
        for ids, loss in packed:
            trained = next(t for i, t in examples if i == ids)
            alone = next_token_loss(model(torch.tensor([ids])).logits, torch.tensor([example_labels(ids, trained)]))
            assert torch.allclose(loss, alone, atol=1e-5, rtol=0)


def test_the_sft_training_loss_is_the_packed_rows_loss_without_their_logits():
    model = tformer.build_model("gpt-nano", vocab_size=50, dropout=0.0).train()
    batch = example_rows(random_examples(12, 50), 32, packing=True, pad_id=0).select(torch.arange(2))
    task = SimpleNamespace(config=SimpleNamespace(label_smoothing=0.1),  # what the task's loss reads of itself,
                           loss_alone=model.loss_alone)                  # as prepare sets them
    with torch.no_grad():
        logits = model(batch["input_ids"], position_ids=batch["position_ids"]).logits
    held = []
    model.register_forward_hook(lambda module, args, output: held.append(output.logits))
    loss = SupervisedFineTuning.loss(task, model, batch)
    torch.testing.assert_close(loss, next_token_loss(logits, batch["labels"], 0.1), rtol=1e-5, atol=0)
    assert held == [None]  # the loss alone (losses.head_loss): no (B, T, V) logits kept for the backward


def test_no_token_attends_across_a_boundary():
    model = tformer.build_model("gpt-nano", vocab_size=50).eval()
    examples = random_examples(6, 50)
    batch = example_rows(examples, 48, packing=True, pad_id=0).select(torch.arange(1))
    starts = (batch["position_ids"][0] == 0).nonzero().flatten().tolist()
    first, second = starts[0], starts[1]  # perturb the row's first example: the others' logits stay
    changed = batch["input_ids"].clone()
    changed[0, first:second] = (changed[0, first:second] + 1) % 50
    with torch.no_grad():
        before = model(batch["input_ids"], position_ids=batch["position_ids"]).logits
        after = model(changed, position_ids=batch["position_ids"]).logits
    assert not torch.equal(before[0, first:second], after[0, first:second])
    assert torch.equal(before[0, second:], after[0, second:])
    from tformer.nn.attention.mask import StepLayout, packed_segments  # the mask: no key of another example

    positions = batch["position_ids"]
    layout = StepLayout(positions, positions, segments=packed_segments(positions))
    dense, _ = layout.attention_mask(True, None).dense(positions.shape[1], positions.shape[1], torch.float32, "cpu")
    segments = packed_segments(positions)[0]
    allowed = dense[0, 0] == 0
    assert not (allowed & (segments[:, None] != segments[None, :])).any()


def test_a_kernel_that_cannot_keep_examples_apart_refuses_packed_rows():
    model = tformer.build_model("gpt-nano", vocab_size=50, attention_kernel="performer").eval()
    with pytest.raises(ValueError, match="cannot keep apart"):
        model(torch.tensor([[1, 2, 3, 4]]), position_ids=torch.tensor([[0, 1, 0, 1]]))

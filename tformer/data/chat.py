"""Instruction and chat examples for supervised fine-tuning, from JSONL, CSV/TSV, Parquet or a datasets folder
(``tformer.data.records``), and their token ids with the tokens to train on.

A record is one of four kinds, told apart by its fields (the names Hugging Face's datasets and TRL use):

* ``messages``: a conversation, a list of ``{"role": ..., "content": ...}`` turns with at least one
  ``assistant`` turn, rendered by the chat template;
* ``instruction`` / ``output`` (and an optional ``input``; Alpaca's): made into a user turn (the instruction,
  then a blank line and the input when there is one) and an assistant turn (the output), rendered the same way;
* ``prompt`` / ``completion``: plain text, the completion following the prompt directly (no template), the
  tokenizer's end-of-sequence token after it;
* ``question`` / ``answer`` (GSM8K's, and many question-answering sets'): a user turn (the question) and an
  assistant turn (the answer), rendered as a conversation.

The chat template is the tokenizer's (``chat_template.jinja`` or ``tokenizer_config.json`` of the model folder)
rendered in ``tokenizers.chat_template``'s sandbox, the one renderer tformer has; a model without one gets
``PLAIN_TEMPLATE`` (``### User:`` / ``### Assistant:`` headings, the end-of-sequence token after each answer). The
answer of assistant turn i is the text between the rendering of the turns before it with the assistant's turn opened
(``add_generation_prompt``) and the rendering of the turns up to it: both must start the whole conversation's
rendering, or the template is refused for answers-only loss. The whole text is tokenized once (as
``apply_chat_template`` does, no special tokens added) and a token is an answer token when its characters
overlap an answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tformer.data.files import DataFileError, Skipped
from tformer.data.records import RecordFile, json_cell
from tformer.errors import quoted
from tformer.tokenizers.chat_template import ChatTemplate, ChatTemplateError

KINDS = ("messages", "instruction/output", "prompt/completion", "question/answer")
LOSS_ON = ("answers", "all")
# A template for models without one: each turn under a heading, the end-of-sequence token after each answer.
PLAIN_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '### ' + (message['role'] | capitalize) + ':\\n' + message['content'] }}"
    "{% if message['role'] == 'assistant' %}{{ eos_token | default('') }}{% endif %}"
    "{{ '\\n\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '### Assistant:\\n' }}{% endif %}"
)


@dataclass(frozen=True)
class ChatExample:
    """One example: a conversation (``messages``), or a ``prompt`` and its ``completion``; ``where`` names its
    record (``path:line``)."""

    where: str
    messages: tuple[dict, ...] | None = None
    prompt: str | None = None
    completion: str | None = None


@dataclass
class ChatData:
    """The examples of one file and the bad records left out."""

    path: str
    examples: list[ChatExample]
    skipped: Skipped = field(default_factory=Skipped)

    def __len__(self) -> int:
        return len(self.examples)


def read_chat(path: str | Path, *, format: str | None = None, skip_bad: bool = False) -> ChatData:
    """The examples of a records file (see the module doc); a record of none of the three kinds, a turn that is
    not ``{role, content}`` text, or a conversation without an assistant turn is a DataFileError naming it (or,
    with ``skip_bad``, left out and counted)."""
    records = RecordFile.open(path, format)
    examples, skipped = [], Skipped()
    for _, where, record in records.readable(skipped=skipped, skip_bad=skip_bad):
        try:
            examples.append(chat_example(record, where))
        except DataFileError as error:
            skipped.handle(str(error), skip_bad)
    if not examples:
        raise DataFileError(f"{path}: no examples" + (f" ({skipped.summary()})" if skipped else ""))
    return ChatData(str(path), examples, skipped)


def chat_example(record: dict, where: str) -> ChatExample:
    """The example a record holds, by its fields (``messages``; ``instruction``/``output``;
    ``prompt``/``completion``; ``question``/``answer``)."""
    if "messages" in record:
        turns = json_cell(record["messages"], where, "messages")
        return ChatExample(where, messages=check_messages(turns, where))
    if "instruction" in record and "output" in record:
        instruction, output = (_text(record, name, where) for name in ("instruction", "output"))
        extra = _text(record, "input", where) if record.get("input") is not None else ""
        user = f"{instruction}\n\n{extra}" if extra else instruction
        return ChatExample(where, messages=({"role": "user", "content": user},
                                            {"role": "assistant", "content": output}))
    if "prompt" in record and "completion" in record:
        return ChatExample(where, prompt=_text(record, "prompt", where), completion=_text(record, "completion", where))
    if "question" in record and "answer" in record:
        question, answer = (_text(record, name, where) for name in ("question", "answer"))
        return ChatExample(where, messages=({"role": "user", "content": question},
                                            {"role": "assistant", "content": answer}))
    raise DataFileError(f"{where}: a record of fields {', '.join(map(repr, record)) or '(none)'} is none of the "
                        f"examples the sft task reads: messages, instruction/output (input optional), "
                        "prompt/completion, question/answer")


def check_messages(turns, where: str) -> tuple[dict, ...]:
    """A conversation as a tuple of ``{"role", "content"}`` dicts (other keys kept for the template), refused in
    one line when it is not one or has no assistant turn (nothing to train on)."""
    if not isinstance(turns, (list, tuple)) or not turns:
        raise DataFileError(f"{where}: messages must be a non-empty list of {{\"role\", \"content\"}} turns")
    for number, turn in enumerate(turns, 1):
        if not (isinstance(turn, dict) and isinstance(turn.get("role"), str) and isinstance(turn.get("content"), str)):
            raise DataFileError(f"{where}: turn {number} of messages is {quoted(turn)}; each turn must be "
                                "{\"role\": text, \"content\": text}")
    if not any(turn["role"] == "assistant" for turn in turns):
        roles = ", ".join(dict.fromkeys(turn["role"] for turn in turns))
        raise DataFileError(f"{where}: a conversation without an assistant turn (roles: {roles}): nothing to train "
                            "on; every conversation needs at least one")
    return tuple(dict(turn) for turn in turns)


def _text(record: dict, name: str, where: str) -> str:
    value = record[name]
    if not isinstance(value, str):
        raise DataFileError(f"{where}: {name} {quoted(value)} is not text")
    return value


# ---- rendering and tokens --------------------------------------------------------------------------------


def chat_template(folder: str | Path | None, choice: str, tokenizer) -> ChatTemplate:
    """The template conversations are rendered with: ``choice`` "auto" (the model folder's, else the plain one)
    or "plain"; the plain one gets the tokenizer's end-of-sequence token."""
    if choice == "auto" and folder is not None and Path(folder).is_dir():
        found = ChatTemplate.from_folder(folder)
        if found is not None:
            return found
    eos = getattr(tokenizer, "eos_token", None)
    return ChatTemplate(PLAIN_TEMPLATE, {"eos_token": eos} if eos else {})


class ChatEncoder:
    """Examples -> (token ids, per token: whether it is trained on). ``loss_on``: "answers" (the assistant turns,
    the completions) or "all" (every token)."""

    def __init__(self, tokenizer, template: ChatTemplate, loss_on: str = "answers") -> None:
        if loss_on not in LOSS_ON:
            raise ValueError(f"loss_on={loss_on!r} is not one of {', '.join(LOSS_ON)}")
        self.tokenizer, self.template, self.loss_on = tokenizer, template, loss_on

    def encode(self, example: ChatExample) -> tuple[list[int], list[bool]]:
        """The example's ids and which of them the loss reads (a DataFileError naming the record when the
        template fails on it or cannot mark its answers)."""
        if example.messages is None:
            text, spans = example.prompt + example.completion, [(len(example.prompt), None)]
            end = self.tokenizer.eos_token_id
        else:
            text, spans = self._render(example)
            end = None
        encoding = self.tokenizer.encode_plus(text, add_special_tokens=False)
        ids = list(encoding.ids)
        if self.loss_on == "all":
            trained = [True] * len(ids)
        else:
            trained = [any(stop > first and (last is None or start < last) for first, last in spans)
                       for start, stop in encoding.offsets]
        if end is not None:
            ids.append(end)
            trained.append(True)
        return ids, trained

    def _render(self, example: ChatExample) -> tuple[str, list[tuple[int, int]]]:
        """The conversation's text and the character span of each assistant turn's answer."""
        messages = list(example.messages)
        try:
            whole = self.template.render(messages, add_generation_prompt=False)
            spans = []
            if self.loss_on == "answers":
                for index, turn in enumerate(messages):
                    if turn["role"] != "assistant":
                        continue
                    before = self.template.render(messages[:index], add_generation_prompt=True)
                    through = self.template.render(messages[: index + 1], add_generation_prompt=False)
                    if not (whole.startswith(before) and whole.startswith(through)) or len(through) < len(before):
                        raise DataFileError(
                            f"{example.where}: the chat template does not render the turns before assistant turn "
                            f"{index + 1} as the start of the whole conversation, so its answer cannot be told apart; "
                            "train on every token (task.loss_on = \"all\") or use another template")
                    spans.append((len(before), len(through)))
        except ChatTemplateError as error:
            raise DataFileError(f"{example.where}: {error}") from None
        return whole, spans


def encode_examples(encoder: ChatEncoder, examples: Sequence[ChatExample]) -> list[tuple[list[int], list[bool]]]:
    """Every example's ids and trained tokens (``ChatEncoder.encode``)."""
    return [encoder.encode(example) for example in examples]

"""Every request field of OpenAI's completions and chat APIs (and vLLM's extensions) honoured or refused by name
(issue 57, part 6), through the real ``openai`` client: ``logit_bias``, ``presence_penalty`` and
``frequency_penalty`` answer what ``tformer.generate`` gives with the same options (OpenAI's definitions, checked
against a hand loop in tests/generation/test_generation_rules.py), ``stop_token_ids`` end an answer there,
``allowed_token_ids`` are the only tokens chosen, a seeded request draws the same tokens alone and among other
requests, ``truncate_prompt_tokens`` and ``add_generation_prompt`` shape the prompt; every field the server does not
honour (``REFUSED_FIELDS``) and every bad value is a 400 naming the field, and the server keeps serving."""

import concurrent.futures
import json
import re

import pytest
import torch
from test_serving_server import TEMPLATE, TEXT, ServerThread, generated

import tformer
from tformer.serving.refused_fields import REFUSED_FIELDS
from tformer.tokenizers import CharTokenizer
from tformer.tokenizers.chat_template import ChatTemplate

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")

pytestmark = pytest.mark.slow  # the openai client against a server

PROMPT = "ROMEO:"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fields") / "tiny"
    tokenizer = CharTokenizer.train(TEXT)
    torch.manual_seed(0)
    model = tformer.build_model("gpt-nano", vocab_size=tokenizer.vocab_size, max_seq_len=256, initializer_range=0.2)
    model.tokenizer = tokenizer
    model.save(folder)
    (folder / "chat_template.jinja").write_text(TEMPLATE)
    return folder


@pytest.fixture(scope="module")
def thread_server(checkpoint):
    server = ServerThread(checkpoint, "thread", cache_tokens=4096, block_size=8)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def process_server(checkpoint):
    server = ServerThread(checkpoint, "process", cache_tokens=4096, block_size=8)
    yield server
    server.stop()


def _id(server, character: str) -> int:
    (token,) = server.model.tokenizer.encode(character)
    return token


@pytest.mark.parametrize("engine", ["thread", "process"])
def test_logit_bias_and_openais_penalties_answer_what_generate_gives(request, engine):
    served = request.getfixturevalue(f"{engine}_server")
    client, model = served.client(), served.model
    prompt = model.tokenizer.encode(PROMPT)
    e = _id(served, "e")
    common = dict(model="tiny", prompt=PROMPT, max_tokens=16, extra_body={"ignore_eos": True})
    biased = client.completions.create(temperature=0, logit_bias={str(e): 100}, **common)
    assert biased.choices[0].text == "e" * 16
    options = dict(presence_penalty=0.7, frequency_penalty=1.3)
    sampled = client.completions.create(temperature=0.9, seed=4, logit_bias={str(e): 3}, n=2, **options, **common)
    for index, choice in enumerate(sampled.choices):
        assert choice.text == generated(model, prompt, max_new_tokens=16, do_sample=True, temperature=0.9,
                                        seed=4 + index, logit_bias={e: 3.0}, **options)
    greedy = client.completions.create(temperature=0, **options, **common).choices[0].text
    assert greedy == generated(model, prompt, max_new_tokens=16, **options)
    assert greedy != generated(model, prompt, max_new_tokens=16)  # the penalties change this answer
    # Chat: the same options over the rendered messages.
    messages = [{"role": "user", "content": "to be?"}]
    chat_prompt = model.tokenizer.encode(ChatTemplate(TEMPLATE).render(messages), add_special_tokens=False)
    chat = client.chat.completions.create(model="tiny", messages=messages, max_tokens=12, temperature=0,
                                          frequency_penalty=2.0, logit_bias={str(_id(served, "o")): 1.5},
                                          extra_body={"ignore_eos": True})
    assert chat.choices[0].message.content == generated(model, chat_prompt, max_new_tokens=12, frequency_penalty=2.0,
                                                        logit_bias={_id(served, "o"): 1.5})


def test_stop_token_ids_end_the_answer_before_that_token(thread_server):
    client, model = thread_server.client(), thread_server.model
    prompt = model.tokenizer.encode(PROMPT)
    config = tformer.GenerationConfig(max_new_tokens=20, eos_token_id=(), temperature=0.8, seed=2)
    free = tformer.generate(model, torch.tensor([prompt]), generation_config=config)[0, len(prompt):].tolist()
    stop = free[9]
    first = free.index(stop)
    answer = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=20, temperature=0.8, seed=2,
                                       extra_body={"ignore_eos": True, "stop_token_ids": [stop]})
    choice = answer.choices[0]
    assert (choice.text, choice.finish_reason) == (model.tokenizer.decode(free[:first]), "stop")
    assert answer.usage.completion_tokens == first + 1  # the stop token is counted, not in the text
    # min_tokens forbids a stop id as it forbids the end ids (vLLM's rule).
    late = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=20, temperature=0.8, seed=2,
                                     extra_body={"ignore_eos": True, "stop_token_ids": [stop],
                                                 "min_tokens": first + 2})
    assert late.usage.completion_tokens >= first + 3 or late.choices[0].finish_reason == "length"


def test_include_stop_str_in_output_ends_the_text_with_the_stop_string(thread_server):
    client, model = thread_server.client(), thread_server.model
    free = generated(model, model.tokenizer.encode(PROMPT), max_new_tokens=30)
    stop = free[8:10]
    common = dict(model="tiny", prompt=PROMPT, max_tokens=30, temperature=0, stop=[stop])
    cut = client.completions.create(**common).choices[0]
    kept = client.completions.create(**common, extra_body={"include_stop_str_in_output": True}).choices[0]
    first = free.index(stop)
    assert (cut.text, cut.finish_reason) == (free[:first], "stop")
    assert (kept.text, kept.finish_reason) == (free[:first + 2], "stop")
    streamed = client.completions.create(**common, stream=True, extra_body={"include_stop_str_in_output": True})
    assert "".join(chunk.choices[0].text for chunk in streamed) == kept.text


def test_skip_special_tokens_leaves_them_out_of_the_text(thread_server):
    client, model = thread_server.client(), thread_server.model
    unknown = model.tokenizer.encode("§")[0]  # a character outside the vocabulary: <unk>, a special token
    assert model.tokenizer.decode([unknown], skip_special_tokens=True) == ""
    common = dict(model="tiny", prompt=PROMPT, max_tokens=6, temperature=0, logit_bias={str(unknown): 100})
    kept = client.completions.create(**common, extra_body={"ignore_eos": True}).choices[0].text
    skipped = client.completions.create(**common, extra_body={"ignore_eos": True, "skip_special_tokens": True})
    assert kept == model.tokenizer.decode([unknown]) * 6 and skipped.choices[0].text == ""
    assert skipped.usage.completion_tokens == 6


def test_allowed_token_ids_are_the_only_tokens_chosen(thread_server):
    client = thread_server.client()
    allowed = [_id(thread_server, character) for character in "ab "]
    answer = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=24, temperature=1.5, seed=1,
                                       extra_body={"ignore_eos": True, "allowed_token_ids": allowed})
    assert set(answer.choices[0].text) <= set("ab ") and len(answer.choices[0].text) == 24


def test_a_seeded_request_draws_the_same_tokens_alone_and_among_others(thread_server):
    client = thread_server.client()
    seeded = dict(model="tiny", prompt=PROMPT, max_tokens=16, temperature=1.1, seed=11, n=2,
                  extra_body={"ignore_eos": True})
    alone = [choice.text for choice in client.completions.create(**seeded).choices]

    def ask(index):
        if index == 3:
            return [choice.text for choice in client.completions.create(**seeded).choices]
        return client.completions.create(model="tiny", prompt=TEXT[index : index + 9], max_tokens=24,
                                         temperature=1.0, extra_body={"ignore_eos": True}).choices[0].text

    with concurrent.futures.ThreadPoolExecutor(7) as pool:
        answers = list(pool.map(ask, range(7)))
    assert answers[3] == alone
    prompt = thread_server.model.tokenizer.encode(PROMPT)
    assert alone == [generated(thread_server.model, prompt, max_new_tokens=16, do_sample=True, temperature=1.1,
                               seed=11 + index) for index in range(2)]


def test_truncate_prompt_tokens_keeps_the_prompts_last_tokens(thread_server):
    client, model = thread_server.client(), thread_server.model
    text = "to be or not to be"
    ids = model.tokenizer.encode(text)
    answer = client.completions.create(model="tiny", prompt=text, max_tokens=6, temperature=0, echo=True,
                                       extra_body={"ignore_eos": True, "truncate_prompt_tokens": 5})
    assert answer.usage.prompt_tokens == 5
    assert answer.choices[0].text == model.tokenizer.decode(ids[-5:]) + generated(model, ids[-5:], max_new_tokens=6)
    messages = [{"role": "user", "content": "to be?"}]
    chat_ids = model.tokenizer.encode(ChatTemplate(TEMPLATE).render(messages), add_special_tokens=False)
    chat = client.chat.completions.create(model="tiny", messages=messages, max_tokens=4, temperature=0,
                                          extra_body={"ignore_eos": True, "truncate_prompt_tokens": 6})
    assert chat.usage.prompt_tokens == 6
    assert chat.choices[0].message.content == generated(model, chat_ids[-6:], max_new_tokens=4)


def test_add_generation_prompt_false_leaves_the_assistants_turn_unopened(thread_server):
    client, model = thread_server.client(), thread_server.model
    messages = [{"role": "user", "content": "to be?"}]
    ids = model.tokenizer.encode(ChatTemplate(TEMPLATE).render(messages, add_generation_prompt=False),
                                 add_special_tokens=False)
    chat = client.chat.completions.create(model="tiny", messages=messages, max_tokens=5, temperature=0,
                                          extra_body={"ignore_eos": True, "add_generation_prompt": False})
    assert chat.usage.prompt_tokens == len(ids) and not ChatTemplate(TEMPLATE).render(
        messages, add_generation_prompt=False).endswith("assistant:")
    assert chat.choices[0].message.content == generated(model, ids, max_new_tokens=5)


TRIMMING = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content | trim }}<|end|>{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")


@pytest.mark.parametrize("template", [TEMPLATE, TRIMMING])
@pytest.mark.parametrize("final", ["or not ", " or not", "or not"])
def test_continue_final_message_cuts_the_chat_where_transformers_does(template, final):
    transformers_chat = pytest.importorskip("transformers.utils.chat_template_utils")
    from tformer.serving.openai_api import ChatRequest

    messages = [{"role": "user", "content": "to be?"}, {"role": "assistant", "content": final}]
    body = ChatRequest(model="tiny", messages=messages, continue_final_message=True)
    ours = body.continued(ChatTemplate(template).render(messages, add_generation_prompt=body.opens_turn))
    (theirs,), _ = transformers_chat.render_jinja_template([messages], chat_template=template,
                                                           continue_final_message=True)
    assert ours == theirs


def test_continue_final_message_answers_after_the_last_message(thread_server):
    client, model = thread_server.client(), thread_server.model
    messages = [{"role": "user", "content": "to be?"}, {"role": "assistant", "content": "or not"}]
    ids = model.tokenizer.encode("user: to be?\nassistant: or not", add_special_tokens=False)
    chat = client.chat.completions.create(model="tiny", messages=messages, max_tokens=5, temperature=0,
                                          extra_body={"ignore_eos": True, "continue_final_message": True})
    assert chat.usage.prompt_tokens == len(ids)
    assert chat.choices[0].message.content == generated(model, ids, max_new_tokens=5)
    for extra, message in (({"continue_final_message": True, "add_generation_prompt": True}, "send one of them"),
                           ({"continue_final_message": True}, "does not appear in the rendered chat")):
        gone = [{"role": "user", "content": "to be?"}, {"role": "assistant", "content": "   "}]
        with pytest.raises(openai.BadRequestError, match=message) as refused:
            client.chat.completions.create(model="tiny", messages=messages if "add_generation_prompt" in extra
                                           else gone, max_tokens=2, extra_body=extra)
        assert refused.value.body["param"] == "continue_final_message"


@pytest.mark.parametrize("field", sorted(REFUSED_FIELDS))
def test_every_field_not_honoured_is_a_400_naming_it_and_why(thread_server, field):
    client = thread_server.client()
    value = {"store": False, "metadata": {}, "priority": 0, "echo": False}.get(field, 1)
    with pytest.raises(openai.BadRequestError, match=rf"{field} is not supported: ") as chat:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "to"}], max_tokens=2,
                                       extra_body={field: value})
    assert chat.value.body["param"] == field and REFUSED_FIELDS[field] in chat.value.body["message"]
    if field != "echo":  # completions honour echo
        with pytest.raises(openai.BadRequestError, match=rf"{field} is not supported: "):
            client.completions.create(model="tiny", prompt="to", max_tokens=2, extra_body={field: value})
    assert client.completions.create(model="tiny", prompt="to", max_tokens=2).choices[0].finish_reason


@pytest.mark.parametrize(("body", "param", "message"), [
    ({"logit_bias": {"e": 1}}, "logit_bias", "logit_bias: key 'e' is not a token id"),
    ({"logit_bias": {"9999": 1}}, "logit_bias", r"logit_bias=\[9999\]: 9999 is not a token id in \[0, \d+\)"),
    ({"logit_bias": {"3": 150}}, "logit_bias", r"the bias of token id 3 is 150.*\[-100, 100\]"),
    ({"presence_penalty": 2.5}, "presence_penalty", r"presence_penalty=2.5 must be a number in \[-2, 2\]"),
    ({"frequency_penalty": -3}, "frequency_penalty", r"frequency_penalty=-3.0 must be a number in \[-2, 2\]"),
    ({"stop_token_ids": [9999]}, "stop_token_ids", r"stop_token_ids=\(9999,\): 9999 is not a token id"),
    ({"allowed_token_ids": []}, "allowed_token_ids", "allowed_token_ids=.* allows no token"),
    ({"allowed_token_ids": [-2]}, "allowed_token_ids", "-2 is not a token id"),
    ({"seed": -1}, "seed", "seed=-1 must be an integer >= 0"),
    ({"best_of": 3}, "best_of", "best_of=3 is not supported"),
    ({"suffix": "end"}, "suffix", "suffix"),
])
def test_bad_values_are_400s_naming_the_field(thread_server, body, param, message):
    status, answer = thread_server.post("/v1/completions", json.dumps({"model": "tiny", "prompt": "to",
                                                                        "max_tokens": 2, **body}).encode())
    assert status == 400, answer
    assert answer["error"]["param"] == param
    assert re.search(message, answer["error"]["message"]), answer["error"]["message"]


def test_the_docs_table_names_every_request_field():
    """docs/serving.md's Request fields section names every field the request schemas declare and every field
    ``REFUSED_FIELDS`` refuses."""
    from pathlib import Path

    from tformer.serving.openai_api import ChatRequest, CompletionRequest

    page = (Path(__file__).resolve().parents[2] / "docs" / "serving.md").read_text()
    section = page.split("### Request fields", 1)[1].split("\n#", 1)[0]
    named = set(re.findall(r"`([a-z_]+)`", section))
    declared = set(CompletionRequest.model_fields) | set(ChatRequest.model_fields)
    assert not declared - named, f"fields the table leaves out: {sorted(declared - named)}"
    left_out = set(REFUSED_FIELDS) - named
    assert not left_out, f"refused fields the table leaves out: {sorted(left_out)}"

"""Structured outputs through ``tformer serve`` and the real ``openai`` client: 200 ``json_schema`` requests over 30
schemas from concurrent clients all parse and validate (``jsonschema`` is the reference); ``json_object``, vLLM's
``structured_outputs`` and ``guided_*`` fields on completions and chat, streamed too; the engine batching rows with
different constraints (and none) decodes each as ``generate`` alone; a schema, regex or grammar that cannot compile
is a 400 naming it, and the server goes on serving."""

import concurrent.futures
import functools
import json
import re
import threading
import time

import pytest
import torch

import tformer
from tformer.cli.serve import build_engine
from tformer.generation import GenerationConfig
from tformer.generation.constraints import Constraint
from tformer.generation.rules import Constrained
from tformer.hub import load_tokenizer
from tformer.serving import Engine
from tformer.serving.engine_client import ThreadEngineClient
from tformer.serving.engine_process import ProcessEngineClient
from tformer.serving.limits import DEFAULT_STALL_SECONDS
from tformer.serving.server import OpenAIServer
from tformer.tokenizers import CharTokenizer
from tformer.tokenizers.chat_template import ChatTemplate

openai = pytest.importorskip("openai")
uvicorn = pytest.importorskip("uvicorn")
jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("llguidance")

END = 1  # "<eos>"
TEMPLATE = ("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}assistant:{% endif %}")


def schemas() -> list[dict]:
    """30 schemas a random model completes: nested objects, enums, arrays, bounded integers and numbers, booleans,
    required and optional properties; strings and arrays bounded so that no text runs on."""
    def obj(properties, required):
        return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}

    found = []
    for i in range(30):
        name = {"type": "string", "maxLength": 1 + i % 5}
        count = {"type": "integer", "minimum": -i, "maximum": 10 + 7 * i}
        level = {"enum": ["low", "mid", "high", i, None][: 2 + i % 4]}
        score = {"type": "number", "minimum": 0, "maximum": 2 + i % 3, "multipleOf": 0.5}
        tags = {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": i % 2, "maxItems": 1 + i % 3}
        flag = {"type": "boolean"}
        kind = i % 6
        if kind == 0:
            found.append(obj({"name": name, "count": count}, ["name", "count"]))
        elif kind == 1:
            found.append(obj({"level": level, "tags": tags, "flag": flag}, ["level", "tags"]))  # flag optional
        elif kind == 2:
            found.append(obj({"inner": obj({"score": score, "flag": flag}, ["score", "flag"]), "name": name},
                             ["inner"]))
        elif kind == 3:
            found.append({"type": "array", "items": obj({"count": count, "level": level}, ["count"]),
                          "minItems": 1, "maxItems": 2})
        elif kind == 4:
            found.append(obj({"a": obj({"b": obj({"c": count}, ["c"])}, ["b"]), "tags": tags}, ["a", "tags"]))
        else:
            found.append({"anyOf": [obj({"score": score}, ["score"]), {"enum": ["none", i]}]})
    return found


SCHEMAS = schemas()


@pytest.fixture(scope="module")
def model():
    tokenizer = CharTokenizer([chr(code) for code in range(32, 127)] + ["\n"], special_tokens=["<unk>", "<eos>"])
    torch.manual_seed(0)
    built = tformer.build_model("gpt-nano", vocab_size=tokenizer.vocab_size, max_seq_len=512, eos_token_id=END)
    built.tokenizer = tokenizer
    return built.eval()


class Server:
    """An OpenAIServer under uvicorn on a free port, its engine on a thread of this process, or (``folder``: the
    model saved there) in a process of its own, as ``tformer serve`` runs it by default."""

    def __init__(self, model, folder=None):
        options = dict(cache_tokens=16384, block_size=16, max_running=32)
        if folder is None:
            client = ThreadEngineClient(Engine(model, model.tokenizer, **options), DEFAULT_STALL_SECONDS)
        else:
            build = functools.partial(build_engine, str(folder), "cpu", None, 1, options)
            client = ProcessEngineClient(build, load_tokenizer(folder), DEFAULT_STALL_SECONDS)
        template = ChatTemplate(TEMPLATE)
        app = OpenAIServer(client, "tiny", chat_template=template).app()
        self.uvicorn = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="error"))
        self.thread = threading.Thread(target=self.uvicorn.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.uvicorn.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "the server did not start"
            time.sleep(0.02)
        self.port = self.uvicorn.servers[0].sockets[0].getsockname()[1]

    def client(self):
        return openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key="unused", max_retries=0,
                             timeout=120)

    def stop(self):
        self.uvicorn.should_exit = True
        self.thread.join(30)


@pytest.fixture(scope="module")
def server(model):
    running = Server(model)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def process_server(model, tmp_path_factory):
    folder = tmp_path_factory.mktemp("structured") / "tiny"
    model.save(folder)
    running = Server(model, folder)
    yield running
    running.stop()


@pytest.mark.slow  # 200 requests through the server: about 7 s on an idle 2-core host
def test_200_json_schema_requests_over_30_schemas_all_parse_and_validate(server):
    client = server.client()

    def ask(index):
        schema = SCHEMAS[index % len(SCHEMAS)]
        response_format = {"type": "json_schema", "json_schema": {"name": f"s{index}", "schema": schema,
                                                                  "strict": True}}
        if index % 2:
            answer = client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": f"item {index}"}], max_tokens=300,
                temperature=1.0, seed=index, response_format=response_format)
            choice = answer.choices[0]
            text = choice.message.content
        else:
            answer = client.completions.create(model="tiny", prompt=f"item {index}:", max_tokens=300,
                                               temperature=0.0 if index % 4 == 0 else 1.0, seed=index,
                                               extra_body={"response_format": response_format})
            choice = answer.choices[0]
            text = choice.text
        return index, schema, text, choice.finish_reason

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(ask, range(200)))
    for index, schema, text, finish in answers:
        assert finish == "stop", (index, text)
        jsonschema.validate(json.loads(text), schema)


def test_json_object_and_vllms_fields_on_completions_and_chat_streamed_too(server):
    client = server.client()
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=300,
                                          temperature=0.8, seed=1, response_format={"type": "json_object"})
    assert isinstance(json.loads(chat.choices[0].message.content), dict)
    options = ["positive", "negative"]
    for extra in ({"guided_choice": options}, {"structured_outputs": {"choice": options}}):
        answer = client.completions.create(model="tiny", prompt="sentiment:", max_tokens=20, extra_body=extra)
        assert answer.choices[0].text in options
    pattern = r"\d{3}-[a-z]{2}"
    for extra in ({"guided_regex": pattern}, {"structured_outputs": {"regex": pattern}}):
        answer = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "code?"}],
                                                max_tokens=20, extra_body=extra)
        assert re.fullmatch(pattern, answer.choices[0].message.content)
    schema = SCHEMAS[2]
    for extra in ({"guided_json": schema}, {"structured_outputs": {"json": json.dumps(schema)}}):
        answer = client.completions.create(model="tiny", prompt="x", max_tokens=300, extra_body=extra)
        jsonschema.validate(json.loads(answer.choices[0].text), schema)
    lark = 'start: "say " word\nword: "yes" | "no"'
    gbnf = 'root ::= "say " word\nword ::= "yes" | "no"'
    for extra in ({"guided_grammar": lark}, {"structured_outputs": {"grammar": gbnf}}):
        answer = client.completions.create(model="tiny", prompt="x", max_tokens=20, extra_body=extra)
        assert answer.choices[0].text in ("say yes", "say no")
    stream = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "s"}], max_tokens=300,
                                            stream=True, response_format={"type": "json_schema", "json_schema": {
                                                "name": "s", "schema": SCHEMAS[4]}})
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    jsonschema.validate(json.loads(text), SCHEMAS[4])
    answer = client.completions.create(model="tiny", prompt="x", max_tokens=300, n=3, temperature=1.0, seed=4,
                                       extra_body={"guided_json": SCHEMAS[1]})
    for choice in answer.choices:  # a request's sequences each follow their own grammar state
        jsonschema.validate(json.loads(choice.text), SCHEMAS[1])


@pytest.mark.parametrize(("extra", "field", "message"), [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "frog"}}}},
     "response_format", "json_schema cannot be compiled: Invalid type: frog"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format",
     "needs json_schema.schema"),
    ({"guided_json": "{not json"}, "guided_json", "json_schema is not JSON"),
    ({"guided_regex": "(a"}, "guided_regex", r"regex '\(a' cannot be compiled: .*unclosed group"),
    ({"structured_outputs": {"regex": "a(?=b)"}}, "structured_outputs", "look-around"),
    ({"guided_grammar": "start: missing_rule"}, "guided_grammar", "unknown name"),
    ({"structured_outputs": {"grammar": "root ::= ("}}, "structured_outputs", "cannot be read as Lark or GBNF"),
    ({"guided_choice": []}, "guided_choice", "choice must be a non-empty list"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs", "exactly one of"),
    ({"guided_regex": "a", "response_format": {"type": "json_object"}}, "guided_regex",
     "response_format and guided_regex each constrain the output"),
])
def test_a_constraint_that_cannot_compile_is_a_400_naming_it_and_the_server_goes_on(server, extra, field, message):
    client = server.client()
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="tiny", prompt="x", max_tokens=5, extra_body=extra)
    error = caught.value.body
    assert re.search(message, error["message"]) and error["param"] == field and "\n" not in error["message"]
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=5,
                                       extra_body=extra)
    assert client.completions.create(model="tiny", prompt="x", max_tokens=3).choices[0].finish_reason == "length"


def test_the_engine_in_its_own_process_answers_as_on_a_thread(server, process_server):
    for extra in ({"guided_json": SCHEMAS[3]}, {"response_format": {"type": "json_object"}},
                  {"structured_outputs": {"regex": "[ab]{2,6}"}}):
        answers = [running.client().completions.create(model="tiny", prompt="same prompt", max_tokens=300,
                                                       temperature=0, extra_body=extra).choices[0].text
                   for running in (server, process_server)]
        assert answers[0] == answers[1]
    with pytest.raises(openai.BadRequestError, match="unclosed group"):
        process_server.client().completions.create(model="tiny", prompt="x", max_tokens=5,
                                                   extra_body={"guided_regex": "(a"})


def test_the_engine_batches_rows_with_different_constraints_each_as_generate_alone(model, monkeypatch):
    configs = [GenerationConfig(max_new_tokens=120, constraint=Constraint.json_schema(SCHEMAS[0])),
               GenerationConfig(max_new_tokens=20),
               GenerationConfig(max_new_tokens=20, constraint=Constraint.regex(r"[xyz]{3,8}")),
               GenerationConfig(max_new_tokens=120, constraint=Constraint.json_object(), do_sample=True, seed=3),
               GenerationConfig(max_new_tokens=10, constraint=Constraint.choice(["north", "south"]))]
    prompts = [model.tokenizer.encode(text) for text in ("first one", "b", "third prompt", "dd", "fifth")]
    engine = Engine(model, model.tokenizer, cache_tokens=4096, block_size=8)
    requests = [engine.submit(prompt, config) for prompt, config in zip(prompts, configs, strict=True)]
    rows_through_the_chooser = []
    rule_call = Constrained.__call__
    monkeypatch.setattr(Constrained, "__call__", lambda rule, scores, *rest: rows_through_the_chooser.append(
        len(scores)) or rule_call(rule, scores, *rest))
    engine.run_until_idle()
    assert engine.stats.steps < sum(config.max_new_tokens for config in configs)  # they shared steps
    # the greedy constrained rows were masked together: only the sampled request's went through its chooser
    assert len(rows_through_the_chooser) == len(requests[3].outputs()[0])
    for request, prompt, config in zip(requests, prompts, configs, strict=True):
        alone = tformer.generate(model, torch.tensor([prompt]), generation_config=config)[0, len(prompt):].tolist()
        if END in alone:
            alone = alone[: alone.index(END) + 1]
        assert request.outputs()[0] == alone

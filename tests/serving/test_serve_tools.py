"""Tool calls through the real ``openai`` client against the server as ``tformer serve`` starts it (its engine in a
process of its own), on a random-weight character model whose chat template reads ``tools``: with
``tool_choice`` "required" or a named function every reply is a call whose arguments validate against the
function's parameters (``jsonschema``); streamed tool-call deltas reassemble to the whole reply's calls; ``auto``
offers the functions through the template (the prompt is the template's rendering with ``tools``) and answers
text that holds no call as plain content; a history with calls and results renders; bad tools and tool choices
are a 400 naming the field, and the server keeps serving."""

import json
import re

import pytest
import torch
from test_serving_server import ServerThread, generated

import tformer
from tformer.generation.constraints import Constraint
from tformer.serving.tool_calls import read_tools, template_messages
from tformer.tokenizers import CharTokenizer
from tformer.tokenizers.chat_template import ChatTemplate

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("llguidance")

pytestmark = pytest.mark.slow  # the openai client against a server with its engine in a process

END = 1  # "<eos>", the character model's end id
# A chat template with tool support of its own, Hermes style as Qwen2.5's: the functions listed in a system turn,
# an assistant's calls as <tool_call> blocks, a tool's result in a tool turn.
TEMPLATE = (
    "{% if tools %}system: call a function as <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call>. "
    "Functions:{% for tool in tools %} {{ tool.function | tojson }}{% endfor %}\n{% endif %}"
    "{% for m in messages %}{{ m.role }}: "
    "{% for call in m.tool_calls or [] %}<tool_call>{\"name\": {{ call.function.name | tojson }}, \"arguments\": "
    "{{ call.function.arguments | tojson }}}</tool_call>{% endfor %}"
    "{{ m.content or '' }}\n{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}"
)
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Today's weather in a city, for some days",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
                                                    "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                   "required": ["city", "days"], "additionalProperties": False}}}
ADD = {"type": "function", "function": {
    "name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "integer", "minimum": -9,
                                                                         "maximum": 9},
                                                                   "b": {"type": "boolean"}},
                                  "required": ["a", "b"], "additionalProperties": False}}}
TOOLS = [WEATHER, ADD]
PARAMETERS = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}
MESSAGES = [{"role": "user", "content": "Weather in Oslo?"}]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tools") / "tiny"
    tokenizer = CharTokenizer([chr(code) for code in range(32, 127)] + ["\n"], special_tokens=["<unk>", "<eos>"])
    torch.manual_seed(0)
    model = tformer.build_model("gpt-nano", vocab_size=tokenizer.vocab_size, max_seq_len=2048, eos_token_id=END)
    model.tokenizer = tokenizer
    model.save(folder)
    (folder / "chat_template.jinja").write_text(TEMPLATE)
    return folder


@pytest.fixture(scope="module")
def server(checkpoint):
    server = ServerThread(checkpoint, "process", cache_tokens=16384, block_size=16)
    yield server
    server.stop()


# Replies in the formats common templates teach, forced on the random model by a regex (so ``auto`` meets a call
# it did not choose): format -> (regex, the content, the calls' names)
FORCED = {
    "hermes": (r'Let me check\.\n<tool_call>\n\{"name": "get_weather", "arguments": \{"city": "(Paris|Rome|Oslo)", '
               r'"days": [1-7]\}\}\n</tool_call>', "Let me check.", ["get_weather"]),
    "llama": (r'\{"name": "add", "parameters": \{"a": -?[0-9], "b": (true|false)\}\}; '
              r'\{"name": "get_weather", "parameters": \{"city": "Rome", "days": [1-7]\}\}', None,
              ["add", "get_weather"]),
    "mistral": (r'\[TOOL_CALLS\] \[\{"name": "add", "arguments": \{"a": [0-9], "b": true\}\}\]', None, ["add"]),
}


@pytest.fixture(scope="module")
def forcing_server(checkpoint):
    """The server with its engine on a thread, each request's decoding held to ``forcing_server.pattern``."""
    server = ServerThread(checkpoint, "thread", cache_tokens=16384, block_size=16)
    submit = server.engine.submit

    def forced(prompt_ids, config=None, **options):
        return submit(prompt_ids, config.replace(constraint=Constraint.regex(server.pattern)), **options)

    server.engine.submit = forced
    yield server
    server.stop()


def valid_calls(choice, allowed=("get_weather", "add")):
    """The choice's calls as (name, arguments), each checked: a function asked for, arguments that validate."""
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    calls = []
    for call in choice.message.tool_calls:
        assert call.type == "function" and call.id.startswith("call_") and call.function.name in allowed
        arguments = json.loads(call.function.arguments)
        jsonschema.validate(arguments, PARAMETERS[call.function.name])
        calls.append((call.function.name, arguments))
    assert calls
    return calls


def streamed_calls(stream):
    """The calls a stream's deltas add up to (as a client reassembles them), its content and finish reason;
    each call's first delta carries its id, type and name, and an empty arguments string."""
    calls, content, finish = {}, "", None
    for chunk in stream:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        finish = choice.finish_reason or finish
        for delta in choice.delta.tool_calls or []:
            if delta.index not in calls:
                assert delta.id.startswith("call_") and delta.type == "function" and delta.function.arguments == ""
                calls[delta.index] = [delta.function.name, ""]
            else:
                assert delta.id is None and delta.function.name is None
                calls[delta.index][1] += delta.function.arguments
    return [(name, json.loads(arguments)) for name, arguments in (calls[index] for index in sorted(calls))], \
        content, finish


@pytest.mark.parametrize("seed", range(6))
def test_required_answers_calls_whose_arguments_validate(server, seed):
    response = server.client().chat.completions.create(
        model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice="required", max_tokens=400, temperature=1.0,
        seed=seed)
    valid_calls(response.choices[0])


def test_each_of_n_choices_is_parsed_on_its_own(server):
    response = server.client().chat.completions.create(
        model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice="required", max_tokens=400, n=3, seed=7)
    assert [choice.index for choice in response.choices] == [0, 1, 2]
    calls = [valid_calls(choice) for choice in response.choices]
    assert len({json.dumps(call) for call in calls}) > 1  # sampled apart: each choice its own reply


@pytest.mark.parametrize("name", ["get_weather", "add"])
def test_a_named_function_is_the_one_call(server, name):
    choice = {"type": "function", "function": {"name": name}}
    for seed in range(3):
        response = server.client().chat.completions.create(
            model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice=choice, max_tokens=200, seed=seed)
        assert len(valid_calls(response.choices[0], allowed=(name,))) == 1


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "add"}}])
def test_streamed_tool_call_deltas_reassemble_to_the_whole_replys_calls(server, tool_choice):
    client = server.client()
    options = dict(model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice=tool_choice, max_tokens=400,
                   temperature=0)
    whole = valid_calls(client.chat.completions.create(**options).choices[0])
    calls, content, finish = streamed_calls(client.chat.completions.create(stream=True, **options))
    assert calls == whole and content == "" and finish == "tool_calls"


def test_auto_offers_the_functions_through_the_template_and_text_stays_content(server):
    client = server.client()
    template = ChatTemplate(TEMPLATE)
    rendered = template.render(MESSAGES, tools=TOOLS)
    assert '"name": "get_weather"' in rendered  # the template listed the functions
    prompt = server.model.tokenizer.encode(rendered, add_special_tokens=False)
    response = client.chat.completions.create(model="tiny", messages=MESSAGES, tools=TOOLS, max_tokens=24,
                                              temperature=0, extra_body={"ignore_eos": True})
    expected = generated(server.model, prompt, max_new_tokens=24)
    assert "<tool_call>" not in expected and not expected.lstrip().startswith("{")  # the model wrote no call
    choice = response.choices[0]
    assert response.usage.prompt_tokens == len(prompt)
    assert choice.message.content == expected and choice.message.tool_calls is None
    assert choice.finish_reason == "length"
    chunks = list(client.chat.completions.create(model="tiny", messages=MESSAGES, tools=TOOLS, max_tokens=24,
                                                 temperature=0, stream=True, extra_body={"ignore_eos": True}))
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks) == expected
    none = client.chat.completions.create(model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice="none",
                                          max_tokens=4)  # the tools are not offered at all
    assert none.usage.prompt_tokens == len(server.model.tokenizer.encode(template.render(MESSAGES),
                                                                         add_special_tokens=False))


@pytest.mark.parametrize("kind", list(FORCED))
def test_auto_reads_a_call_the_model_writes_whole_and_streamed(forcing_server, kind):
    forcing_server.pattern, content, names = FORCED[kind]
    client = forcing_server.client()
    options = dict(model="tiny", messages=MESSAGES, tools=TOOLS, max_tokens=300, temperature=0)
    choice = client.chat.completions.create(**options).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == content
    assert [call.function.name for call in choice.message.tool_calls] == names
    whole = [(call.function.name, json.loads(call.function.arguments)) for call in choice.message.tool_calls]
    for name, arguments in whole:
        jsonschema.validate(arguments, PARAMETERS[name])
    calls, streamed_content, finish = streamed_calls(client.chat.completions.create(stream=True, **options))
    assert calls == whole and streamed_content == (content or "") and finish == "tool_calls"


def test_auto_reads_a_bare_call_that_response_format_holds_the_reply_to(server):
    """Through the engine process, no hook: ``response_format`` makes the reply a call object (Llama 3.1's bare
    form), which ``auto`` reads as a call; beside ``required`` or a named function, which constrain the reply
    themselves, ``response_format`` is a 400."""
    client = server.client()
    call = {"type": "object", "properties": {"name": {"type": "string", "enum": ["add"]},
                                             "parameters": ADD["function"]["parameters"]},
            "required": ["name", "parameters"], "additionalProperties": False}
    response_format = {"type": "json_schema", "json_schema": {"name": "call", "schema": call}}
    choice = client.chat.completions.create(model="tiny", messages=MESSAGES, tools=TOOLS, max_tokens=200, seed=3,
                                            response_format=response_format).choices[0]
    assert valid_calls(choice, allowed=("add",))
    for tool_choice in ("required", {"type": "function", "function": {"name": "add"}}):
        with pytest.raises(openai.BadRequestError, match="response_format constrains it too") as raised:
            client.chat.completions.create(model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice=tool_choice,
                                           response_format={"type": "json_object"})
        assert raised.value.body["param"] == "tool_choice"


def test_a_history_of_calls_and_results_renders(server):
    history = [*MESSAGES,
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "call_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "days": 1}'}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "snow"}]
    response = server.client().chat.completions.create(model="tiny", messages=history, tools=TOOLS,
                                                       tool_choice="required", max_tokens=400, seed=1)
    valid_calls(response.choices[0])
    tools = read_tools(TOOLS, "required", None)
    rendered = ChatTemplate(TEMPLATE).render(template_messages(history, tools, True),
                                             tools=[tool.as_template_input() for tool in tools.tools])
    assert ('assistant: <tool_call>{"name": "get_weather", "arguments": {"city": "Oslo", "days": 1}}</tool_call>\n'
            "tool: snow\n") in rendered
    assert response.usage.prompt_tokens == len(server.model.tokenizer.encode(rendered, add_special_tokens=False))


@pytest.mark.parametrize(("tools", "tool_choice", "message"), [
    ([{"type": "function", "function": {"description": "no name"}}], "auto", "tools[0].function.name is required"),
    (TOOLS, {"type": "function", "function": {"name": "delete_all"}},
     "tool_choice names function 'delete_all', which is not among the tools ('get_weather', 'add')"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": "city"}}}],
     "auto", "tools[0].function.parameters[\"properties\"] is not a valid JSON schema"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "objekt"}}}], "required",
     "tools[0].function.parameters[\"type\"] is not a valid JSON schema"),
])
def test_bad_tools_are_a_400_naming_them_and_the_server_keeps_serving(server, tools, tool_choice, message):
    client = server.client()
    with pytest.raises(openai.BadRequestError, match=re.escape(message)) as raised:
        client.chat.completions.create(model="tiny", messages=MESSAGES, tools=tools, tool_choice=tool_choice)
    assert raised.value.body["param"].startswith(("tools", "tool_choice"))
    response = client.chat.completions.create(model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice="required",
                                              max_tokens=400, seed=0)
    valid_calls(response.choices[0])

"""Tool calls' pieces without a server: ``tools`` / ``tool_choice`` checked (a 400 naming the field), the schema a
constrained call is held to (checked with ``jsonschema``), the history made renderable with and without the
template's own tool support, and the reply parser on the formats common templates teach (Hermes, Llama 3.1's
bare JSON, Mistral's ``[TOOL_CALLS]``), whole and fed in pieces: the deltas reassemble, as a client does it, to
the whole reply."""

import json
import random

import jsonschema
import pytest

from tformer.serving.openai_api import APIError
from tformer.serving.tool_call_parser import ToolCallParser
from tformer.serving.tool_calls import DEFAULT_TOOL_PROMPT, read_tools, template_messages
from tformer.tokenizers.chat_template import ChatTemplate

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}
ADD = {"type": "function", "function": {
    "name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                                  "required": ["a", "b"], "additionalProperties": False}}}
NOW = {"type": "function", "function": {"name": "now"}}  # no parameters


def parsed(text, pieces=None, tool_choice="auto", tools=(WEATHER, ADD, NOW), parallel=None):
    """The whole message, and the deltas the text fed in ``pieces`` (default: whole) hands out."""
    parser = ToolCallParser(read_tools(list(tools), tool_choice, parallel))
    deltas = []
    for piece in pieces or [text]:
        deltas += parser.feed(piece)
    deltas += parser.finish()
    return parser.message(), deltas


def reassembled(deltas):
    """The message a client builds from stream deltas: content appended, each call by its index (id, type and
    name from its first delta, arguments appended)."""
    content, calls = "", {}
    for delta in deltas:
        content += delta.get("content") or ""
        for call in delta.get("tool_calls", []):
            if call["index"] not in calls:
                assert set(call) == {"index", "id", "type", "function"} and call["function"]["arguments"] == ""
                assert call["index"] == len(calls)  # calls open in order
                calls[call["index"]] = {"id": call["id"], "type": call["type"],
                                        "function": {"name": call["function"]["name"], "arguments": ""}}
            else:
                assert set(call) == {"index", "function"} and set(call["function"]) == {"arguments"}
                calls[call["index"]]["function"]["arguments"] += call["function"]["arguments"]
    message = {"role": "assistant", "content": content or (None if calls else "")}
    if calls:
        message["tool_calls"] = [calls[index] for index in sorted(calls)]
    return message


def without_ids(message):
    return {**message, "tool_calls": [{**call, "id": "-"} for call in message.get("tool_calls", [])]} \
        if "tool_calls" in message else message


def calls_of(message):
    return [(call["function"]["name"], json.loads(call["function"]["arguments"]))
            for call in message.get("tool_calls", [])]


REPLIES = {  # text -> (content, [(name, arguments)])
    # Hermes (Qwen2.5): content around the blocks, several blocks, nested values with braces in strings
    'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>':
        ("Let me look.", [("get_weather", {"city": "Paris"})]),
    '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2.5}}\n</tool_call>\n<tool_call>\n'
    '{"name": "get_weather", "arguments": {"city": "Rome {\\"x\\"}", "days": 3}}\n</tool_call>\nDone.':
        ("Done.", [("add", {"a": 1, "b": 2.5}), ("get_weather", {"city": 'Rome {"x"}', "days": 3})]),
    # arguments as a JSON-encoded string, as some models write them
    '<tool_call>{"name": "add", "arguments": "{\\"a\\": 1, \\"b\\": 2}"}</tool_call>':
        (None, [("add", {"a": 1, "b": 2})]),
    # Llama 3.1: bare JSON with "parameters", several separated by ";", after <|python_tag|>
    '{"name": "add", "parameters": {"a": 4, "b": 5}}': (None, [("add", {"a": 4, "b": 5})]),
    '<|python_tag|>{"name": "add", "parameters": {"a": 1, "b": 1}}; {"name": "now", "parameters": {}}':
        (None, [("add", {"a": 1, "b": 1}), ("now", {})]),
    # Mistral: [TOOL_CALLS] and a list
    '[TOOL_CALLS] [{"name": "now", "arguments": {}}, {"name": "add", "arguments": {"a": 0, "b": -1}}]':
        (None, [("now", {}), ("add", {"a": 0, "b": -1})]),
    # a function without arguments written without them
    '<tool_call>{"name": "now"}</tool_call>': (None, [("now", {})]),
    # not calls: a JSON answer, a function not offered, markup that opens nothing, plain text with "<" and "{"
    '{"name": "Bob", "age": 3}': ('{"name": "Bob", "age": 3}', []),
    'I would call <tool_call>{"name": "delete_all", "arguments": {}}</tool_call> but cannot.':
        ('I would call <tool_call>{"name": "delete_all", "arguments": {}}</tool_call> but cannot.', []),
    "a <tool_call> that is not JSON": ("a <tool_call> that is not JSON", []),
    "x < y and {braces} and [TOOL lists] < ": ("x < y and {braces} and [TOOL lists] < ", []),
    "  spaced  ": ("  spaced  ", []),
}


@pytest.mark.parametrize("text", list(REPLIES))
def test_the_parser_reads_the_common_formats_whole_and_in_any_pieces(text):
    content, calls = REPLIES[text]
    whole, deltas = parsed(text)
    assert whole["content"] == content
    assert calls_of(whole) == calls
    assert without_ids(reassembled(deltas)) == without_ids(whole)
    generator = random.Random(len(text))
    for pieces in ([*text], [text[i:i + 3] for i in range(0, len(text), 3)],
                   _random_pieces(text, generator), _random_pieces(text, generator)):
        streamed, deltas = parsed(text, pieces)
        assert without_ids(streamed) == without_ids(whole), pieces
        assert without_ids(reassembled(deltas)) == without_ids(whole), pieces


def _random_pieces(text, generator):
    cuts = sorted(generator.sample(range(1, len(text)), min(len(text) - 1, len(text) // 4)))
    return [text[start:end] for start, end in zip([0, *cuts], [*cuts, len(text)], strict=True)]


def test_a_call_is_handed_out_name_first_then_its_arguments_as_they_are_written():
    parser = ToolCallParser(read_tools([WEATHER], "auto", None))
    assert parser.feed("Sure <tool_") == [{"content": "Sure"}]  # the space and what may be a marker wait
    assert parser.feed('call>{"name": "get_wea') == []
    opened = parser.feed('ther", "arguments": {"ci')
    assert opened[0]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": ""}
    assert opened[1] == {"tool_calls": [{"index": 0, "function": {"arguments": '{"ci'}}]}
    assert parser.feed('ty": "Oslo"}}</tool_call>') == [
        {"tool_calls": [{"index": 0, "function": {"arguments": 'ty": "Oslo"}'}}]}]
    assert parser.finish() == []
    assert calls_of(parser.message()) == [("get_weather", {"city": "Oslo"})] and parser.message()["content"] == "Sure"


def test_a_json_answer_is_content_as_soon_as_it_has_a_key_no_call_has():
    parser = ToolCallParser(read_tools([WEATHER], "auto", None))
    assert parser.feed('{"ans') == []  # may still be a call
    assert parser.feed('wer": 4') == [{"content": '{"answer": 4'}]
    assert parser.feed("2}") == [{"content": "2}"}] and parser.finish() == []
    assert parser.message() == {"role": "assistant", "content": '{"answer": 42}'}


def test_a_reply_cut_inside_a_call_keeps_the_call_as_far_as_it_went():
    whole, _ = parsed('<tool_call>{"name": "add", "arguments": {"a": 1')
    assert whole["tool_calls"][0]["function"] == {"name": "add", "arguments": '{"a": 1'}


def test_parallel_tool_calls_false_hands_out_the_first_call_only():
    text = ('<tool_call>{"name": "now", "arguments": {}}</tool_call>'
            '<tool_call>{"name": "add", "arguments": {}}</tool_call>')
    assert calls_of(parsed(text, parallel=False)[0]) == [("now", {})]
    assert len(parsed(text)[0]["tool_calls"]) == 2


def test_constrained_replies_are_read_from_their_first_character():
    named, _ = parsed('{"name": "add", "arguments": {"a": 1, "b": 2}}', tool_choice={
        "type": "function", "function": {"name": "add"}})
    assert calls_of(named) == [("add", {"a": 1, "b": 2})]
    required, deltas = parsed('[{"name": "now", "arguments": {}}, {"name": "add", "arguments": {"a": 1, "b": 2}}]',
                              tool_choice="required")
    assert calls_of(required) == [("now", {}), ("add", {"a": 1, "b": 2})] and required["content"] is None
    assert without_ids(reassembled(deltas)) == without_ids(required)


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_the_call_schema_admits_exactly_the_calls_asked_for(choice):
    tools = read_tools([WEATHER, ADD, NOW], choice, None)
    schema = tools.call_schema()
    jsonschema.validators.validator_for(schema).check_schema(schema)
    call = {"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}
    good = [call] if choice == "required" else call
    jsonschema.validate(good, schema)
    bad_arguments = {"name": "get_weather", "arguments": {"days": 2}}  # city is required
    other = {"name": "add", "arguments": {"a": 1, "b": 2}}
    for bad in ([bad_arguments], [], [{"name": "nope", "arguments": {}}]) if choice == "required" else (
            bad_arguments, other, [call]):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
    if choice == "required":
        jsonschema.validate([call, other], schema)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate([call, other], read_tools([WEATHER, ADD], "required", False).call_schema())


@pytest.mark.parametrize(("tools", "choice", "param", "message"), [
    ([{"type": "function", "function": {"description": "no name"}}], "auto", "tools[0].function.name",
     "tools[0].function.name is required"),
    ([{"type": "function", "function": {"name": ""}}], "auto", "tools[0].function.name", "is required"),
    ([{"type": "function", "function": {"name": "get weather"}}], "auto", "tools[0].function.name",
     "1 to 64 letters, digits"),
    ([WEATHER, WEATHER], "auto", "tools", "'get_weather' is given twice"),
    ([{"type": "retrieval"}], "auto", "tools[0].type", "only \"function\""),
    ([WEATHER], {"type": "function", "function": {"name": "add"}}, "tool_choice.function.name",
     "names function 'add', which is not among the tools ('get_weather')"),
    ([WEATHER], "sometimes", "tool_choice", "give 'none', 'auto', 'required'"),
    ([WEATHER], {"type": "function"}, "tool_choice", "is not allowed"),
    (None, "required", "tool_choice", "needs tools"),
    ([], "auto", "tools", "tools is empty"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "objekt"}}}], "auto",
     "tools[0].function.parameters", "is not a valid JSON schema"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "required": "city"}}}],
     "auto", "tools[0].function.parameters", "[\"required\"] is not a valid JSON schema"),
    ([{"type": "function", "function": {"name": "f", "parameters": ["city"]}}], "auto",
     "tools[0].function.parameters", "must be a JSON schema (an object)"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}], "auto",
     "tools[0].function.parameters", "\"type\": \"object\""),
    ([{"type": "function", "function": {"name": "f", "strict": True}}], "auto", "tools",
     "strict=true, which tool_choice 'auto' cannot honour"),
    ([{"type": "function", "function": {"name": "f", "returns": {}}}], "auto", "tools[0].function",
     "unknown field(s) returns"),
])
def test_bad_tools_and_tool_choices_are_a_400_naming_the_field(tools, choice, param, message):
    with pytest.raises(APIError) as raised:
        read_tools(tools, choice, None)
    assert raised.value.status == 400 and raised.value.param == param
    assert message in raised.value.message


def test_tool_choice_none_offers_no_tools_and_strict_is_taken_where_decoding_is_constrained():
    assert read_tools([WEATHER], "none", None) is None and read_tools(None, None, None) is None
    strict = {"type": "function", "function": {**WEATHER["function"], "strict": True}}
    assert read_tools([strict], "required", None).tools[0].strict
    assert read_tools([NOW], None, None).choice == "auto"  # tools without tool_choice: auto, as OpenAI's


HISTORY = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function",
                                          "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
]
READS_TOOLS = ("{% if tools %}{% for t in tools %}[{{ t.function.name }}]{% endfor %}\n{% endif %}"
               "{% for m in messages %}{{ m.role }}:"
               "{% for c in m.tool_calls or [] %}{{ c.function.name }}{{ c.function.arguments | tojson }}{% endfor %}"
               "{{ m.content or '' }}\n{% endfor %}")
PLAIN = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"


def test_a_template_that_reads_tools_renders_the_functions_calls_and_results_itself():
    template = ChatTemplate(READS_TOOLS)
    assert template.reads_tools and not ChatTemplate(PLAIN).reads_tools
    tools = read_tools([WEATHER, NOW], "auto", None)
    messages = template_messages(HISTORY, tools, template.reads_tools)
    text = template.render(messages, tools=[tool.as_template_input() for tool in tools.tools])
    assert text == ('[get_weather][now]user:Weather in Paris?\nassistant:get_weather{"city": "Paris"}\n'
                    "tool:sunny\n")


def test_a_template_without_tool_support_gets_the_default_prompt_and_hermes_blocks():
    tools = read_tools([WEATHER], "auto", None)
    messages = template_messages([{"role": "system", "content": "Be brief."}, *HISTORY], tools, False)
    listed = json.dumps(WEATHER, ensure_ascii=False)
    assert messages[0] == {"role": "system", "content": "Be brief.\n\n" + DEFAULT_TOOL_PROMPT.format(tools=listed)}
    assert messages[2] == {"role": "assistant", "content": '<tool_call>\n{"name": "get_weather", "arguments": '
                                                           '{"city": "Paris"}}\n</tool_call>'}
    assert messages[3] == {"role": "user", "content": "<tool_response>\nsunny\n</tool_response>"}
    # a call the default prompt teaches is a call the parser reads
    assert calls_of(parsed(messages[2]["content"])[0]) == [("get_weather", {"city": "Paris"})]
    assert template_messages(HISTORY[:1], tools, False)[0]["role"] == "system"  # put first when there is none
    assert template_messages(HISTORY, None, False)[0] == HISTORY[0]  # no tools offered: no prompt


@pytest.mark.parametrize(("call", "param"), [
    ({"id": "c", "type": "function", "function": {"name": "f", "arguments": "{not json"}},
     "messages[1].tool_calls[0].function.arguments"),
    ({"id": "c", "type": "function", "function": {"name": "f", "arguments": "[1]"}},
     "messages[1].tool_calls[0].function.arguments"),
    ({"id": "c", "type": "function", "function": {"arguments": "{}"}}, "messages[1].tool_calls[0].function.name"),
    ({"id": "c", "type": "code"}, "messages[1].tool_calls[0]"),
])
def test_a_bad_call_in_the_history_is_a_400_naming_it(call, param):
    with pytest.raises(APIError) as raised:
        template_messages([HISTORY[0], {"role": "assistant", "tool_calls": [call]}], None, True)
    assert raised.value.status == 400 and raised.value.param == param


# Templates with tool support of their own, in the three families' styles (written for these tests): Qwen2.5's
# Hermes blocks, Llama 3.1's bare JSON with "parameters" (results in an "ipython" turn), Mistral's [TOOL_CALLS] list.
HERMES_TEMPLATE = """{%- if tools %}<|im_start|>system
{{ messages[0].content if messages[0].role == 'system' else 'You are a helpful assistant.' }}

<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools>
Call a function as <tool_call>{"name": NAME, "arguments": ARGUMENTS}</tool_call><|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'assistant' %}<|im_start|>assistant
{{ message.content or '' }}
{%- for tool_call in message.tool_calls or [] %}
{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}
<tool_call>
{"name": "{{ tool_call.name }}", "arguments": {{ tool_call.arguments | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{% elif message.role == 'tool' %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% elif not (message.role == 'system' and tools) %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""
LLAMA_TEMPLATE = (
    "{%- for message in messages %}\n"
    "{%- if message.role == 'user' and loop.first and tools %}<|start_header_id|>user<|end_header_id|>\n\n"
    'Respond with {"name": function name, "parameters": its arguments} for one of:\n'
    "{% for tool in tools %}{{ tool | tojson(indent=4) }}\n{% endfor %}{{ message.content }}<|eot_id|>\n"
    "{%- elif message.tool_calls %}<|start_header_id|>assistant<|end_header_id|>\n\n"
    '{% for call in message.tool_calls %}{"name": "{{ call.function.name }}", '
    '"parameters": {{ call.function.arguments | tojson }}}{% endfor %}<|eot_id|>\n'
    "{%- elif message.role == 'tool' %}<|start_header_id|>ipython<|end_header_id|>\n\n"
    "{{ message.content | tojson }}<|eot_id|>\n"
    "{%- else %}<|start_header_id|>{{ message.role }}<|end_header_id|>\n\n{{ message.content }}<|eot_id|>\n"
    "{%- endif %}\n{%- endfor %}\n"
    "{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")
MISTRAL_TEMPLATE = (
    "{%- for message in messages %}\n"
    "{%- if message.role == 'user' %}"
    "{% if loop.first and tools %}[AVAILABLE_TOOLS] {{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}"
    "[INST] {{ message.content }}[/INST]\n"
    "{%- elif message.tool_calls %}[TOOL_CALLS] [{% for call in message.tool_calls %}"
    '{"name": {{ call.function.name | tojson }}, "arguments": {{ call.function.arguments | tojson }}, '
    '"id": {{ call.id | tojson }}}{% if not loop.last %}, {% endif %}{% endfor %}]</s>\n'
    "{%- elif message.role == 'tool' %}"
    '[TOOL_RESULTS] {"content": {{ message.content | tojson }}, "call_id": {{ message.tool_call_id | tojson }}}'
    "[/TOOL_RESULTS]\n"
    "{%- else %}{{ message.content }}</s>\n{%- endif %}\n{%- endfor %}")
FAMILY_TEMPLATES = {"hermes": (HERMES_TEMPLATE, "<|im_end|>\n"), "llama": (LLAMA_TEMPLATE, "<|eot_id|>"),
                    "mistral": (MISTRAL_TEMPLATE, "</s>")}  # template, what ends the assistant's turn


@pytest.mark.parametrize("family", list(FAMILY_TEMPLATES))
def test_tools_and_a_call_history_render_as_transformers_renders_them_and_the_calls_parse_back(family):
    transformers = pytest.importorskip("transformers")
    hf = pytest.importorskip("tokenizers")
    source, end_of_turn = FAMILY_TEMPLATES[family]
    hf_tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=hf.Tokenizer(hf.models.WordLevel({"<unk>": 0}, unk_token="<unk>")))
    template = ChatTemplate(source)
    assert template.reads_tools
    tools = read_tools([WEATHER, NOW], "auto", None)
    offered = [tool.as_template_input() for tool in tools.tools]
    assert offered == [WEATHER, NOW]  # as the request sent them
    for messages in (HISTORY[:1], HISTORY):
        ours = template.render(template_messages(messages, tools, True), tools=offered)
        # transformers' templates read a call's arguments as an object
        theirs_messages = [{**message, "tool_calls": [{**call, "function": {**call["function"], "arguments": json.loads(
            call["function"]["arguments"])}} for call in message["tool_calls"]]} if "tool_calls" in message
            else message for message in messages]
        assert ours == hf_tokenizer.apply_chat_template(theirs_messages, tools=[WEATHER, NOW], chat_template=source,
                                                        tokenize=False, add_generation_prompt=True)
    # the assistant's turn, as the template writes a call, reads back as that call
    before = template.render(template_messages(HISTORY[:1], tools, True), tools=offered)
    with_call = template.render(template_messages(HISTORY[:2], tools, True), tools=offered,
                                add_generation_prompt=False)
    assert with_call.startswith(before)  # the generation prompt opens the turn the call is written in
    reply = with_call[len(before):].removesuffix(end_of_turn)
    assert calls_of(parsed(reply)[0]) == [("get_weather", {"city": "Paris"})], reply

"""Tool calls in chat completions: a request's ``tools`` and ``tool_choice`` checked (a 400 naming the field),
the functions put before the model (the chat template's own ``tools`` variable where it reads one, else
``DEFAULT_TOOL_PROMPT`` in the system message), the history's assistant ``tool_calls`` and ``tool`` results made
renderable, the JSON schema that ``required`` or a named function constrains decoding to, and the reply parsed
back into OpenAI's ``tool_calls``, whole or as stream deltas, by one incremental parser (``tool_call_parser.py``, so
a stream reassembles to the whole reply).

The parser reads the formats common templates teach: Hermes' ``<tool_call>{"name": ..., "arguments": {...}}
</tool_call>`` (Qwen2.5), Mistral's ``[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]``, Llama 3.1's bare
``{"name": ..., "parameters": {...}}`` at the start of the reply (after an optional ``<|python_tag|>``, several
separated by ``;``), and under a constraint the reply itself (one call object, or an array of them). A call counts
when its ``name`` is one of the request's functions; its ``arguments`` are the model's own text of that value (a
JSON-encoded string is decoded), as OpenAI gives them: valid JSON when the call is complete. Markup around a call
that does not count (another name, no name, not JSON) stays in the content as the model wrote it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from tformer.serving.openai_api import APIError

FUNCTION_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for a function's name
EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}
HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
MISTRAL_OPEN = "[TOOL_CALLS]"
PYTHON_TAG = "<|python_tag|>"
MARKERS = (HERMES_OPEN, MISTRAL_OPEN, PYTHON_TAG)
CALL_KEYS = frozenset({"name", "arguments", "parameters", "id"})  # what a call object holds (Mistral's "id" too)

# What a template without tool support gets: this text and each function's JSON in the system message.
DEFAULT_TOOL_PROMPT = (
    "You can call functions to answer. The functions, one JSON object per line between <tools> and </tools>:\n"
    "<tools>\n{tools}\n</tools>\n"
    "To call a function, write a JSON object with its name and its arguments between <tool_call> and "
    "</tool_call>, one call per block:\n"
    '<tool_call>\n{{"name": "<function name>", "arguments": {{<arguments as JSON>}}}}\n</tool_call>'
)
TOOL_RESULT = "<tool_response>\n{content}\n</tool_response>"  # a tool's result, for a template without tool support


@dataclass(frozen=True)
class Tool:
    """One function a request offers."""

    name: str
    description: str | None
    parameters: dict[str, Any]  # a JSON schema of an object; EMPTY_PARAMETERS when the request gave none
    strict: bool = False
    given: dict[str, Any] = field(default_factory=dict, compare=False)  # the request's object, as sent

    def as_template_input(self) -> dict[str, Any]:
        """The tool as the request sent it (OpenAI's ``{"type": "function", "function": {...}}``), which is what
        ``transformers``' ``apply_chat_template(tools=...)`` hands a template (``tool.function.name``, ...)."""
        return self.given


@dataclass(frozen=True)
class ToolRequest:
    """A chat request's tools and what it asks of them: ``choice`` "auto", "required", or a function's name
    (``named``); "none" is no ToolRequest at all (the model sees no tools)."""

    tools: tuple[Tool, ...]
    choice: Literal["auto", "required", "named"]
    named: str | None = None
    parallel: bool = True  # False: at most one call (required: the schema allows one; auto: the first is kept)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(tool.name for tool in self.tools)

    @property
    def constrained(self) -> bool:
        """Whether decoding is held to ``call_schema`` (``required`` or a named function)."""
        return self.choice != "auto"

    def call_schema(self) -> dict[str, Any]:
        """The JSON schema the reply is constrained to: one call object for a named function, an array of calls
        (one at least; one at most without ``parallel``) for ``required``. A call's ``name`` is an enum of one, its
        ``arguments`` the function's parameters."""
        if self.choice == "named":
            return _call_object(next(tool for tool in self.tools if tool.name == self.named))
        calls = [_call_object(tool) for tool in self.tools]
        schema: dict[str, Any] = {"type": "array", "items": calls[0] if len(calls) == 1 else {"anyOf": calls},
                                  "minItems": 1}
        if not self.parallel:
            schema["maxItems"] = 1
        return schema


def _call_object(tool: Tool) -> dict[str, Any]:
    return {"type": "object", "properties": {"name": {"type": "string", "enum": [tool.name]},
                                             "arguments": tool.parameters},
            "required": ["name", "arguments"], "additionalProperties": False}


# ---- the request's fields ------------------------------------------------------------------------------


def read_tools(tools: list[dict[str, Any]] | None, tool_choice: str | dict[str, Any] | None,
               parallel_tool_calls: bool | None) -> ToolRequest | None:
    """The request's ``tools``, ``tool_choice`` and ``parallel_tool_calls`` checked: a 400 naming the field for a
    tool that is not a function, a function with no name or a name OpenAI does not allow, a name given twice,
    parameters that are not a JSON schema of an object, ``strict`` where decoding is not constrained, a
    ``tool_choice`` that is not one of "none", "auto", "required" or a function offered. None: no tools offered
    (none given, or ``tool_choice`` "none")."""
    choice, named = _read_choice(tool_choice)
    if not tools:
        if tools is not None and choice not in (None, "none"):
            raise APIError(400, "tools is empty: tool_choice needs at least one tool", "tools")
        if choice not in (None, "none"):
            raise APIError(400, f"tool_choice {_shown_choice(tool_choice)} needs tools (none given)", "tool_choice")
        return None
    read = tuple(_read_tool(index, tool) for index, tool in enumerate(tools))
    names = [tool.name for tool in read]
    twice = next((name for index, name in enumerate(names) if name in names[:index]), None)
    if twice is not None:
        raise APIError(400, f"tools: function name {twice!r} is given twice; each tool needs its own name", "tools")
    if choice == "none":
        return None
    if named is not None and named not in names:
        raise APIError(400, f"tool_choice names function {named!r}, which is not among the tools "
                            f"({', '.join(repr(name) for name in names)})", "tool_choice.function.name")
    request = ToolRequest(read, "named" if named is not None else (choice or "auto"), named,
                          parallel=parallel_tool_calls is not False)
    strict = next((tool.name for tool in read if tool.strict), None)
    if strict is not None and not request.constrained:
        raise APIError(400, f"function {strict!r} has strict=true, which tool_choice 'auto' cannot honour (the "
                            "arguments are held to the schema only with tool_choice 'required' or a named "
                            "function); drop strict or choose one of those", "tools")
    return request


def _read_choice(tool_choice: str | dict[str, Any] | None) -> tuple[str | None, str | None]:
    """(choice, the named function's name) of a ``tool_choice``; a 400 for anything else."""
    if tool_choice is None or tool_choice in ("none", "auto", "required"):
        return tool_choice, None
    if isinstance(tool_choice, dict):
        function = tool_choice.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if (tool_choice.get("type") == "function" and set(tool_choice) == {"type", "function"}
                and set(function) == {"name"} and isinstance(name, str) and name):
            return "named", name
    raise APIError(400, f"tool_choice {_shown_choice(tool_choice)} is not allowed: give 'none', 'auto', 'required' "
                        "or {\"type\": \"function\", \"function\": {\"name\": NAME}}", "tool_choice")


def _shown_choice(tool_choice: Any) -> str:
    return json.dumps(tool_choice)[:120]


def _read_tool(index: int, tool: Any) -> Tool:
    where = f"tools[{index}]"
    if not isinstance(tool, dict) or tool.get("type") != "function":
        kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
        raise APIError(400, f"{where}: tools of type {json.dumps(kind)} are not supported (only \"function\", "
                            "as {\"type\": \"function\", \"function\": {\"name\": ...}})", f"{where}.type")
    unknown = sorted(set(tool) - {"type", "function"})
    if unknown:
        raise APIError(400, f"{where}: unknown field(s) {', '.join(unknown)}; known: type, function", where)
    function = tool.get("function")
    if not isinstance(function, dict):
        raise APIError(400, f"{where}.function is required: an object with name, description, parameters",
                       f"{where}.function")
    unknown = sorted(set(function) - {"name", "description", "parameters", "strict"})
    if unknown:
        raise APIError(400, f"{where}.function: unknown field(s) {', '.join(unknown)}; known: name, description, "
                            "parameters, strict", f"{where}.function")
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise APIError(400, f"{where}.function.name is required (a function has a name)", f"{where}.function.name")
    if not FUNCTION_NAME.match(name):
        raise APIError(400, f"{where}.function.name {name!r} is not allowed: 1 to 64 letters, digits, '_' or '-'",
                       f"{where}.function.name")
    description = function.get("description")
    if description is not None and not isinstance(description, str):
        raise APIError(400, f"{where}.function.description must be a string", f"{where}.function.description")
    strict = function.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise APIError(400, f"{where}.function.strict must be true or false", f"{where}.function.strict")
    parameters = function.get("parameters")
    if parameters is None:
        parameters = EMPTY_PARAMETERS
    else:
        check_parameters(parameters, f"{where}.function.parameters")
    return Tool(name, description, parameters, bool(strict), given=tool)


def check_parameters(parameters: Any, where: str) -> None:
    """A 400 naming ``where`` unless ``parameters`` is a JSON schema (checked against its draft's meta-schema by
    ``jsonschema``) of an object (``"type": "object"``: a call's arguments are one)."""
    if not isinstance(parameters, dict):
        raise APIError(400, f"{where} must be a JSON schema (an object), not {json.dumps(parameters)[:80]}", where)
    try:
        import jsonschema
    except ImportError:  # pragma: no cover - jsonschema comes with the serve extra
        raise APIError(400, f"{where}: cannot check a JSON schema without the jsonschema package "
                            "(pip install jsonschema)", where) from None
    try:
        jsonschema.validators.validator_for(parameters).check_schema(parameters)
    except jsonschema.SchemaError as error:
        path = "".join(f"[{json.dumps(part)}]" for part in error.absolute_path)
        raise APIError(400, f"{where}{path} is not a valid JSON schema: {error.message}", where) from None
    if parameters.get("type") != "object":
        raise APIError(400, f"{where} must be a JSON schema with \"type\": \"object\" (a call's arguments are an "
                            f"object), got \"type\": {json.dumps(parameters.get('type'))}", where)


# ---- what the template renders ---------------------------------------------------------------------------


def template_messages(messages: list[dict[str, Any]], tools: ToolRequest | None,
                      template_reads_tools: bool) -> list[dict[str, Any]]:
    """``messages`` (as ``ChatMessage.as_template_input`` gives them) made ready for the template. Assistant
    ``tool_calls`` are checked (a 400 naming the message) and their arguments parsed into objects, as templates
    write them with ``tojson``. A template that reads ``tools`` renders calls, results and the functions itself;
    for one that does not (``template_reads_tools`` False), the functions go into the system message
    (``DEFAULT_TOOL_PROMPT``; a system message is put first if there is none), each call into its assistant
    message's text as a ``<tool_call>`` block, and each ``tool`` result into a user message as a
    ``<tool_response>`` block."""
    prepared = []
    for index, message in enumerate(messages):
        message = dict(message)
        if "tool_calls" in message:
            calls = _history_calls(index, message["tool_calls"], message.get("role"))
            message["tool_calls"] = calls
            if not template_reads_tools:
                blocks = [f"{HERMES_OPEN}\n{json.dumps(call['function'], ensure_ascii=False)}\n{HERMES_CLOSE}"
                          for call in calls]
                message["content"] = "\n".join(([message["content"]] if message.get("content") else []) + blocks)
                del message["tool_calls"]
        if message.get("role") == "tool" and not template_reads_tools:
            message = {"role": "user", "content": TOOL_RESULT.format(content=message.get("content", ""))}
        prepared.append(message)
    if tools is not None and not template_reads_tools:
        listed = "\n".join(json.dumps(tool.as_template_input(), ensure_ascii=False) for tool in tools.tools)
        prompt = DEFAULT_TOOL_PROMPT.format(tools=listed)
        if prepared and prepared[0].get("role") == "system":
            prepared[0] = {**prepared[0], "content": f"{prepared[0].get('content') or ''}\n\n{prompt}".lstrip()}
        else:
            prepared.insert(0, {"role": "system", "content": prompt})
    return prepared


def _history_calls(index: int, calls: Any, role: Any) -> list[dict[str, Any]]:
    """An assistant message's ``tool_calls`` checked, each call's arguments (a JSON string) as an object."""
    where = f"messages[{index}].tool_calls"
    if role != "assistant":
        raise APIError(400, f"{where}: only an assistant message carries tool_calls (this one is {role!r})", where)
    if not isinstance(calls, list):
        raise APIError(400, f"{where} must be a list of calls", where)
    read = []
    for number, call in enumerate(calls):
        place = f"{where}[{number}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or call.get("type", "function") != "function":
            raise APIError(400, f"{place} must be {{\"id\": ..., \"type\": \"function\", \"function\": "
                                "{\"name\": ..., \"arguments\": ...}}", place)
        name, arguments = function.get("name"), function.get("arguments")
        if not isinstance(name, str) or not name:
            raise APIError(400, f"{place}.function.name is required", f"{place}.function.name")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError as error:
                raise APIError(400, f"{place}.function.arguments is not JSON: {error}",
                               f"{place}.function.arguments") from None
        if not isinstance(arguments, dict):
            raise APIError(400, f"{place}.function.arguments must be a JSON object (as a string)",
                           f"{place}.function.arguments")
        read.append({**call, "type": "function", "function": {"name": name, "arguments": arguments}})
    return read

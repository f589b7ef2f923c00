"""The reply of a chat completion with tools read back into OpenAI's ``tool_calls``, whole or as stream deltas, by
one incremental parser (so a stream reassembles to the whole reply): the formats and rules are ``tool_calls.py``'s
docstring's.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from tformer.serving.tool_calls import (
    CALL_KEYS,
    HERMES_CLOSE,
    HERMES_OPEN,
    MARKERS,
    MISTRAL_OPEN,
    PYTHON_TAG,
    ToolRequest,
)

# Where a scan stands between calls: the reply's start (a bare call may open it), plain text (calls open at a
# marker), after a bare call (``;`` or ``,`` then another may follow), inside an array of calls, after a
# ``<tool_call>`` block's object (its closing tag may follow).
_Mode = Literal["start", "text", "sequence", "array", "hermes_close"]


@dataclass
class _Call:
    """One call found in the reply so far."""

    name: str | None = None  # once its string is complete
    arguments: str = ""  # the model's text of the value so far (whole once ``done``)
    done: bool = False  # its object is closed


@dataclass(frozen=True)
class _Segment:
    content: str | None = None  # text of the content
    call: _Call | None = None


@dataclass(frozen=True)
class _Settled:
    """What the reply is up to ``position``, which no later text changes: its segments, and the mode there."""

    segments: tuple[_Segment, ...] = ()
    position: int = 0
    mode: _Mode = "start"


class ToolCallParser:
    """The reply of one choice, fed piece by piece (``feed``, then ``finish``), turned into OpenAI's deltas:
    ``{"content": ...}`` and ``{"tool_calls": [{"index", "id", "type", "function": {"name", "arguments"}}]}``
    (a call's name first, with ``arguments`` "", then argument fragments as they are written). ``message`` is what
    the deltas add up to, so a whole reply fed in the stream's pieces is the stream reassembled.

    Content is the text outside calls, without the whitespace that touches a call; trailing whitespace is held
    until what follows it is known. With ``parallel`` False only the first call is handed out."""

    def __init__(self, tools: ToolRequest) -> None:
        self.names = frozenset(tools.names)
        self.parallel = tools.parallel
        self.text = ""
        self.settled = _Settled(mode="start")
        self.constrained = tools.constrained
        self.content = ""  # the content handed out
        self.calls: list[dict[str, str]] = []  # the calls handed out: id, name, the arguments sent

    def feed(self, text: str) -> list[dict[str, Any]]:
        """The deltas the reply's next piece, ``text``, lets out."""
        self.text += text
        return self._deltas(final=False)

    def finish(self) -> list[dict[str, Any]]:
        """The deltas still held back, the reply having ended."""
        return self._deltas(final=True)

    @property
    def has_calls(self) -> bool:
        return bool(self.calls)

    def message(self) -> dict[str, Any]:
        """The assistant message the deltas handed out add up to: ``content`` (None when empty beside calls), and
        ``tool_calls`` when there are any."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.calls:
            message["content"] = self.content or None
            message["tool_calls"] = [{"id": call["id"], "type": "function",
                                      "function": {"name": call["name"], "arguments": call["arguments"]}}
                                     for call in self.calls]
        return message

    def _deltas(self, final: bool) -> list[dict[str, Any]]:
        self.settled, pending = _scan(self.text, self.settled, self.names, final, self.constrained)
        segments = (*self.settled.segments, *pending)
        content = _joined_content(segments)
        if not final:
            content = content.rstrip()
        deltas: list[dict[str, Any]] = []
        if len(content) > len(self.content):
            deltas.append({"content": content[len(self.content):]})
            self.content = content
        calls = [segment.call for segment in segments if segment.call is not None]
        for index, call in enumerate(calls[: None if self.parallel else 1]):
            if index == len(self.calls):
                self.calls.append({"id": f"call_{uuid.uuid4().hex[:24]}", "name": call.name, "arguments": ""})
                deltas.append({"tool_calls": [{"index": index, "id": self.calls[index]["id"], "type": "function",
                                               "function": {"name": call.name, "arguments": ""}}]})
            sent = self.calls[index]
            arguments = _arguments(call, final)
            if len(arguments) > len(sent["arguments"]) and arguments.startswith(sent["arguments"]):
                deltas.append({"tool_calls": [{"index": index,
                                               "function": {"arguments": arguments[len(sent["arguments"]):]}}]})
                sent["arguments"] = arguments
        return deltas


def _arguments(call: _Call, final: bool) -> str:
    """A call's arguments as handed out: the value's text as written so far (an object or array), a JSON-encoded
    string decoded once whole, ``{}`` for a closed call without any."""
    raw = call.arguments
    if not raw:
        return "{}" if call.done else ""
    if raw[0] in "{[":
        return raw
    if raw[0] == '"' and (call.done or final):
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            return raw
        return value if isinstance(value, str) else raw
    return raw if (call.done or final) else ""


def _joined_content(segments: tuple[_Segment, ...]) -> str:
    """The content of ``segments``, each run between calls joined, the whitespace that touches a call dropped."""
    runs: list[list] = []  # [text, follows a call, precedes a call]
    for segment in segments:
        if segment.call is not None:
            if runs and runs[-1][0] is not None:
                runs[-1][2] = True
            runs.append([None, True, False])
        elif runs and runs[-1][0] is not None:
            runs[-1][0] += segment.content
        else:
            runs.append([segment.content, bool(runs), False])
    pieces = []
    for run, after_call, before_call in runs:
        if run is not None:
            run = run.lstrip() if after_call else run
            pieces.append(run.rstrip() if before_call else run)
    return "".join(pieces)


def _scan(text: str, settled: _Settled, names: frozenset[str], final: bool, constrained: bool
          ) -> tuple[_Settled, list[_Segment]]:
    """``text`` read on from ``settled``: what is now settled, and the segments still open (a call being written
    whose name is known). Not ``final``: text that may yet begin a call is held back (in neither)."""
    segments, position, mode = list(settled.segments), settled.position, settled.mode

    def state() -> _Settled:
        return _Settled(tuple(segments), position, mode)

    def content(end: int) -> None:
        nonlocal position
        if end > position:
            segments.append(_Segment(content=text[position:end]))
        position = end

    while True:
        if mode == "hermes_close":
            start = _skip_space(text, position)
            if text.startswith(HERMES_CLOSE, start):
                position, mode = start + len(HERMES_CLOSE), "text"
            elif not final and HERMES_CLOSE.startswith(text[start:]):
                return state(), []  # the closing tag may be coming
            else:
                mode = "text"
            continue
        if mode in ("start", "sequence", "array"):
            start = _skip_space(text, position)
            if mode == "sequence" and start < len(text) and text[start] in ";,":
                start = _skip_space(text, start + 1)
            if mode == "array" and start < len(text) and text[start] in ",]":
                position, mode = start + 1, ("array" if text[start] == "," else "text")
                continue
            if start == len(text):
                if not final:
                    return state(), []  # only whitespace so far: a call may still begin
                mode = "text"
                continue
            if text[start] == "[" and mode == "start" and constrained:
                position, mode = start + 1, "array"
                continue
            if text[start] != "{":
                mode = "text"
                continue
            call, end, status = _call_at(text, start, names, final)
            if status == "open":
                return state(), ([_Segment(call=call)] if call.name is not None else [])
            if status == "call":
                segments.append(_Segment(call=call))
                position, mode = end, ("array" if mode == "array" else "sequence")
                continue
            content(start)  # not a call: its text is content, read as plain text
            mode = "text"
            continue
        # mode "text": content up to the next marker
        marker_at, marker = _next_marker(text, position)
        if marker is None:
            content(len(text) if final else len(text) - _marker_prefix_length(text, position))
            return state(), []
        content(marker_at)
        start = _skip_space(text, marker_at + len(marker))
        if start == len(text) and not final:
            return state(), []  # what follows the marker decides
        if marker == PYTHON_TAG or (marker == MISTRAL_OPEN and start < len(text) and text[start] in "[{"):
            if marker == MISTRAL_OPEN and text[start] == "[":
                position, mode = start + 1, "array"
            else:
                position, mode = start, "sequence"
            continue
        if marker == HERMES_OPEN and start < len(text) and text[start] == "{":
            call, end, status = _call_at(text, start, names, final)
            if status == "open":
                return state(), ([_Segment(call=call)] if call.name is not None else [])
            if status == "call":
                segments.append(_Segment(call=call))
                position, mode = end, "hermes_close"
                continue
        content(marker_at + len(marker))  # a marker that opens no call is content


def _call_at(text: str, start: int, names: frozenset[str], final: bool) -> tuple[_Call, int, str]:
    """The call object at ``start`` (``{``): (the call, its end, "call" | "open" | "not"). A call counts once its
    name is one of ``names``; an object cut by the reply's end counts only then (``final``)."""
    fields, end, broken = _object_fields(text, start)
    call = _Call(done=broken)
    if "name" in fields and fields["name"][1] is not None:
        try:
            name = json.loads(text[fields["name"][0]:fields["name"][1]])
        except json.JSONDecodeError:
            name = None
        if not isinstance(name, str) or name not in names:
            return call, start, "not"
        call.name = name
    key = "arguments" if "arguments" in fields else ("parameters" if "parameters" in fields else None)
    if key is not None:
        value_start, value_end = fields[key]
        call.arguments = text[value_start: (end if broken else len(text)) if value_end is None else value_end]
    if call.name is None and not fields.keys() <= CALL_KEYS:
        return call, start, "not"  # a key no call has: a JSON answer, content from here on
    if broken:  # a call whose name was out stays one, as far as it went; the rest is text
        return call, end, ("call" if call.name is not None else "not")
    if end is None:
        if final:
            return call, len(text), ("call" if call.name is not None else "not")
        return call, start, "open"
    call.done = True
    return call, end, ("call" if call.name is not None else "not")


def _skip_space(text: str, position: int) -> int:
    while position < len(text) and text[position].isspace():
        position += 1
    return position


def _next_marker(text: str, position: int) -> tuple[int, str | None]:
    found = [(at, marker) for marker in MARKERS if (at := text.find(marker, position)) >= 0]
    return min(found) if found else (-1, None)


def _marker_prefix_length(text: str, position: int) -> int:
    """How many characters at the end of ``text`` (from ``position`` on) could begin a marker."""
    room = len(text) - position
    return max((length for marker in MARKERS for length in range(1, min(len(marker), room + 1))
                if text.endswith(marker[:length])), default=0)


def _object_fields(text: str, start: int) -> tuple[dict[str, tuple[int, int | None]], int | None, bool]:
    """The top-level fields of the JSON object at ``start``: key -> (where its value starts, where it ends or None
    while open); where the object ends (None while open; where it breaks, if broken); whether it is broken (no
    JSON object goes on so)."""
    fields: dict[str, tuple[int, int | None]] = {}
    depth, in_string, escape = 0, False, False
    expecting = "key"  # at depth 1: key, key_end, colon, value, in_value, after
    key, key_start, value_start, container = "", start, start, False
    for position in range(start, len(text)):
        char = text[position]
        if in_string:
            if escape:
                escape = False
            elif char == "\\":
                escape = True
            elif char == '"':
                in_string = False
                if depth == 1 and expecting == "key_end":
                    try:
                        key, expecting = json.loads(text[key_start:position + 1]), "colon"
                    except json.JSONDecodeError:
                        return fields, key_start, True
                elif depth == 1 and expecting == "in_value" and not container:
                    fields[key], expecting = (value_start, position + 1), "after"
            continue
        if position == start:
            if char != "{":
                return fields, position, True
            depth = 1
            continue
        if depth > 1:
            if char == '"':
                in_string = True
            elif char in "{[":
                depth += 1
            elif char in "}]":
                depth -= 1
                if depth == 1:
                    fields[key], expecting = (value_start, position + 1), "after"
            continue
        # depth 1: the object's own fields
        if char.isspace():
            if expecting == "in_value" and not container:  # a number or word ends at its first space
                fields[key], expecting = (value_start, position), "after"
            continue
        if expecting == "key" and char == '"':
            key_start, expecting, in_string = position, "key_end", True
        elif expecting == "colon" and char == ":":
            expecting = "value"
        elif expecting == "value" and (char in '{["-' or char.isalnum()):
            value_start, container, expecting = position, char in "{[", "in_value"
            fields[key] = (value_start, None)
            if char in "{[":
                depth += 1
            elif char == '"':
                in_string = True
        elif expecting in ("after", "in_value") and char in ",}":
            if expecting == "in_value":
                fields[key] = (value_start, position)
            if char == "}":
                return fields, position + 1, False
            expecting = "key"
        elif expecting == "key" and char == "}" and not fields:
            return fields, position + 1, False
        elif expecting != "in_value":
            return fields, position, True
    return fields, None, False

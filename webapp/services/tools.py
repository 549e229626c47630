"""Tools a chat may call (OpenAI's ``tools`` and ``tool_choice``), for models that only complete text.

The tools are shown to the model as a system turn before the conversation: each one's name, description and
parameters, and how to call one (an answer that is one JSON object, ``{"name": …, "arguments": {…}}``). Then:

- ``tool_choice`` "required", or a named tool: the answer is held to that form by guided decoding (the engines'
  ``guide``): a JSON object whose name is one of the tools (the named one) and whose arguments are of its schema;
- "auto": the model answers freely; an answer that is such a call is read as one, anything else is its content;
- "none": the tools are not shown, and the answer is content.

An answer read as a call becomes OpenAI's ``tool_calls`` (the arguments as JSON text), with finish_reason
"tool_calls". A conversation carries calls on: an assistant turn's ``tool_calls`` are written as the call the model
wrote, a ``tool`` turn's content as the tool's answer.
"""
import json
import uuid
from dataclasses import dataclass

CALL_FORM = '{"name": <the tool\'s name>, "arguments": {<its parameters>}}'


@dataclass(frozen=True)
class Tools:
    functions: tuple[dict, ...]  # OpenAI's function objects: name, description, parameters
    choice: str                  # "none", "auto", "required", or the name of the one tool to call

    @property
    def shown(self) -> bool:
        return bool(self.functions) and self.choice != "none"

    @property
    def forced(self) -> bool:
        return self.shown and self.choice != "auto"

    def turn(self) -> str:
        """The system turn that shows the tools to the model."""
        listed = [{"name": f["name"], "description": f.get("description", ""),
                   "parameters": f.get("parameters", {"type": "object"})} for f in self.functions]
        return (f"You can call these tools: {json.dumps(listed)}. To call one, answer with one JSON object, "
                f"{CALL_FORM}, and nothing else.")

    def guide(self) -> str | None:
        """The guide that holds a forced answer to a call (None where the model may answer freely)."""
        if not self.forced:
            return None
        allowed = [f for f in self.functions if self.choice == "required" or f["name"] == self.choice]
        calls = [{"type": "object", "properties": {"name": {"const": f["name"]},
                                                   "arguments": f.get("parameters", {"type": "object"})},
                  "required": ["name", "arguments"], "additionalProperties": False} for f in allowed]
        return json.dumps({"json_schema": calls[0] if len(calls) == 1 else {"anyOf": calls}})

    def calls(self, text: str) -> list[dict] | None:
        """OpenAI's tool_calls where ``text`` is a call of one of the tools; None where it is content."""
        if not self.shown:
            return None
        try:
            call = json.loads(text.strip())
        except ValueError:
            return None
        names = {f["name"] for f in self.functions}
        if not (isinstance(call, dict) and set(call) == {"name", "arguments"} and call["name"] in names
                and isinstance(call["arguments"], dict)):
            return None
        return [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                 "function": {"name": call["name"], "arguments": json.dumps(call["arguments"])}}]


def written_calls(tool_calls: list[dict]) -> str:
    """An assistant turn's tool_calls as the model writes calls: one JSON object a line."""
    lines = []
    for call in tool_calls:
        function = call["function"]
        try:
            arguments = json.loads(function["arguments"])
        except ValueError:
            arguments = function["arguments"]
        lines.append(json.dumps({"name": function["name"], "arguments": arguments}))
    return "\n".join(lines)

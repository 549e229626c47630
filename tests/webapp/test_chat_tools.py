"""Tools a chat may call, for models that only complete text (webapp.services.tools): shown to the model, forced
by a guide, and read back from its answer as OpenAI's tool_calls."""
import json

import jsonschema

from webapp.services.chat import chat_prompt
from webapp.services.tools import Tools

WEATHER = {"name": "weather", "description": "Today's weather.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
TIME = {"name": "time"}  # no parameters: any object


def test_a_forced_call_is_guided_to_one_of_the_tools_with_arguments_of_its_schema():
    guide = json.loads(Tools((WEATHER, TIME), "required").guide())["json_schema"]
    jsonschema.validate({"name": "weather", "arguments": {"city": "Verona"}}, guide)
    jsonschema.validate({"name": "time", "arguments": {}}, guide)
    for wrong in ({"name": "weather", "arguments": {}}, {"name": "rain", "arguments": {}}, {"name": "time"}):
        assert not jsonschema.Draft202012Validator(guide).is_valid(wrong), wrong
    named = json.loads(Tools((WEATHER, TIME), "time").guide())["json_schema"]
    assert named["properties"]["name"] == {"const": "time"}
    assert Tools((WEATHER,), "auto").guide() is None and Tools((WEATHER,), "none").guide() is None


def test_an_answer_that_is_a_call_becomes_tool_calls_and_anything_else_stays_content():
    tools = Tools((WEATHER, TIME), "auto")
    calls = tools.calls(' {"name": "weather", "arguments": {"city": "Mantua"}}\n')
    assert calls[0]["type"] == "function" and calls[0]["id"].startswith("call_")
    assert calls[0]["function"] == {"name": "weather", "arguments": '{"city": "Mantua"}'}
    for content in ("It rains.", '{"name": "rain", "arguments": {}}', '{"name": "time"}', "[1]", '{"name": "time"'):
        assert tools.calls(content) is None, content
    assert Tools((WEATHER,), "none").calls('{"name": "weather", "arguments": {}}') is None


def test_the_chat_shows_the_tools_first_and_writes_calls_and_answers_as_turns():
    call = {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Verona"}'}}
    messages = [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    prompt = chat_prompt(messages, tools=Tools((WEATHER,), "auto")).prompt
    assert prompt.startswith("system: You can call these tools: [{\"name\": \"weather\"")
    assert prompt.endswith('user: Weather?\nassistant: {"name": "weather", "arguments": {"city": "Verona"}}\n'
                           'tool: sunny\nassistant:')
    assert "You can call" not in chat_prompt(messages, tools=Tools((WEATHER,), "none")).prompt

"""Chat messages → one prompt for a completion model, and the stop string where the assistant's answer ends.

The served models complete text; a chat is written out as text by the deployment's prompt template, whose
``chat_template`` writes one turn with {role} and {content} (default ``"{role}: {content}\\n"``):

1. the tools the chat may call, as a system turn (webapp.services.tools), where it may call any;
2. the template's few-shot examples, each as a user turn (its "input") then an assistant turn (its "output");
3. the conversation's messages in order, each as a turn of its role (an assistant's calls written as the model
   writes them, a tool's answer as a turn of role "tool");
4. the assistant's opening: the template for role "assistant" up to {content}, trailing spaces dropped
   (``"assistant:"``), which the model continues.

The answer ends where the model goes on to write the user's next turn: what the template writes after {content},
then the user's opening, trailing spaces dropped (``"\\nuser:"``), is a stop string. A deployment without a
template is written with the default one and no examples. So with the default, the messages
[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}] become the prompt
``"system: Be brief.\\nuser: Hi\\nassistant:"``, stopped at ``"\\nuser:"``.
"""
from dataclasses import dataclass
from string import Formatter

from ..models.serving import DEFAULT_CHAT_TEMPLATE
from .tools import Tools, written_calls

ROLES = ("system", "user", "assistant", "tool")
_CONTENT = "\x00content\x00"  # stands for {content} while a turn is split into its opening and closing


@dataclass(frozen=True)
class ChatPrompt:
    prompt: str
    stop: str


def chat_template_problem(template: str) -> str:
    """Why ``template`` cannot write a chat turn, or ''."""
    try:
        fields = [(name, spec, conversion) for _, name, spec, conversion in Formatter().parse(template)
                  if name is not None]
    except ValueError as exc:  # an unmatched brace
        return f"{exc}: write a literal brace as {{{{ or }}}}"
    names = sorted(name for name, _, _ in fields)
    if names != ["content", "role"] or any(spec or conversion for _, spec, conversion in fields):
        return (f"a chat template holds {{role}} and {{content}} once each and no other field (found "
                f"{', '.join('{' + n + '}' for n in names) or 'none'}): e.g. {DEFAULT_CHAT_TEMPLATE!r}")
    return ""


def _turn(template: str, role: str) -> tuple[str, str]:
    """What a turn of ``role`` writes before and after its content."""
    opening, closing = template.format(role=role, content=_CONTENT).split(_CONTENT)
    return opening, closing


def _content(message: dict) -> str:
    """A turn's text: its content, and the calls an assistant's turn made, as the model writes them."""
    calls = written_calls(message["tool_calls"]) if message.get("tool_calls") else ""
    return "\n".join(part for part in (message.get("content") or "", calls) if part)


def chat_prompt(messages: list[dict], template: str = DEFAULT_CHAT_TEMPLATE,
                examples: list[dict] | tuple = (), tools: Tools | None = None) -> ChatPrompt:
    """The prompt for ``messages`` ({"role", "content"} with a role of ROLES, an assistant's with its tool_calls)
    and the stop string of the answer; ``tools`` shown first, as a system turn (webapp.services.tools)."""
    turns = [("system", tools.turn())] if tools is not None and tools.shown else []
    for example in examples:
        turns += [("user", example["input"]), ("assistant", example["output"])]
    turns += [(m["role"], _content(m)) for m in messages]
    written = "".join(template.format(role=role, content=content) for role, content in turns)
    opening, closing = _turn(template, "assistant")
    user_opening, _ = _turn(template, "user")
    return ChatPrompt(prompt=written + opening.rstrip(" "), stop=(closing + user_opening).rstrip(" "))

"""The prompt playground: writing a prompt from a template, saving templates as versions, keeping what was asked,
and prompt sets answered through the same inference service as the API (deployment_generate). The versions and the
history are read by webapp.selectors.playground.

A template holds {examples} and {input} (a literal brace is written {{ or }}). Each few-shot example is written as
the template would write its input with no examples, followed by its output exactly as given and a blank line; the
examples together take the place of {examples}. So "{examples}Q: {input}\\nA:" with the example
{"input": "2+2", "output": " 4"} and the input "3+3" gives "Q: 2+2\\nA: 4\\n\\nQ: 3+3\\nA:".
"""
import time
from dataclasses import dataclass, field
from string import Formatter

from django.db import transaction
from django.db.models import Max

from deploy.client import GenerateParams

from ..models import Deployment, PlaygroundRecord, PromptTemplate, PromptTemplateVersion
from .deployments import deployment_generate
from .triton import ServingError

FIELDS = {"examples", "input"}
MAX_SET_PROMPTS = 20
# What a tokens/s figure needs: this many completion tokens, over at least this long. From fewer tokens, one token's
# timing or the request's latency is the whole figure; over a shorter span, how the stream was buffered on its way
# (a burst of tokens read at once) is. The playground's streamed rate keeps to both as well.
MIN_RATE_TOKENS = 8
MIN_RATE_MS = 20
# What PromptTemplate.sampling holds (the chat API reads it as defaults); stop strings live in the versions only.
TEMPLATE_SAMPLING = ("temperature", "top_k", "top_p", "max_tokens", "seed")

_QA = "{examples}Q: {input}\nA:"
_EXAMPLES = [{"input": "What is the capital of France?", "output": " Paris."},
             {"input": "What is 2 + 2?", "output": " 4."},
             {"input": "Who wrote Hamlet?", "output": " William Shakespeare."}]
PRESETS = {
    "zero-shot": {"label": "Zero-shot: the question alone", "template": _QA, "examples": []},
    "one-shot": {"label": "One-shot: one worked example first", "template": _QA, "examples": _EXAMPLES[:1]},
    "few-shot": {"label": "Few-shot: three worked examples first", "template": _QA, "examples": _EXAMPLES},
}


def template_problem(template: str) -> str:
    """Why ``template`` cannot write a prompt, or ''."""
    try:
        parts = [(name, spec, conversion) for _, name, spec, conversion in Formatter().parse(template)
                 if name is not None]
    except ValueError as exc:
        return f"{exc}: write a literal brace as {{{{ or }}}}"
    names = {name for name, _, _ in parts}
    if not names <= FIELDS or any(spec or conversion for _, spec, conversion in parts):
        found = ", ".join("{" + n + "}" for n in sorted(names - FIELDS)) or "a format spec"
        return f"a template holds only {{examples}} and {{input}} (found {found})"
    if "input" not in names:
        return "the template has no {input}: the text you type would not reach the model"
    return ""


def render_prompt(template: str, examples: list[dict], input: str) -> str:
    """The prompt ``template`` writes for ``input`` after ``examples`` (checked by template_problem first)."""
    written = "".join(template.format(examples="", input=e["input"]) + e["output"] + "\n\n" for e in examples)
    return template.format(examples=written, input=input)


def generate_params(prompt: str, sampling: dict) -> GenerateParams:
    return GenerateParams(prompt=prompt, max_tokens=sampling["max_tokens"], temperature=sampling["temperature"],
                          top_k=sampling["top_k"], top_p=sampling["top_p"], seed=sampling.get("seed"),
                          stop=tuple(sampling.get("stop") or ()))


# -- templates and their versions ---------------------------------------------------------------------------------

def _snapshot(template: PromptTemplate, number: int) -> PromptTemplateVersion:
    return PromptTemplateVersion.objects.create(prompt_template=template, number=number, template=template.template,
                                                examples=template.examples, sampling=dict(template.sampling))


@transaction.atomic
def prompt_template_save(*, owner, name: str, template: str, examples: list[dict],
                         sampling: dict) -> PromptTemplateVersion:
    """Save ``owner``'s template ``name`` as its next version (its first if it is new); earlier versions stay."""
    current, created = PromptTemplate.objects.get_or_create(owner=owner, name=name, defaults={"template": template})
    current = PromptTemplate.objects.select_for_update().get(pk=current.pk)  # two saves at once number in turn
    last = current.versions.aggregate(n=Max("number"))["n"] or 0
    if not created and last == 0:
        # made elsewhere (the API, the admin): what it holds now is kept as version 1 before it changes
        _snapshot(current, 1)
        last = 1
    current.template, current.examples = template, examples
    current.sampling = {k: sampling[k] for k in TEMPLATE_SAMPLING if sampling.get(k) is not None}
    current.save()
    return PromptTemplateVersion.objects.create(prompt_template=current, number=last + 1, template=template,
                                                examples=examples, sampling=sampling)


# -- history ------------------------------------------------------------------------------------------------------

NUL_KEPT_AS = "\u2400"  # ␀, the character made to show a NUL: neither database keeps a NUL in text


def keepable(text: str) -> str:
    """``text`` as the history can keep it: what a model generates may hold a NUL, kept as ␀."""
    return text.replace("\x00", NUL_KEPT_AS)


def playground_record(*, owner, deployment: Deployment | None, **fields) -> PlaygroundRecord:
    fields = {name: keepable(value) if isinstance(value, str) else value for name, value in fields.items()}
    model_name = deployment.model_name if deployment is not None else fields.pop("model_name", "")
    return PlaygroundRecord.objects.create(owner=owner, deployment=deployment, model_name=model_name, **fields)


# -- prompt sets --------------------------------------------------------------------------------------------------

@dataclass
class Cell:
    text: str = ""
    error: str = ""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str = ""
    seconds: float = 0.0

    @property
    def tokens_per_s(self) -> float | None:
        if (self.completion_tokens or 0) < MIN_RATE_TOKENS or self.seconds * 1000 < MIN_RATE_MS:
            return None
        return self.completion_tokens / self.seconds


@dataclass
class SetRow:
    input: str
    prompt: str
    cells: list[Cell] = field(default_factory=list)


def prompt_set_run(*, owner, deployments: list[Deployment], inputs: list[str], template: str,
                   examples: list[dict], sampling: dict) -> list[SetRow]:
    """Each input written by the template and answered whole by each deployment, in turn; each answer is kept in
    the owner's history. Meant to run outside a transaction: each record is written as its answer comes."""
    rows = []
    for text in inputs:
        prompt = render_prompt(template, examples, text)
        row = SetRow(input=text, prompt=prompt)
        for deployment in deployments:
            cell = Cell()
            started = time.perf_counter()
            try:
                completion = deployment_generate(deployment, generate_params(prompt, sampling))
            except ServingError as exc:
                cell.error = exc.message
            else:
                cell.text, cell.finish_reason = completion.text, completion.finish_reason
                cell.prompt_tokens, cell.completion_tokens = completion.prompt_tokens, completion.completion_tokens
            cell.seconds = time.perf_counter() - started
            row.cells.append(cell)
            playground_record(owner=owner, deployment=deployment, source=PlaygroundRecord.Source.SET, input=text,
                              template=template, examples=examples, prompt=prompt, sampling=sampling,
                              output=cell.text, error=cell.error, finish_reason=cell.finish_reason,
                              prompt_tokens=cell.prompt_tokens, completion_tokens=cell.completion_tokens,
                              total_ms=cell.seconds * 1000, tokens_per_s=cell.tokens_per_s)
        rows.append(row)
    return rows

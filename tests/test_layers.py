"""The web app's and the workers' own layers, checked on their source (import-linter checks who imports whom; these
rules are about what a module does, which an import does not show):

(a) Reads across relations live in ``webapp/selectors/``. A read across relations is query code that makes the
    database join or sub-query another model's table:

    - a call of ``select_related``, ``prefetch_related``, ``Prefetch``, ``FilteredRelation``, ``Subquery``,
      ``OuterRef`` or ``Exists``;
    - a lookup path, as a keyword of any call (``filter(owner__username=...)``, ``Q(plan__name=...)``) or as a
      string given to a query call (``order_by("plan__name")``, ``values("run__name")``, ``F("run__steps")``),
      whose first part is a relation of a model and which goes on into the related model: a foreign key followed by
      one of the related model's fields (``owner__username``), or a reverse or many-to-many relation
      (``deployments__isnull``). A foreign key followed by a lookup (``run__in``, ``cluster__isnull``) or by its
      ``pk`` reads the key's own column and joins nothing. (A sub-query given as the value of such a lookup,
      ``run__in=Run.objects.visible_to(user)``, is not told from a list of ids by reading the source; the ones the
      code has are selectors all the same: ``records_of_visible_runs``.)

    Left out, each for a reason: ``webapp/models/`` (the QuerySets' own vocabulary, such as ``visible_to``, which
    selectors compose), ``webapp/migrations/`` (history), and a chain that locks its rows with
    ``select_for_update``: a row read to be changed belongs to the write, inside its transaction. The admin's and
    the API filters' declared paths (``search_fields``, ``field_name=``) are not query code: the framework turns
    them into a query from the request, as it does a URL pattern.

(b) No markup in ``webapp/services/`` or ``webapp/selectors/``: no string holding an HTML or SVG tag, no import of
    Django's templates, its HTML utilities, ``django.shortcuts``, ``django.forms``, ``html`` or ``xml``, no call of
    ``format_html``, ``mark_safe`` or ``render_to_string``. Pictures and pages are drawn in ``webapp/rendering/``,
    ``webapp/pages/`` and the templates, from the data these layers answer.

(c) Selectors only read: no call that writes a row (``save``, ``create``, ``update`` of a query, ``delete``, ...),
    locks one for a write (``select_for_update``), sends a task, or writes a file. What a write needs to read, it
    asks a selector for; what a read would have to write (a run's estimate made on first read), a service does.

(d) One registry of task names (``webapp.services.tasks.TaskName``), every name in ``workbench.``: each
    ``shared_task``/``app.task`` declares its name from it, each ``enqueue``/``send_task`` sends one of it, each beat
    entry names one of it, and no other module spells a registered name as a string.

Each checker also runs on a small source that breaks its rule, so a clean tree means the checker looked.
"""
from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from webapp.services.tasks import TaskName, enqueue

REPO = Path(__file__).resolve().parent.parent
SELECTORS, SERVICES = "webapp/selectors/", "webapp/services/"
REGISTRY = "webapp/services/tasks.py"

# -- (a) reads across relations -----------------------------------------------------------------------------------

JOINING_CALLS = {"select_related", "prefetch_related", "Prefetch", "FilteredRelation", "Subquery", "OuterRef",
                 "Exists"}
# Calls whose string arguments are lookup paths
QUERY_CALLS = {"filter", "exclude", "get", "order_by", "values", "values_list", "annotate", "aggregate", "only",
               "defer", "distinct", "latest", "earliest", "F", "Q", "Count", "Max", "Min", "Sum", "Avg"}
NOT_A_JOIN = {"pk", "id"}  # a foreign key's target key is the key's own column
READS_LEFT_OUT = ("webapp/selectors/", "webapp/models/", "webapp/migrations/")


@dataclass(frozen=True)
class Relations:
    forward: frozenset[str]   # foreign keys and one-to-one fields, by name
    joining: frozenset[str]   # reverse and many-to-many relations, by query name
    plain: frozenset[str]     # names that are a plain field of some model (a JSON "plan", an integer "runs")
    lookups: frozenset[str]

    @classmethod
    def of_models(cls) -> "Relations":
        from django.apps import apps
        from django.db.models import Field

        forward, joining, plain = set(), set(), set()
        for model in apps.get_models():
            for field in model._meta.get_fields():
                if not field.is_relation:
                    plain.add(field.name)
                elif field.concrete and not field.many_to_many:
                    forward.add(field.name)
                else:
                    joining.add(field.name)  # a reverse relation's name is its query name
        return cls(frozenset(forward), frozenset(joining), frozenset(plain), frozenset(Field.get_lookups()))

    def crosses(self, path: str) -> bool:
        first, _, rest = path.partition("__")
        if not rest:
            return False
        going_on = rest.split("__")[0] not in self.lookups | NOT_A_JOIN
        if first in self.joining and first not in self.plain:
            return True
        return going_on and (first in self.forward or first in self.joining)


def _name(call: ast.Call) -> str:
    """The name a call calls: ``filter`` of ``Run.objects.filter(...)``, ``Q`` of ``Q(...)``."""
    return _named(call.func)


def _named(node: ast.expr) -> str:
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""


def _chain(call: ast.Call) -> Iterator[ast.Call]:
    """The calls of a method chain from its outermost call in: ``a.b().c()[:5].d()``."""
    node = call
    while True:
        if isinstance(node, ast.Call):
            yield node
            node = node.func.value if isinstance(node.func, ast.Attribute) else None
        elif isinstance(node, ast.Subscript):
            node = node.value
        else:
            return


def _chains(tree: ast.AST) -> Iterator[list[ast.Call]]:
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)]
    inner = {id(c) for call in calls for c in list(_chain(call))[1:]}
    for call in calls:
        if id(call) not in inner:
            yield list(_chain(call))


def relation_reads(source: str, relations: Relations) -> list[str]:
    """Where ``source`` reads across relations (rule (a)), as ``line: what``."""
    found = []
    for chain in _chains(ast.parse(source)):
        if any(_name(call) == "select_for_update" for call in chain):
            continue
        for call in chain:
            name = _name(call)
            if name in JOINING_CALLS:
                found.append(f"{call.lineno}: {name}(...)")
            paths = [k.arg for k in call.keywords if k.arg]
            if name in QUERY_CALLS:
                paths += [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            found += [f"{call.lineno}: lookup {path!r}" for path in paths if relations.crosses(path)]
    return found


# -- (b) markup ---------------------------------------------------------------------------------------------------

TAG = re.compile(r"</?(svg|g|rect|line|polyline|polygon|path|circle|text|tspan|title|desc|html|body|div|span|p|a|"
                 r"ul|ol|li|table|thead|tbody|tr|td|th|img|br|hr|button|form|input|select|option|label|script|"
                 r"style|strong|em|b|i|code|pre|h[1-6]|section|nav|header|footer|details|summary)[\s/>]")
MARKUP_MODULES = ("django.template", "django.utils.html", "django.utils.safestring", "django.shortcuts",
                  "django.forms", "html", "xml")
MARKUP_CALLS = {"format_html", "format_html_join", "mark_safe", "render_to_string"}


def _imports(tree: ast.AST) -> Iterator[tuple[int, str]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module


def markup(source: str) -> list[str]:
    """Where ``source`` builds markup (rule (b)), as ``line: what``."""
    tree = ast.parse(source)
    found = [f"{line}: imports {module}" for line, module in _imports(tree)
             if any(module == m or module.startswith(m + ".") for m in MARKUP_MODULES)]
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and TAG.search(node.value):
            found.append(f"{node.lineno}: markup {TAG.search(node.value).group(0)!r}")
        elif isinstance(node, ast.Call) and _name(node) in MARKUP_CALLS:
            found.append(f"{node.lineno}: {_name(node)}(...)")
    return found


# -- (c) selectors only read -------------------------------------------------------------------------------------

WRITING_CALLS = {"save", "delete", "create", "bulk_create", "bulk_update", "get_or_create", "update_or_create",
                 "select_for_update", "enqueue", "send_task", "write_text", "write_bytes", "unlink", "mkdir", "rmtree"}
QUERY_RECEIVERS = QUERY_CALLS | {"objects", "all", "none", "select_related", "prefetch_related"}


def _of_a_query(call: ast.Call) -> bool:
    """Whether a call's receiver is a query (``Run.objects.filter(...).update(...)``, not a dict's ``update``)."""
    node = call.func.value if isinstance(call.func, ast.Attribute) else None
    while isinstance(node, (ast.Call, ast.Attribute, ast.Subscript)):
        if isinstance(node, ast.Attribute) and node.attr in QUERY_RECEIVERS:
            return True
        node = node.func if isinstance(node, ast.Call) else node.value
    return False


def writes(source: str) -> list[str]:
    """Where ``source`` writes (rule (c)), as ``line: what``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        name = _name(node)
        modes = [*node.args[1:2], *(k.value for k in node.keywords if k.arg == "mode")]
        if name in WRITING_CALLS:
            found.append(f"{node.lineno}: {name}(...)")
        elif name == "update" and _of_a_query(node):
            found.append(f"{node.lineno}: update(...) of a query")
        elif name == "open" and any(isinstance(m, ast.Constant) and set(str(m.value)) & set("wax+") for m in modes):
            found.append(f"{node.lineno}: open(...) to write")
    return found


# -- (d) task names -----------------------------------------------------------------------------------------------

DECLARING, SENDING = {"shared_task", "task"}, {"enqueue", "send_task"}


def _from_registry(node: ast.AST | None) -> bool:
    """``TaskName.X`` or ``TaskName.X.value``."""
    if isinstance(node, ast.Attribute) and node.attr == "value":
        node = node.value
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "TaskName"


def task_names(source: str) -> list[str]:
    """Where ``source`` names a task other than from the registry (rule (d)), as ``line: what``."""
    registered = {name.value for name in TaskName}
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and _name(node) in DECLARING:
            given = next((k.value for k in node.keywords if k.arg == "name"), None)
            if not _from_registry(given):
                found.append(f"{node.lineno}: {_name(node)} declared without a name from TaskName")
        elif isinstance(node, ast.FunctionDef):
            found += [f"{d.lineno}: @{_named(d)} without a name: Celery would name it after the module"
                      for d in node.decorator_list if _named(d) in DECLARING]
        if isinstance(node, ast.Call) and _name(node) in SENDING and not (node.args and _from_registry(node.args[0])):
            found.append(f"{node.lineno}: {_name(node)} of a name not from TaskName")
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if isinstance(key, ast.Constant) and key.value == "task" and not _from_registry(value):
                    found.append(f"{key.lineno}: a beat entry's task not from TaskName")
        elif isinstance(node, ast.Constant) and node.value in registered:
            found.append(f"{node.lineno}: the task name {node.value!r} spelled out: use {TaskName(node.value)!r}")
    return found


# -- the tree -----------------------------------------------------------------------------------------------------

def _sources(*roots: str, leaving_out: tuple[str, ...] = ()) -> Iterator[tuple[str, str]]:
    for root in roots:
        for path in sorted((REPO / root).rglob("*.py")):
            relative = path.relative_to(REPO).as_posix()
            if not relative.startswith(leaving_out):
                yield relative, path.read_text()


def _findings(check: Callable[[str], list[str]], sources) -> list[str]:
    return [f"{path}:{finding}" for path, source in sources for finding in check(source)]


def test_it_finds_reads_across_relations_only_in_selectors():
    relations = Relations.of_models()
    found = _findings(lambda s: relation_reads(s, relations),
                      _sources("webapp", "workers", leaving_out=READS_LEFT_OUT))
    assert found == [], ("reads across relations outside webapp/selectors/: move each into a selector of its "
                         "concept and call it:\n" + "\n".join(found))


def test_it_finds_no_markup_in_services_or_selectors():
    found = _findings(markup, _sources(SERVICES, SELECTORS))
    assert found == [], ("markup in services or selectors: return the data and draw it in webapp/rendering/, "
                         "webapp/pages/ or a template:\n" + "\n".join(found))


def test_it_finds_no_write_in_selectors():
    found = _findings(writes, _sources(SELECTORS))
    assert found == [], ("writes in webapp/selectors/: move the write into a service (webapp/services/), which may "
                         "call the selector for what it reads:\n" + "\n".join(found))


def test_it_finds_every_task_named_from_the_registry_in_one_namespace():
    assert all(name.value.startswith("workbench.") for name in TaskName), list(TaskName)
    found = _findings(task_names, _sources("webapp", "workers", leaving_out=(REGISTRY,)))
    assert found == [], "task names not from webapp.services.tasks.TaskName:\n" + "\n".join(found)


def test_it_refuses_to_send_a_name_the_registry_does_not_hold():
    with pytest.raises(ValueError, match="'workers.deploy' is not a task name: send one of "
                                         "webapp.services.tasks.TaskName"):
        enqueue("workers.deploy", 1)


# -- the checkers see what they are for ---------------------------------------------------------------------------

@pytest.mark.parametrize("source, expected", [
    ("Run.objects.select_related('cluster').get(pk=1)", ["1: select_related(...)"]),
    ("Run.objects.filter(owner__username='alice')", ["1: lookup 'owner__username'"]),
    ("Run.objects.filter(Q(plan__name__icontains='x'))", ["1: lookup 'plan__name__icontains'"]),
    ("run.checkpoints.filter(deployments__isnull=True)", ["1: lookup 'deployments__isnull'"]),
    ("Deployment.objects.order_by('checkpoint__run__name')[:5]", ["1: lookup 'checkpoint__run__name'"]),
    ("Run.objects.annotate(s=Subquery(Attempt.objects.filter(run=OuterRef('pk')).values('script')[:1]))",
     ["1: Subquery(...)", "1: OuterRef(...)"]),
    # a foreign key's own column, a plain field, a JSON key, a lock for a write: no join
    ("Metric.objects.filter(run_id__in=[1], run__in=runs, cluster__isnull=True, status__in=['a'], run__pk=2)", []),
    ("Run.objects.filter(ingest_state__job_ended=False, name__icontains='x').order_by('-created_at')", []),
    ("Run.objects.select_for_update().select_related('cluster').get(pk=1)", []),
])
def test_the_relation_checker_sees_joins_and_only_joins(source, expected):
    assert relation_reads(source, Relations.of_models()) == expected


@pytest.mark.parametrize("source, expected", [
    ("svg = f'<svg viewBox=\"0 0 {w} 9\">' + '</svg>'", ["1: markup '<svg '", "1: markup '</svg>'"]),
    ("from xml.sax.saxutils import escape", ["1: imports xml.sax.saxutils"]),
    ("from django.utils.html import format_html\nformat_html('<b>{}</b>', x)",
     ["1: imports django.utils.html", "2: markup '<b>'", "2: format_html(...)"]),
    ("import django.template.loader", ["1: imports django.template.loader"]),
    ("why = 'write it with python -m trainer.profiling.timeline <run folder>/profiles/x, if a < b'", []),
])
def test_the_markup_checker_sees_tags_and_html_tools(source, expected):
    assert sorted(markup(source)) == sorted(expected)


@pytest.mark.parametrize("source, expected", [
    ("run.save(update_fields=['estimate'])", ["1: save(...)"]),
    ("Run.objects.filter(pk=1).update(estimate={})", ["1: update(...) of a query"]),
    ("Run.objects.select_for_update().get(pk=1)", ["1: select_for_update(...)"]),
    ("enqueue(TaskName.RUN_LAUNCH, 1)", ["1: enqueue(...)"]),
    ("Path(p).write_text('x')\nwith open(p, 'a') as f: pass", ["1: write_text(...)", "2: open(...) to write"]),
    # a dict's update, a file opened to read: no write
    ("out = {}\nout.update(more)\nname = text.replace('a', 'b')\nwith open(p) as f: pass\nopen(p, mode='rb')", []),
])
def test_the_write_checker_sees_writes_and_only_writes(source, expected):
    assert sorted(writes(source)) == sorted(expected)


@pytest.mark.parametrize("source, expected", [
    ("@shared_task(name='workers.deploy')\ndef deploy(i): ...",
     ["1: shared_task declared without a name from TaskName"]),
    ("@shared_task\ndef deploy(i): ...", ["1: @shared_task without a name: Celery would name it after the module"]),
    ("enqueue('workbench.runs.launch', 1)",
     ["1: enqueue of a name not from TaskName",
      "1: the task name 'workbench.runs.launch' spelled out: use <TaskName.RUN_LAUNCH: 'workbench.runs.launch'>"]),
    ("client.send_task(name, args=())", ["1: send_task of a name not from TaskName"]),
    ("beat = {'reconcile': {'task': 'workbench.reconcile', 'schedule': 5.0}}",
     ["1: a beat entry's task not from TaskName"]),
    ("@shared_task(name=TaskName.RUN_LAUNCH.value)\ndef launch(i): enqueue(TaskName.RUN_STOP, i)\n"
     "beat = {'r': {'task': TaskName.RUNS_RECONCILE.value}}", []),
])
def test_the_task_name_checker_sees_names_from_elsewhere(source, expected):
    assert sorted(task_names(source)) == sorted(expected)

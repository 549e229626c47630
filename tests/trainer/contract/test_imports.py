"""No two modules of the contract import each other, through any chain: not at import time, not inside a function,
not even for type annotations. The contract is the bottom layer, and within it every module has one place
(schedules and specjson below rules, rules below specs)."""
import itertools

import grimp


def modules_importing_each_other(package: str) -> list[tuple[str, str]]:
    """Pairs of modules of ``package`` (itself included) each of which reaches the other through some chain of
    imports, wherever the import statement stands."""
    graph = grimp.build_graph(package.split(".")[0], exclude_type_checking_imports=False)
    modules = sorted(graph.find_descendants(package) | {package})
    return [(a, b) for a, b in itertools.combinations(modules, 2)
            if graph.chain_exists(importer=a, imported=b) and graph.chain_exists(importer=b, imported=a)]


def test_it_has_no_two_contract_modules_that_import_each_other():
    assert modules_importing_each_other("trainer.contract") == []


def test_it_would_catch_an_import_back_inside_a_function_or_for_annotations(tmp_path, monkeypatch):
    package = tmp_path / "pact"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "model.py").write_text("from pact import rules\n")
    (package / "rules.py").write_text("def judge(model):\n    from pact.model import ModelSpec\n")
    (package / "plan.py").write_text("from pact import checks\n")
    (package / "checks.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                       "    from pact.plan import ParallelPlan\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert modules_importing_each_other("pact") == [("pact.checks", "pact.plan"), ("pact.model", "pact.rules")]

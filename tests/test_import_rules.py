"""The import rules of docs/architecture.md (the contracts in pyproject.toml) hold, no two modules import each other
through any chain, and the checkers really see imports."""
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import grimp

REPO = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
PACKAGES = ("trainer", "webapp", "workers", "deploy", "bench")


def _lint(config: Path, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT_IMPORTS), "--config", str(config), "--no-cache"], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def import_cycles(*packages: str) -> list[list[str]]:
    """Every set of modules that import one another through some chain (strongly connected components of the
    import graph with more than one module), imports inside functions included, annotation-only imports not."""
    graph = grimp.build_graph(*packages, exclude_type_checking_imports=True)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(module: str) -> None:  # Tarjan's algorithm
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in graph.find_modules_directly_imported_by(module):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return cycles


def test_it_keeps_every_import_rule_of_the_design():
    result = _lint(REPO / "pyproject.toml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_it_finds_no_import_cycle_between_the_projects_modules():
    assert import_cycles(*PACKAGES) == []


def test_it_would_catch_a_module_that_breaks_a_rule(tmp_path):
    """The same checker flags the trainer's model for importing torch, so a kept contract means something."""
    config = tmp_path / "rules.ini"
    config.write_text("[importlinter]\nroot_packages =\n    trainer\ninclude_external_packages = True\n\n"
                      "[importlinter:contract:model-without-torch]\nname = model without torch\ntype = forbidden\n"
                      "source_modules =\n    trainer.model\nforbidden_modules =\n    torch\n")
    result = _lint(config)
    assert result.returncode != 0 and "BROKEN" in result.stdout


def test_it_would_catch_a_circle_between_layers(tmp_path, monkeypatch):
    """A lower layer importing a higher one (here inside a function, where an arrow is easy to miss) breaks the
    layers contract and shows up as a cycle."""
    package = tmp_path / "house"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "loop.py").write_text("from house import model\n")
    (package / "model.py").write_text("def build():\n    from house import loop\n    return loop\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert import_cycles("house") == [["house.loop", "house.model"]]
    config = tmp_path / "rules.ini"
    config.write_text("[importlinter]\nroot_packages =\n    house\n\n[importlinter:contract:layers]\nname = layers\n"
                      "type = layers\nlayers =\n    house.loop\n    house.model\n")
    result = _lint(config, cwd=tmp_path)
    assert result.returncode != 0 and "BROKEN" in result.stdout


def _web_core_contracts(root: str) -> str:
    """The contracts of pyproject.toml about the web app's core, as TOML for a package named ``root``."""
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    text = f'[tool.importlinter]\nroot_packages = ["{root}"]\n'
    for contract in contracts:
        if contract["name"].startswith("The web app's core"):
            text += "\n[[tool.importlinter.contracts]]\n" + "".join(
                f"{key} = {json.dumps(value).replace('webapp', root)}\n" for key, value in contract.items())
    return text


def test_it_would_catch_a_service_that_draws_a_selector_that_writes_and_a_core_that_knows_a_page(tmp_path):
    """The web app's core contracts, as pyproject.toml has them, on a small package of the same shape: kept as it
    is laid out, broken by a service importing a picture, a selector importing a service, a model importing a
    page."""
    package = tmp_path / "house"
    package.mkdir()
    imports = {"models": "", "selectors": "from house import models\n", "services": "from house import selectors\n",
               "rendering": "from house import selectors\n", "pages": "from house import rendering, services\n",
               "api": "from house import services\n", "admin": "from house import pages\n"}
    for name, text in {"__init__": "", **imports}.items():
        (package / f"{name}.py").write_text(text)
    config = tmp_path / "rules.toml"
    config.write_text(_web_core_contracts("house"))
    kept = _lint(config, cwd=tmp_path)
    assert kept.returncode == 0 and "2 kept, 0 broken" in kept.stdout, kept.stdout + kept.stderr

    for importer, imported in (("services", "rendering"), ("selectors", "services"), ("models", "pages")):
        (package / f"{importer}.py").write_text(imports[importer] + f"from house import {imported}\n")
        broken = _lint(config, cwd=tmp_path)
        assert broken.returncode != 0 and f"house.{importer} -> house.{imported}" in broken.stdout, broken.stdout
        (package / f"{importer}.py").write_text(imports[importer])

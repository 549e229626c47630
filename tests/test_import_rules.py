"""docs/architecture.md's import rules (the contracts in pyproject.toml) hold, and the checker really sees imports."""
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def _lint(config: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT_IMPORTS), "--config", str(config), "--no-cache"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)


def test_it_keeps_every_import_rule_of_the_design():
    result = _lint(REPO / "pyproject.toml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_it_would_catch_a_module_that_breaks_a_rule(tmp_path):
    """The same checker flags the trainer's model for importing torch, so a kept contract means something."""
    config = tmp_path / "rules.ini"
    config.write_text("[importlinter]\nroot_packages =\n    trainer\ninclude_external_packages = True\n\n"
                      "[importlinter:contract:model-without-torch]\nname = model without torch\ntype = forbidden\n"
                      "source_modules =\n    trainer.model\nforbidden_modules =\n    torch\n")
    result = _lint(config)
    assert result.returncode != 0 and "BROKEN" in result.stdout

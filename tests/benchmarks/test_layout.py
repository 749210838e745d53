"""benchmarks/ is a package of scripts over lib/ helpers: no sys.path edits, and every module imports by its name."""
import ast
import json
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "benchmarks"
SCANNED = (PACKAGE, ROOT / "tests" / "benchmarks")
# the optional packages a benchmark module may import at its top, by the extra that installs each: a module that
# fails to import only because one of these is absent is skipped, naming it
OPTIONAL = {"faster_whisper": "bench", "ctranslate2": "bench", "onnxruntime": "bench", "jiwer": "bench",
            "httpx": "server", "websockets": "server", "openai": "server", "fastapi": "server", "uvicorn": "server",
            "ray": "ray"}
# imports every module named on its command line, one after the other, and writes each outcome to the JSON file
IMPORT_ALL = """
import importlib, json, sys, traceback
outcomes = {}
for name in sys.argv[2:]:
    try:
        importlib.import_module(name)
        outcomes[name] = ["ok", ""]
    except ModuleNotFoundError as error:
        outcomes[name] = ["missing " + str(error.name), traceback.format_exc()]
    except BaseException:
        outcomes[name] = ["error", traceback.format_exc()]
with open(sys.argv[1], "w") as handle:
    json.dump(outcomes, handle)
"""


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _sources(*folders: Path) -> List[Path]:
    return sorted(path for folder in folders for path in folder.rglob("*.py"))


MODULES = [_module_name(path) for path in _sources(PACKAGE)]
SCRIPTS = sorted(path for path in PACKAGE.glob("*.py") if path.name != "__init__.py")
HELPERS = sorted(path for path in (PACKAGE / "lib").glob("*.py") if path.name != "__init__.py")
# the names a module of the package would have if imported bare, as from a sys.path entry inside benchmarks/
BARE_NAMES = {path.stem for path in SCRIPTS + HELPERS} | {"lib"}


def _relative(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _imported_names(tree: ast.AST) -> List[str]:
    """Every absolute module name the file imports, at its top or inside a function (`from a import b`: a.b too)."""
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names += [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
    return names


def _path_tricks(tree: ast.AST) -> List[str]:
    """What in the file reaches modules by path: sys.path, or loading a file by its path."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "path" and getattr(node.value, "id", None) == "sys":
            found.append(f"line {node.lineno}: sys.path")
        elif isinstance(node, ast.Attribute) and node.attr in ("spec_from_file_location", "run_path"):
            found.append(f"line {node.lineno}: {node.attr}")
    return found


def test_the_package_has_its_scripts_and_helpers():
    assert (PACKAGE / "__init__.py").is_file() and (PACKAGE / "lib" / "__init__.py").is_file()
    assert len(SCRIPTS) >= 10 and len(HELPERS) >= 10 and "benchmarks.lib.common" in MODULES


@pytest.mark.parametrize("path", _sources(*SCANNED), ids=_relative)
def test_no_file_edits_sys_path_or_loads_a_module_by_path(path):
    tricks = _path_tricks(ast.parse(path.read_text(encoding="utf-8")))
    assert not tricks, f"{_relative(path)} reaches modules by path ({', '.join(tricks)}): import them from the " \
                       f"benchmarks package instead (`from benchmarks.lib.x import ...`)"


@pytest.mark.parametrize("path", _sources(*SCANNED), ids=_relative)
def test_benchmark_modules_are_imported_by_their_package_name(path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    bare = sorted({name for name in _imported_names(tree) if name.split(".")[0] in BARE_NAMES})
    assert not bare, f"{_relative(path)} imports {bare} by a bare name: use benchmarks.<name> / benchmarks.lib.<name>"


@pytest.mark.parametrize("path", HELPERS, ids=_relative)
def test_helpers_import_no_script(path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    scripts = sorted({name for name in _imported_names(tree)
                      if name.startswith("benchmarks.") and not name.startswith("benchmarks.lib")})
    assert not scripts, f"{_relative(path)} imports the scripts {scripts}: move what it needs into lib/"


def _has_main_block(tree: ast.Module) -> bool:
    return any(isinstance(node, ast.If) and "__main__" in ast.unparse(node.test) for node in tree.body)


@pytest.mark.parametrize("path", SCRIPTS + HELPERS, ids=_relative)
def test_scripts_have_a_main_and_helpers_none(path):
    """A script (benchmarks/<name>.py) runs as `python -m benchmarks.<name>`; a helper (lib/) is only imported."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    if path in SCRIPTS:
        assert _has_main_block(tree) and any(isinstance(node, ast.FunctionDef) and node.name == "main"
                                             for node in tree.body), f"{_relative(path)}: no main() run by __main__"
    else:
        assert not _has_main_block(tree), f"{_relative(path)} is a helper with a __main__ block: make it a script"


@pytest.fixture(scope="module")
def import_outcomes(tmp_path_factory) -> Dict[str, List[str]]:
    """Every module of the package imported in one fresh process at the repository root (imports run the engine's
    and torch's set-up, which this test process keeps out of)."""
    out = tmp_path_factory.mktemp("imports") / "outcomes.json"
    result = subprocess.run([sys.executable, "-c", IMPORT_ALL, str(out), *MODULES], capture_output=True, text=True,
                            timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("name", MODULES)
def test_every_module_imports_by_its_package_name(name, import_outcomes):
    outcome, details = import_outcomes[name]
    missing = outcome.split(" ", 1)[1] if outcome.startswith("missing ") else ""
    if missing.split(".")[0] in OPTIONAL:
        extra = OPTIONAL[missing.split(".")[0]]
        pytest.skip(f"{name} needs {missing} (the `{extra}` extra), which is not installed")
    assert outcome == "ok", f"{name} does not import: {details}"

"""Errors are types, never parsed from their text: no code of the package splits, searches, prefix-matches or compares
the text of an exception it caught (`except ... as error`) or was handed (a parameter annotated as an exception):
`str(error)`, `error.args`, or a name bound to either. Building a message from it (f-strings, `str(error)` handed to a
constructor, `.strip()`) is fine; what a caller decides on (a parameter, a status, a branch) comes from the error's
type and fields (seq2seq_engine/errors.py)."""
import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE_DIRS = ("seq2seq_engine", "kernels", "models")  # kernels/ and models/ install as seq2seq_engine's
TEXT_METHODS = {"split", "rsplit", "partition", "rpartition", "startswith", "endswith", "find", "rfind", "index"}
RE_FUNCTIONS = {"search", "match", "fullmatch", "findall", "finditer", "split", "sub", "subn"}


class _Scope:
    """An exception's name and the code that holds it (an `except ... as name` body, or a function taking it), with
    the names bound there to its text."""

    def __init__(self, error: str, body: list) -> None:
        self.error, self.body, self.aliases = error, body, set()
        for node in ast.walk(ast.Module(body=body, type_ignores=[])):
            if isinstance(node, ast.Assign) and self.is_text(node.value):
                self.aliases.update(target.id for target in node.targets if isinstance(target, ast.Name))

    def is_text(self, node: ast.AST) -> bool:
        """str(error) or error.args (or error.args[0]), possibly under string methods (.replace, .lower, ...), or an
        alias of one."""
        while isinstance(node, (ast.Call, ast.Subscript)):
            if isinstance(node, ast.Subscript):
                node = node.value
            elif isinstance(node.func, ast.Attribute):
                node = node.func.value
            else:
                break
        if isinstance(node, ast.Name):
            return node.id in self.aliases
        if isinstance(node, ast.Attribute) and node.attr == "args":
            return isinstance(node.value, ast.Name) and node.value.id == self.error
        return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("str", "repr")
                and len(node.args) == 1 and isinstance(node.args[0], ast.Name) and node.args[0].id == self.error)


def _parses(node: ast.AST, scope: _Scope) -> bool:
    """Whether `node` reads something out of the exception's text."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        if node.func.attr in TEXT_METHODS and scope.is_text(node.func.value):
            return True
        module = node.func.value
        if isinstance(module, ast.Name) and module.id == "re" and node.func.attr in RE_FUNCTIONS:
            return any(scope.is_text(arg) for arg in node.args)
    if isinstance(node, ast.Compare):
        operands = [node.left, *node.comparators]
        return any(isinstance(op, (ast.In, ast.NotIn, ast.Eq, ast.NotEq)) for op in node.ops) and any(
            scope.is_text(operand) for operand in operands)
    return False


def _is_exception_type(annotation: object) -> bool:
    name = getattr(annotation, "id", getattr(annotation, "attr", ""))
    return name.endswith(("Error", "Exception"))


def _scopes(tree: ast.AST) -> list:
    scopes = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ExceptHandler) and node.name is not None:
            scopes.append(_Scope(node.name, node.body))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            arguments = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
            scopes += [_Scope(arg.arg, node.body) for arg in arguments if _is_exception_type(arg.annotation)]
    return scopes


def text_parsing(source: str, filename: str = "<source>") -> list:
    """`file:line` of each place in `source` that parses an exception's text."""
    found = set()
    for scope in _scopes(ast.parse(source, filename)):
        for statement in scope.body:
            found.update(f"{filename}:{node.lineno}" for node in ast.walk(statement) if _parses(node, scope))
    return sorted(found)


@pytest.mark.parametrize("code", [
    'raise APIError(str(error), param=str(error).split(" ", 1)[0])',
    'field, rest = str(error).replace(" or None", "").split(" ", 1)',
    'param = next(word for word in re.findall(r"\\w+", str(error)))',
    'if "longer than" in str(error):\n        raise Busy()',
    'if str(error).startswith("language"):\n        pass',
    'message = str(error)\n    head = message.split(" ", 1)[0]',
    'if error.args[0] == "timeout":\n        pass',
    'if re.match("^n ", str(error).lower()):\n        pass',
])
def test_the_check_finds_text_parsing(code):
    source = f"try:\n    run()\nexcept ValueError as error:\n    {code}\n"
    assert text_parsing(source), source
    handed = f"def param_of(error: BaseException, default: str) -> str:\n    {code}\n"
    assert text_parsing(handed), handed


@pytest.mark.parametrize("code", [
    "raise APIError(str(error), param=param_of(error)) from None",
    'raise ValueError(f"{flag} must be {error.requirement}, got {value!r}") from None',
    'message = str(error).strip() or type(error).__name__',
    "raise InputFailed(state, str(error)) from error",
    'warn(str(error).splitlines()[0] if str(error) else type(error).__name__)',
    'if "x" in options:\n        raise',
])
def test_the_check_lets_messages_be_built(code):
    source = f"try:\n    run()\nexcept ValueError as error:\n    {code}\n"
    assert text_parsing(source) == [], source


def test_no_code_of_the_package_parses_an_error_text():
    found = []
    for directory in PACKAGE_DIRS:
        for path in sorted((ROOT / directory).rglob("*.py")):
            found += text_parsing(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    assert found == []

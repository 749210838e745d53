"""How a benchmark script starts a script (itself or another) in a child process: `python -m benchmarks.<name>`."""
import os
import sys
from typing import List

# the repository root: the children run there, where `benchmarks` imports as a package
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def script_command(name: str, *args: str) -> List[str]:
    """The command line of benchmarks/<name>.py run as a module, to be run with cwd=ROOT."""
    return [sys.executable, "-m", f"benchmarks.{name}", *args]


def script_argv() -> List[str]:
    """This process's arguments as typed at the root: `-m benchmarks.<name> ARGS` for a script run as a module (whose
    sys.argv[0] is its file's full path), else sys.argv."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name.startswith("benchmarks."):
        return ["-m", spec.name] + sys.argv[1:]
    return list(sys.argv)

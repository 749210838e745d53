"""The `seq2seq-engine` console script: the command line imported with the cyclic collector off, then frozen."""
from __future__ import annotations

from types import ModuleType


def import_command_line() -> ModuleType:
    """`entrypoints.cli`, imported (torch, the engine: about 200,000 objects) without the collections those
    allocations would set off (0.12–0.18 s of full collections walking the half-built heap, measured); what the
    imports left is then moved into the collector's permanent generation (they leave no garbage: 0 unreachable
    objects measured), so the model load and the engine's start-up collection walk only what comes after."""
    import gc

    collecting = gc.isenabled()
    gc.disable()
    try:
        from seq2seq_engine.entrypoints import cli
    finally:
        gc.freeze()
        if collecting:
            gc.enable()
    return cli


def main() -> int:
    """The command line of this process; a caller of `cli.main(argv)` keeps its collector as it is."""
    return import_command_line().main()

"""README's "Input limits" table and the limit registries in code hold the same rows: each row's number, status and
`param` are its entry's, and each setting a bound follows (a serve flag's default, an engine or library default)
has the number the row states."""
import argparse
import importlib
import re
from pathlib import Path

import pytest

from seq2seq_engine.config import SchedulerConfig
from seq2seq_engine.entrypoints.openai import serve_cli

REPO = Path(__file__).resolve().parents[2]
# Modules holding a LIMITS tuple of limits.Limit, one entry per row of the table.
REGISTRIES = ("seq2seq_engine.entrypoints.openai.limits",)
NUMBER = re.compile(r"\d+(?:\.\d+)?")


def _registered() -> dict:
    entries = [entry for name in REGISTRIES for entry in importlib.import_module(name).LIMITS]
    keyed = {(entry.surface, entry.field): entry for entry in entries}
    assert len(keyed) == len(entries), "two registry entries share a surface and a field"
    return keyed


def _plain(cell: str) -> str:
    return cell.replace("`", "").strip()


def _table_rows() -> list:
    """The rows of the first table after the "Input limits" heading, each as four cells without backticks."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    match = re.search(r"^#+ Input limits\n(.*?)(?=^#)", text, flags=re.S | re.M)
    assert match, "README.md has no 'Input limits' section"
    lines = [line for line in match.group(1).splitlines() if line.startswith("|")]
    assert lines[0].lower().startswith("| surface | field | limit |"), lines[0]
    rows = []
    for line in lines[2:]:  # below the header and its |---| line
        cells = [_plain(cell) for cell in line.strip().strip("|").split(" | ")]
        assert len(cells) == 4, f"a row of the limits table does not have four cells: {line}"
        rows.append(cells)
    return rows


def test_every_row_is_a_registered_limit_and_every_limit_has_a_row():
    rows, registered = _table_rows(), _registered()
    keys = [(surface, field) for surface, field, _, _ in rows]
    assert len(set(keys)) == len(keys), "the table repeats a row"
    unregistered, missing = set(keys) - set(registered), set(registered) - set(keys)
    assert not unregistered, f"rows without an entry in {REGISTRIES}: {sorted(unregistered)}"
    assert not missing, f"limits without a README row: {sorted(missing)}"


@pytest.mark.parametrize("row", _table_rows(), ids=lambda row: f"{row[0]}|{row[1]}")
def test_each_row_states_its_limit_status_and_param(row):
    surface, field, limit, response = row
    entry = _registered()[(surface, field)]
    if isinstance(entry.value, str):
        assert entry.value in limit, f"the limit of {field!r} is {entry.value!r}, the table says {limit!r}"
    else:
        stated = NUMBER.search(limit)
        assert stated and float(stated.group()) == entry.value, \
            f"the limit of {field!r} is {entry.value}, the table says {limit!r}"
    if entry.setting is not None and "." not in entry.setting:
        assert entry.setting in limit, f"the limit of {field!r} follows {entry.setting}; the table does not say so"
    assert response.startswith(str(entry.status)), f"past {field!r} a client gets {entry.status}, not {response!r}"
    assert entry.refused_param in response, f"past {field!r} the error's param is {entry.refused_param!r}"


def _setting_default(setting: str):
    """The default of a serve flag, of the engine's max_beam_width, or a library constant's value."""
    flags = serve_cli.configure_parser(argparse.ArgumentParser()).parse_args(["MODEL"])
    if setting.startswith("--"):
        return getattr(flags, setting[2:].replace("-", "_"))
    if setting == "max_beam_width":
        return SchedulerConfig(max_num_seqs=flags.max_num_seqs).max_beam_width
    module, name = setting.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("entry", [entry for entry in _registered().values() if entry.setting is not None],
                         ids=lambda entry: f"{entry.surface}|{entry.field}")
def test_the_settings_defaults_are_the_registered_numbers(entry):
    assert _setting_default(entry.setting) == entry.value, (entry.setting, entry.value)


def test_the_server_settings_defaults_match_the_flags():
    from seq2seq_engine.entrypoints.openai.state import ServerSettings

    settings = ServerSettings()
    assert settings.max_upload_bytes == _setting_default("--max-upload-mb") * 1024 * 1024
    assert settings.max_audio_seconds == _setting_default("--max-audio-seconds")

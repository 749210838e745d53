"""Model configs read without transformers (Whisper's config.json) hold what transformers' config holds; other
directories, and a Whisper config.json missing a field the engine reads, are read by transformers."""
import json

import pytest
from transformers import AutoConfig, PretrainedConfig

from seq2seq_engine.model_loader.config_file import WHISPER_FIELDS, JsonConfig, load_config
from seq2seq_engine.model_loader.resolver import resolve_model_path


@pytest.mark.parametrize("name", ["whisper-tiny.en", "whisper-base"])
def test_whisper_config_holds_transformers_values(name):
    model_dir = resolve_model_path(name)
    ours, reference = load_config(model_dir), AutoConfig.from_pretrained(model_dir, local_files_only=True)
    assert isinstance(ours, JsonConfig)
    fields = json.load(open(f"{model_dir}/config.json"))
    for key in [*WHISPER_FIELDS, *fields]:
        if key not in ("transformers_version", "dtype"):
            assert getattr(ours, key) == getattr(reference, key), key
    assert getattr(ours, "max_position_embeddings", None) is None   # the engine's getattr defaults still apply
    assert ours.to_dict()["d_model"] == reference.d_model and ours.name_or_path == model_dir


def _copy_config(tmp_path, model_dir, drop=(), **changes):
    fields = json.load(open(f"{model_dir}/config.json"))
    fields = {key: value for key, value in {**fields, **changes}.items() if key not in drop}
    (tmp_path / "config.json").write_text(json.dumps(fields))
    return str(tmp_path)


@pytest.mark.parametrize("drop", ["d_model", "decoder_start_token_id", "num_mel_bins"])
def test_a_whisper_config_missing_a_field_is_read_by_transformers(tmp_path, drop):
    config = load_config(_copy_config(tmp_path, resolve_model_path("whisper-tiny.en"), drop=(drop,)))
    assert isinstance(config, PretrainedConfig)
    assert getattr(config, drop) is not None   # transformers' default


def test_other_families_are_read_by_transformers(tmp_path):
    from transformers import BartConfig

    BartConfig(d_model=16, encoder_layers=1, decoder_layers=1, vocab_size=64).save_pretrained(tmp_path)
    config = load_config(str(tmp_path))
    assert isinstance(config, BartConfig) and config.d_model == 16


def test_missing_directory_and_file_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_config(str(tmp_path / "absent"))
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_config(str(tmp_path))


def test_whisper_language_table_is_transformers_table():
    """The package's language table (token order, names, aliases) is the one transformers and openai-whisper hold."""
    from transformers.models.whisper.tokenization_whisper import LANGUAGES, TO_LANGUAGE_CODE

    from seq2seq_engine.transcription.language_table import LANGUAGES as OURS, TO_LANGUAGE_CODE as OUR_CODES

    assert list(OURS.items()) == list(LANGUAGES.items())
    assert OUR_CODES == TO_LANGUAGE_CODE

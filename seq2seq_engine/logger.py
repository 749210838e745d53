"""The package logger: INFO messages (KV-cache size, ignored requests) reach stderr unless the user configures
logging; set SEQ2SEQ_ENGINE_LOGGING_LEVEL (e.g. WARNING) to change the level."""
import logging

from seq2seq_engine.platforms.overrides import override_value

_ROOT = "seq2seq_engine"


def configure_package_logger() -> None:
    """Give the package logger a stderr handler once, unless the application already configured one."""
    logger = logging.getLogger(_ROOT)
    if logger.handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s %(name)s: %(message)s", "%m-%d %H:%M:%S"))
    logger.addHandler(handler)
    logger.setLevel((override_value("SEQ2SEQ_ENGINE_LOGGING_LEVEL") or "INFO").upper())
    logger.propagate = False

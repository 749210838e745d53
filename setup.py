"""Packaging: maps the top-level kernels/ and models/ folders into the seq2seq_engine namespace."""
from setuptools import find_packages, setup

ENGINE_PACKAGES = find_packages(include=["seq2seq_engine", "seq2seq_engine.*"])
MAPPED = {"seq2seq_engine.kernels": "kernels", "seq2seq_engine.models": "models"}
MAPPED_PACKAGES = [
    f"{prefix}.{sub}" if sub else prefix
    for prefix, folder in MAPPED.items()
    for sub in [""] + find_packages(where=folder)
]

setup(
    packages=ENGINE_PACKAGES + MAPPED_PACKAGES,
    package_dir={"": ".", **MAPPED},
    package_data={"seq2seq_engine.kernels": ["csrc/*.c", "csrc/*.h"],
                  # the browser page `seq2seq-engine serve` serves at / (entrypoints/openai/web_ui.py)
                  "seq2seq_engine.entrypoints.openai": ["ui/*.html", "ui/*.js", "ui/*.css"]},
)

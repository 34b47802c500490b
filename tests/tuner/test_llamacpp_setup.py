"""``elsa-tune llamacpp setup``: finds the llama-server it is pointed at, writes the designed models the shipped
llama.cpp spaces name, keeps them on a second run, and says what to run next."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import gguf

from elsa_tune.tuner.commands.llamacpp import MODEL_FILES


def test_setup_writes_the_cpu_models_once_and_names_the_next_study(tmp_path: Path) -> None:
    binary = tmp_path / "bin" / "llama-server"
    binary.parent.mkdir()
    binary.write_text("#!/bin/sh\nexit 0\n")
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    env = {**os.environ, "ELSA_LLAMA_SERVER": str(binary), "ELSA_TUNE_CACHE": str(tmp_path / "cache")}
    first = subprocess.run([sys.executable, "-m", "elsa_tune", "llamacpp", "setup"], env=env, capture_output=True,
                           text=True, timeout=120, check=False)
    assert first.returncode == 0, first.stderr
    models = tmp_path / "cache" / "models"
    for kind in ("tiny", "draft", "foreign-draft"):
        reader = gguf.GGUFReader(models / MODEL_FILES[kind])
        assert reader.fields["general.architecture"].contents() == "llama"
    assert not (models / MODEL_FILES["gpu"]).exists()
    assert f"llama-server: {binary} (found; not rebuilt)" in first.stdout
    assert "--runtime llamacpp --gpu cpu --space llamacpp-cpu-tiny" in first.stdout
    before = (models / MODEL_FILES["tiny"]).stat().st_mtime_ns
    second = subprocess.run([sys.executable, "-m", "elsa_tune", "llamacpp", "setup"], env=env, capture_output=True,
                            text=True, timeout=120, check=False)
    assert second.returncode == 0 and "(kept)" in second.stdout
    assert (models / MODEL_FILES["tiny"]).stat().st_mtime_ns == before

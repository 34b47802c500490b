"""``llama-server`` built from the pinned llama.cpp source, cached per commit and build kind.

PyPI ships no llama.cpp server binary; the sdist of ``llama-cpp-python`` vendors the llama.cpp source. This
module downloads that sdist with pip (the only registry a CI machine reaches), extracts the vendored tree
pruned of models, documents, tests, examples and the GPU backends it does not build, and builds the one
target ``llama-server`` with CMake and Ninja into ``~/.cache/elsa-tune/llama.cpp-<commit>-<kind>/``. A build
is installed by renaming a finished folder into place, so an interrupted build leaves no half binary behind;
the next call resumes from the build folder it kept.

    python -m elsa_tune.runtime.llamacpp.build            # CPU build (CI, a laptop)
    python -m elsa_tune.runtime.llamacpp.build --cuda     # CUDA build (nvcc and cuBLAS on the machine)
    python -m elsa_tune.runtime.llamacpp.build --pack src.tar.gz   # the pruned source, to carry elsewhere
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

#: The pinned source: the sdist that vendors llama.cpp, and the llama.cpp commit it vendors.
SDIST = "llama-cpp-python==0.3.36"
COMMIT = "0c1e570"
_VENDOR = "vendor/llama.cpp/"

#: Parts of the vendored tree a server build never reads.
_PRUNED_DIRS = ("models/", "docs/", "tests/", "examples/", ".github/", ".devops/", "media/", "gguf-py/",
                "conversion/", "benches/", "pocs/", "tools/ui/src/", "tools/ui/tests/", "tools/ui/static/",
                "tools/server/webui/")
_PRUNED_SUFFIXES = (".mp4", ".webp", ".pdf", ".png", ".jpg", ".gguf")
_PRUNED_BACKENDS = ("vulkan", "sycl", "metal", "opencl", "cann", "musa", "hip", "kompute", "webgpu", "zdnn",
                    "hexagon", "rpc", "virtgpu", "zendnn", "openvino")

_CMAKE_FLAGS = ("-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=OFF", "-DBUILD_SHARED_LIBS=OFF", "-DGGML_CCACHE=OFF",
                "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
                "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF", f"-DLLAMA_BUILD_COMMIT={COMMIT}",
                "-DLLAMA_BUILD_NUMBER=0")
#: Bounds of each step: a 2-core CPU build takes ~15 min, a CUDA one on 16 cores ~4 min.
_DOWNLOAD_S, _CONFIGURE_S, _BUILD_S = 600.0, 600.0, 7200.0
_CUDA_FLAGS = ("-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=90-real", "-DGGML_CUDA_NCCL=OFF")


class BuildError(RuntimeError):
    """The build could not finish; the message says which step and its last output lines."""


@dataclass(frozen=True)
class Build:
    """Where one kind of build lives: ``binary`` once installed, ``work`` while it is being built."""

    cache: Path
    cuda: bool

    @property
    def name(self) -> str:
        return f"llama.cpp-{COMMIT}-{'cuda' if self.cuda else 'cpu'}"

    @property
    def home(self) -> Path:
        return self.cache / self.name

    @property
    def binary(self) -> Path:
        return self.home / "bin" / "llama-server"

    @property
    def work(self) -> Path:
        return self.cache / f"{self.name}.build"


#: The environment variable that names a ``llama-server`` to use instead of the cached build.
ENV_BINARY = "ELSA_LLAMA_SERVER"


def cached_binary(cache: Path | None = None) -> Path | None:
    """The cached ``llama-server`` of the pinned commit, the CUDA build before the CPU one, or ``None``."""
    for cuda in (True, False):
        binary = Build(cache or default_cache(), cuda).binary
        if binary.is_file() and os.access(binary, os.X_OK):
            return binary
    return None


def default_cache() -> Path:
    """``$ELSA_TUNE_CACHE`` or ``~/.cache/elsa-tune``."""
    return Path(os.environ.get("ELSA_TUNE_CACHE") or Path.home() / ".cache" / "elsa-tune")


def _vendored(member: str) -> str | None:
    """The path of ``member`` inside the vendored tree (an sdist's ``<top>/vendor/llama.cpp/`` or a packed
    ``vendor/llama.cpp/``), or ``None`` when it lies outside it."""
    parts = member.split("/")
    for skip in (0, 1):
        if "/".join(parts[skip:skip + 2]) + "/" == _VENDOR:
            return "/".join(parts[skip + 2:])
    return None


def _pruned(rel: str) -> bool:
    if rel.startswith(_PRUNED_DIRS) or rel == ".git" or rel.endswith(_PRUNED_SUFFIXES):
        return True
    return any(rel.startswith(f"ggml/src/ggml-{b}/") or rel == f"ggml/src/ggml-{b}" for b in _PRUNED_BACKENDS)


def fetch_sdist(into: Path) -> Path:
    """Download the pinned sdist with pip into ``into`` (kept: a second call finds it)."""
    into.mkdir(parents=True, exist_ok=True)
    found = sorted(into.glob("llama_cpp_python-*.tar.gz"))
    if found:
        return found[-1]
    _run([sys.executable, "-m", "pip", "download", "-q", "--no-binary", ":all:", "--no-deps", SDIST, "-d", str(into)],
         "download the llama.cpp source", timeout_s=_DOWNLOAD_S)
    found = sorted(into.glob("llama_cpp_python-*.tar.gz"))
    if not found:
        raise BuildError(f"pip downloaded no sdist of {SDIST} into {into}")
    return found[-1]


def extract(archive: Path, dest: Path) -> Path:
    """Extract the vendored llama.cpp tree of ``archive`` (an sdist, or a tarball ``pack`` wrote) into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive) as tar:
        members = []
        for member in tar.getmembers():
            rel = _vendored(member.name)
            if not rel or _pruned(rel):
                continue
            member.name = rel
            members.append(member)
        tar.extractall(dest, members=members, filter="data")
    if not (dest / "CMakeLists.txt").is_file():
        raise BuildError(f"{archive} holds no llama.cpp source under {_VENDOR}")
    return dest


def pack(archive: Path, out: Path) -> Path:
    """Write the pruned source of ``archive`` as a tarball ``extract`` reads (about 6 MB)."""
    with tempfile.TemporaryDirectory() as tmp:
        src = extract(archive, Path(tmp) / "src")
        with tarfile.open(out, "w:gz") as tar:
            tar.add(src, arcname=_VENDOR.rstrip("/"))
    return out


def build(*, cuda: bool = False, cache: Path | None = None, source: Path | None = None, jobs: int | None = None,
          log: bool = True) -> Path:
    """The path of a ``llama-server`` of the pinned commit: the cached one, or a fresh build installed there."""
    where = Build(cache or default_cache(), cuda)
    if where.binary.is_file() and os.access(where.binary, os.X_OK):
        return where.binary
    where.cache.mkdir(parents=True, exist_ok=True)
    src = where.work / "src"
    if not (src / "CMakeLists.txt").is_file():
        shutil.rmtree(where.work, ignore_errors=True)
        archive = source or fetch_sdist(where.cache / "sdist")
        extract(archive, src)
    out = where.work / "build"
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    if not (out / "CMakeCache.txt").is_file():
        _run(["cmake", "-S", str(src), "-B", str(out), *generator, *_CMAKE_FLAGS, *(_CUDA_FLAGS if cuda else ())],
             "configure llama.cpp", echo=log, timeout_s=_CONFIGURE_S)
    _run(["cmake", "--build", str(out), "--target", "llama-server", "-j", str(jobs or os.cpu_count() or 2)],
         "build llama-server", echo=log, timeout_s=_BUILD_S)
    staged = where.cache / f"{where.name}.staged"
    shutil.rmtree(staged, ignore_errors=True)
    (staged / "bin").mkdir(parents=True)
    shutil.copy2(out / "bin" / "llama-server", staged / "bin" / "llama-server")
    (staged / "COMMIT").write_text(f"{COMMIT}\n")
    os.replace(staged, where.home)
    shutil.rmtree(where.work, ignore_errors=True)
    return where.binary


def _run(argv: list[str], what: str, *, timeout_s: float, echo: bool = False) -> None:
    """Run one step to its end or its timeout (then it is killed and the build folder kept for the next call)."""
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=None if echo else subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, check=False, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        raise BuildError(f"could not {what} within {timeout_s / 60:.0f} min: {' '.join(argv[:6])} …") from exc
    except OSError as exc:
        raise BuildError(f"could not {what}: {exc}") from exc
    if done.returncode != 0:
        tail = "\n".join((done.stdout or "").strip().splitlines()[-20:])
        raise BuildError(f"could not {what} (exit {done.returncode}): {' '.join(argv[:6])} …\n{tail}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cuda", action="store_true", help="build with CUDA (sm_90) instead of for the CPU")
    parser.add_argument("--cache", type=Path, default=None, help="cache folder (default ~/.cache/elsa-tune)")
    parser.add_argument("--source", type=Path, default=None, help="an sdist or a tarball --pack wrote")
    parser.add_argument("--jobs", type=int, default=None)
    parser.add_argument("--pack", type=Path, default=None, help="write the pruned source tarball here and stop")
    args = parser.parse_args(argv)
    try:
        if args.pack is not None:
            archive = args.source or fetch_sdist((args.cache or default_cache()) / "sdist")
            print(pack(archive, args.pack))
            return 0
        print(build(cuda=args.cuda, cache=args.cache, source=args.source, jobs=args.jobs))
    except BuildError as exc:
        print(f"elsa-tune: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

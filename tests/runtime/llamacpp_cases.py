"""The llama-server cases behind ``tests/runtime/logs/llamacpp/``: how each log is captured from the real binary.

Each ``Case`` is one launch of ``llama-server`` on 127.0.0.1 (in its own process group, always killed) against
tiny GGUF models this module writes with the ``gguf`` package: ``tiny.gguf`` (LLaMA, 2 layers, a 269-token
SentencePiece vocabulary with byte fallback), ``draft.gguf`` (same vocabulary, 1 layer) and ``draft-bad.gguf``
(400 more tokens: an incompatible vocabulary). Models are passed by relative path from the work folder, so the
logs name ``tiny.gguf`` wherever they were captured. Regenerate the fixtures with::

    python tests/runtime/llamacpp_cases.py [--binary PATH] [CASE ...]

The binary is ``$ELSA_LLAMA_SERVER`` or the CPU build ``runtime/llamacpp/build.py`` caches.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

FIXTURES = Path(__file__).parent / "logs" / "llamacpp"
_F32_KV_BYTES_PER_CELL = 2 * 32 * 4 * 2          # tiny.gguf: 2 layers × 32 KV dims × f32 × (K, V)


def binary() -> Path | None:
    """``$ELSA_LLAMA_SERVER``, else the cached CPU build; ``None`` when neither exists."""
    from elsa_tune.runtime.llamacpp.build import Build, default_cache

    named = os.environ.get("ELSA_LLAMA_SERVER")
    path = Path(named) if named else Build(default_cache(), cuda=False).binary
    return path if path.is_file() and os.access(path, os.X_OK) else None


def write_model(path: Path, *, layers: int = 2, extra_tokens: int = 0, seed: int = 0) -> Path:
    """A tiny random LLaMA GGUF at ``path`` (64 hidden, 4 heads, 2 KV heads, 2,048 training context)."""
    import gguf

    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny")
    writer.add_context_length(2048)
    writer.add_embedding_length(64)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(128)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_rope_dimension_count(16)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256))]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL] + [gguf.TokenType.BYTE] * 256
    words = ["▁the", "▁a", "▁of", "▁and", "▁to", "▁in", "▁is", "▁it", "▁hello", "▁world"]
    words += [f"▁w{i}" for i in range(extra_tokens)]
    tokens += words
    types += [gguf.TokenType.NORMAL] * len(words)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * 259 + [-float(i) for i in range(len(words))])
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_chat_template("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                             "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

    def weight(*shape: int) -> np.ndarray[Any, np.dtype[np.float32]]:
        return (rng.standard_normal(shape) * 0.05).astype(np.float32)

    writer.add_tensor("token_embd.weight", weight(len(tokens), 64))
    writer.add_tensor("output_norm.weight", np.ones(64, np.float32))
    writer.add_tensor("output.weight", weight(len(tokens), 64))
    for i in range(layers):
        for name, shape in (("attn_q", (64, 64)), ("attn_k", (32, 64)), ("attn_v", (32, 64)),
                            ("attn_output", (64, 64)), ("ffn_gate", (128, 64)), ("ffn_up", (128, 64)),
                            ("ffn_down", (64, 128))):
            writer.add_tensor(f"blk.{i}.{name}.weight", weight(*shape))
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(64, np.float32))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(64, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_models(folder: Path) -> None:
    """``tiny.gguf``, ``draft.gguf`` and ``draft-bad.gguf`` in ``folder``."""
    write_model(folder / "tiny.gguf")
    write_model(folder / "draft.gguf", layers=1, seed=1)
    write_model(folder / "draft-bad.gguf", layers=1, seed=2, extra_tokens=400)


def _host_oom_ctx() -> int:
    """A -c whose f32 KV cache is 1.25× this machine's RAM (a power of two), so --fit reports it cannot fit."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    cells = 1
    while cells * _F32_KV_BYTES_PER_CELL < total * 1.25:
        cells *= 2
    return cells


@dataclass(frozen=True)
class Case:
    """One launch: its flags after ``--host/--port``, whether it should serve, and how it is constrained."""

    args: Callable[[], Sequence[str]]
    serves: bool
    env: dict[str, str] = field(default_factory=dict)
    address_space: Callable[[], int] | None = None   # RLIMIT_AS in bytes
    hold_port: bool = False
    long_prompt: bool = False


CASES: dict[str, Case] = {
    "normal_c4096_np4": Case(lambda: ["-m", "tiny.gguf", "-c", "4096", "-np", "4"], serves=True),
    "fit_np_auto": Case(lambda: ["-m", "tiny.gguf"], serves=True),
    "fit_ctx_unset_np2": Case(lambda: ["-m", "tiny.gguf", "-np", "2"], serves=True),
    "host_oom_kv": Case(lambda: ["-m", "tiny.gguf", "-c", str(_host_oom_ctx()), "-np", "1", "-ctk", "f32",
                                 "-ctv", "f32"], serves=False,
                        address_space=lambda: _host_oom_ctx() * 64 + (1 << 30)),
    "host_oom_bad_alloc": Case(lambda: ["-m", "tiny.gguf", "-c", "40000000", "-np", "1"], serves=False,
                               address_space=lambda: 2 << 30),
    "compute_buffer_oom": Case(lambda: ["-m", "tiny.gguf", "-c", "4194304", "-np", "1", "-fa", "off"], serves=False,
                               address_space=lambda: 3 << 30),
    "bad_flag": Case(lambda: ["-m", "tiny.gguf", "--no-such-flag"], serves=False),
    "bad_value_ctk": Case(lambda: ["-m", "tiny.gguf", "-ctk", "foo"], serves=False),
    "bad_value_fa": Case(lambda: ["-m", "tiny.gguf", "-fa", "maybe"], serves=False),
    "quantized_v_without_fa": Case(lambda: ["-m", "tiny.gguf", "-ctv", "q8_0", "-fa", "off"], serves=False),
    "missing_model": Case(lambda: ["-m", "no-such-model.gguf"], serves=False),
    "port_in_use": Case(lambda: ["-m", "tiny.gguf", "-c", "4096", "-np", "4"], serves=False, hold_port=True),
    "draft_incompatible": Case(lambda: ["-m", "tiny.gguf", "-md", "draft-bad.gguf", "--spec-type", "draft-simple",
                                        "-c", "4096", "-np", "2"], serves=True),
    "draft_unused": Case(lambda: ["-m", "tiny.gguf", "-md", "draft.gguf", "-c", "4096", "-np", "2"], serves=True),
    "draft_active": Case(lambda: ["-m", "tiny.gguf", "-md", "draft.gguf", "--spec-type", "draft-simple", "-c", "4096",
                                  "-np", "2"], serves=True),
    "env_overridden": Case(lambda: ["-m", "tiny.gguf", "-c", "4096"], serves=True,
                           env={"LLAMA_ARG_CTX_SIZE": "2048", "LLAMA_ARG_N_PARALLEL": "2"}),
    "context_exceeded": Case(lambda: ["-m", "tiny.gguf", "-c", "512", "-np", "1"], serves=True, long_prompt=True),
}


@dataclass(frozen=True)
class Captured:
    """What one case produced: the merged stdout/stderr log, the exit code (``None`` when we stopped a
    serving server), ``/props`` + ``/slots`` while it served, and the long prompt's HTTP error body."""

    log: str
    exit_code: int | None
    info: dict[str, Any] | None
    response: dict[str, Any] | None
    argv: list[str]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def capture(name: str, server: Path, workdir: Path, timeout_s: float = 60.0) -> Captured:
    """Run case ``name`` with ``server`` in ``workdir`` (which holds the models) and return what it wrote."""
    case = CASES[name]
    port = _free_port()
    argv = [str(server), "--host", "127.0.0.1", "--port", str(port), "--metrics", "-lv", "4", *case.args()]
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_ARG_")} | case.env
    limit = case.address_space() if case.address_space else None

    def constrain() -> None:
        if limit is not None:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    holder = socket.socket() if case.hold_port else None
    log_path = workdir / f"{name}.log"
    info: dict[str, Any] | None = None
    response: dict[str, Any] | None = None
    try:
        if holder is not None:
            holder.bind(("127.0.0.1", port))
            holder.listen()
        with log_path.open("wb") as out:
            process = subprocess.Popen(argv, cwd=workdir, stdout=out, stderr=subprocess.STDOUT, env=env,
                                       stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=constrain)
        try:
            info, response = _while_serving(process, port, case, timeout_s)
        finally:
            exit_code = _stop(process)
    finally:
        if holder is not None:
            holder.close()
    return Captured(log_path.read_text(errors="replace"), None if info is not None else exit_code, info, response,
                    argv)


def _while_serving(process: subprocess.Popen[bytes], port: int, case: Case,
                   timeout_s: float) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if _get(f"{base}/health").get("status") == "ok":
                break
        except (OSError, ValueError):
            pass
        time.sleep(0.1)
    else:
        return None, None
    info = dict(_get(f"{base}/props"))
    info["slots"] = _get(f"{base}/slots")
    response = None
    if case.long_prompt:
        body = json.dumps({"prompt": "hello world " * 300, "n_predict": 4}).encode()
        request = urllib.request.Request(f"{base}/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        try:
            urllib.request.urlopen(request, timeout=10).close()
        except urllib.error.HTTPError as error:
            response = json.loads(error.read())
        time.sleep(0.2)
    return info, response


def _stop(process: subprocess.Popen[bytes]) -> int:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            return process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
    return process.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description="regenerate tests/runtime/logs/llamacpp/ from the real llama-server")
    parser.add_argument("--binary", type=Path, default=None)
    parser.add_argument("--work", type=Path, default=Path("/tmp/elsa-llamacpp-cases"))
    parser.add_argument("cases", nargs="*", default=list(CASES))
    args = parser.parse_args()
    server = args.binary or binary()
    if server is None:
        parser.error("no llama-server: pass --binary or build it (python -m elsa_tune.runtime.llamacpp.build)")
    args.work.mkdir(parents=True, exist_ok=True)
    write_models(args.work)
    FIXTURES.mkdir(parents=True, exist_ok=True)
    (FIXTURES / "help.txt").write_text(subprocess.run([str(server), "--help"], capture_output=True, text=True,
                                                      check=True).stdout)
    for name in args.cases:
        captured = capture(name, server, args.work)
        (FIXTURES / f"{name}.log").write_text(captured.log)
        meta = {"argv": ["llama-server", *captured.argv[1:]], "exit_code": captured.exit_code, "info": captured.info,
                "response": captured.response}
        (FIXTURES / f"{name}.json").write_text(json.dumps(meta, indent=1) + "\n")
        print(f"{name}: exit {captured.exit_code}, {len(captured.log.splitlines())} lines")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

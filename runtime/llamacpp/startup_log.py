"""``build_report``: what one ``llama-server`` boot really produced, from its ``-lv 4`` log, ``/props`` and ``/slots``.

The lines it reads (llama.cpp 0c1e570; the brackets are the ``BootReport`` fields)::

    common_params_print_info: build 0 (0c1e570) with GNU 12.2.0 …     [runtime_version b0-0c1e570]
    llama_context: n_ctx                 = 4096                       [max_total_num_tokens]
    llama_context: n_ctx_seq             = 1024                       (each slot's share unless unified)
    llama_kv_cache: size =    1.00 MiB (  1024 cells,   2 layers,  4/4 seqs), K (f16): …, V (f16): …
                                                                      [kv_pool_gb, kv_pool_tokens, kv_dtype]
    load_tensors: offloaded 23/23 layers to GPU                       [layers_offloaded, layers_total]
    load_tensors:        CUDA0 model buffer size =  1973.35 MiB       [buffers, weights_mem_gb]
    srv    load_model: initializing, n_slots = 4, n_ctx_slot = 1024, kv_unified = 'false'
                                                                      [max_running_requests, context_len, kv_unified]
    srv  llama_server: listening on http://127.0.0.1:8080             [boot_seconds]

The KV cells of the line are per stream: one stream per slot unless the cache is unified, so the pool holds
``cells × streams`` tokens. Lines after ``loading draft model`` belong to the draft and are reported as
``draft-…`` buffers. Adjustments come from the log alone where it proves them (``-np`` auto resolved, ``--fit``
deriving an unset ``-c`` or ``-ngl``, a draft that is never used) and from the candidate's requested flags
otherwise (a ``-c`` split across slots, rounded batch sizes, cache types); each carries the line that proves it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from elsa_tune.runtime.boot_report import Adjustment, BootPhase, BootReport, DeviceBuffer
from elsa_tune.runtime.llamacpp.flags import KNOWN_ENV, canonical
from elsa_tune.runtime.llamacpp.log_lines import READY_LINE, LogLine, split_lines
from elsa_tune.runtime.log_lines import first
from elsa_tune.search_spaces.candidate import Candidate

_VERSION = re.compile(r"\bbuild (?P<number>\d+) \((?P<commit>[0-9a-f]{6,40})\)")
_TRAIN_CTX = re.compile(r"^print_info: n_ctx_train\s+= (\d+)")
_CONTEXT = re.compile(r"^llama_context: (?P<key>n_seq_max|n_ctx|n_ctx_seq|n_batch|n_ubatch|causal_attn|flash_attn"
                      r"|kv_unified)\s+= (?P<value>\S+)$")
_KV = re.compile(r"llama_kv_cache: size =\s*(?P<mib>[\d.]+) MiB \(\s*(?P<cells>\d+) cells,\s*(?P<layers>\d+) layers,"
                 r"\s*(?P<seqs>\d+)/(?P<streams>\d+) seqs\), K \((?P<k>\w+)\):[^,]*, V \((?P<v>\w+)\)")
_BUFFER = re.compile(r"^(?:load_tensors|llama_kv_cache|llama_context|sched_reserve):\s+(?P<device>\S+)\s+"
                     r"(?P<kind>model|KV|output|compute) buffer size =\s*(?P<mib>[\d.]+) MiB")
_OFFLOADED = re.compile(r"offloaded (?P<done>\d+)/(?P<total>\d+) layers to GPU")
_SLOTS = re.compile(r"initializing, n_slots = (?P<slots>\d+), n_ctx_slot = (?P<ctx>\d+), kv_unified = '(?P<u>\w+)'")
_NP_AUTO = re.compile(r"n_parallel is set to auto, using n_parallel = (?P<np>\d+) and kv_unified = (?P<u>\w+)")
_FIT_UNSET = re.compile(r"context size unset and KV cache not unified -> using (?P<ctx>\d+) for (?P<seqs>\d+) "
                        r"sequences")
_FIT_REDUCED = re.compile(r"context size reduced from (?P<old>\d+) to (?P<new>\d+)")
_FIT_USER_CTX = re.compile(r"context size set by user to (?P<ctx>\d+) -> no change")
_FIT_FAILED = re.compile(r"failed to fit params to free device memory: (?P<why>.*)")
_FIT_LAYERS = re.compile(r"^common_params_fit_impl:\s+- (?P<device>.+?):\s*(?P<layers>\d+) layers "
                         r"\(\s*\d+ overflowing\)")
_FIT_SECONDS = re.compile(r"fitting params to free memory took (?P<s>[\d.]+) seconds")
_MODEL = re.compile(r"load_model: loading model '(?P<path>[^']*)'")
_DRAFT = re.compile(r"loading draft model '(?P<path>[^']*)'")
_SPEC_NONE = re.compile(r"no implementations specified for speculative decoding")
_SPEC_ADDED = re.compile(r"adding speculative implementation '(?P<type>[^']+)'")
_SPEC_OK = re.compile(r"speculative decoding context initialized")
_SPEC_VOCAB = re.compile(r"the target and draft vocabs are not compatible")
_SPEC_FAILED = re.compile(r"failed to initialize speculative decoding context")
_FA_OFF = re.compile(r"Flash Attention not supported, set to disabled")
_FA_ON = re.compile(r"resolve_fused_ops: Flash Attention enabled")
_ROUNDED = re.compile(r"n_ctx is not divisible by n_seq_max - rounding down to (?P<ctx>\d+)")
_PROMPT_CACHE = re.compile(r"prompt cache is enabled, size limit: (?P<mib>\d+) MiB")
_ENV_OVERRIDDEN = re.compile(r"warn: (?P<env>LLAMA_ARG_\w+) environment variable is set, but will be overwritten "
                             r"by command line argument (?P<arg>\S+)")
_OVERFLOW = re.compile(r"n_ctx_seq \(\d+\) > n_ctx_train \(\d+\) -- possible training context overflow"
                       r"|the slot context \(\d+\) exceeds the training context")
_QUIET_WARNINGS = ("security: no API key", "server default port will be changed", "cancel task")

_MARKERS = (("fit", re.compile(r"fitting params to device memory"), re.compile(r"fitting params to free memory took")),
            ("load_weights", re.compile(r"loading model tensors"), re.compile(r"constructing llama_context")),
            ("context", re.compile(r"constructing llama_context"), re.compile(r"sched_reserve: reserve took")),
            ("warmup", re.compile(r"warming up the model"), re.compile(r"loading draft model|initializing, n_slots")),
            ("draft", _DRAFT, re.compile(r"initializing, n_slots")))


@dataclass
class _Facts:
    """What the target's lines say, each with the line that says it."""

    lines: list[LogLine]
    context: dict[str, tuple[str, LogLine]] = field(default_factory=dict)
    found: dict[str, tuple[LogLine, re.Match[str]]] = field(default_factory=dict)

    def value(self, key: str) -> str | None:
        return self.context[key][0] if key in self.context else None

    def number(self, key: str) -> int | None:
        value = self.value(key)
        return int(value) if value is not None and value.isdigit() else None


_SINGLE = {"version": _VERSION, "train_ctx": _TRAIN_CTX, "kv": _KV, "offloaded": _OFFLOADED, "slots": _SLOTS,
           "np_auto": _NP_AUTO, "fit_unset": _FIT_UNSET, "fit_reduced": _FIT_REDUCED, "fit_user_ctx": _FIT_USER_CTX,
           "fit_failed": _FIT_FAILED, "fit_layers": _FIT_LAYERS, "fit_seconds": _FIT_SECONDS, "model": _MODEL,
           "draft": _DRAFT, "spec_none": _SPEC_NONE, "spec_added": _SPEC_ADDED, "spec_ok": _SPEC_OK,
           "spec_vocab": _SPEC_VOCAB, "spec_failed": _SPEC_FAILED, "fa_off": _FA_OFF, "fa_on": _FA_ON,
           "rounded": _ROUNDED, "prompt_cache": _PROMPT_CACHE, "ready": re.compile(re.escape(READY_LINE)),
           "overflow": _OVERFLOW}
_AFTER_DRAFT = ("slots", "spec_none", "spec_added", "spec_ok", "spec_vocab", "spec_failed", "prompt_cache", "ready")


def _facts(lines: list[LogLine]) -> tuple[_Facts, list[DeviceBuffer]]:
    facts = _Facts(lines)
    buffers: list[DeviceBuffer] = []
    in_draft = False
    for line in lines:
        if _DRAFT.search(line.text):
            in_draft = True
        buffer = _BUFFER.search(line.text)
        if buffer:
            kind = buffer["kind"].lower()
            buffers.append(DeviceBuffer(buffer["device"], f"draft-{kind}" if in_draft else kind, float(buffer["mib"])))
        context = _CONTEXT.search(line.text)
        if context and not in_draft:
            facts.context.setdefault(context["key"], (context["value"], line))
        for key, pattern in _SINGLE.items():
            if key in facts.found or (in_draft and key not in _AFTER_DRAFT and key != "draft"):
                continue
            match = pattern.search(line.text)
            if match:
                facts.found[key] = (line, match)
    return facts, buffers


def _phases(lines: Sequence[LogLine]) -> tuple[BootPhase, ...]:
    phases = []
    for name, start, end in _MARKERS:
        begun = first(lines, start)
        if begun is None or begun[0].seconds is None:
            continue
        after = lines[lines.index(begun[0]) + 1:]
        ended = first(after, end)
        if ended is None or ended[0].seconds is None:
            continue
        seconds = ended[0].seconds - begun[0].seconds
        fit = _FIT_SECONDS.search(ended[0].text) if name == "fit" else None
        phases.append(BootPhase(name, round(float(fit["s"]) if fit else seconds, 3)))
    return tuple(phases)


def parse_log(log_text: str) -> BootReport:
    """The ``BootReport`` of a ``llama-server`` log alone (no adjustments, no info endpoints)."""
    lines = split_lines(log_text)
    facts, buffers = _facts(lines)
    found = facts.found
    kv = found.get("kv")
    slots = found.get("slots")
    offloaded = found.get("offloaded")
    unified = facts.value("kv_unified")
    model_mib = [b.mib for b in buffers if b.kind == "model"]
    speculative: bool | None = None
    if "spec_ok" in found:
        speculative = True
    elif any(k in found for k in ("spec_none", "spec_vocab", "spec_failed")):
        speculative = False
    version = found.get("version")
    ready = found.get("ready")
    args: dict[str, Any] = {key: _value(value) for key, (value, _) in facts.context.items()}
    if "train_ctx" in found:
        args["n_ctx_train"] = int(found["train_ctx"][1].group(1))
    if "fa_on" in found or "fa_off" in found:
        args["flash_attn_resolved"] = "fa_on" in found
    for key, group in (("model", "path"), ("draft", "path"), ("spec_added", "type")):
        if key in found:
            args[{"model": "model", "draft": "model_draft", "spec_added": "spec_type"}[key]] = found[key][1][group]
    streams = int(kv[1]["streams"]) if kv else None
    return BootReport(
        runtime_version=f"b{version[1]['number']}-{version[1]['commit']}" if version else None,
        pool_fixed_by_context=True,
        max_total_num_tokens=facts.number("n_ctx"),
        max_running_requests=int(slots[1]["slots"]) if slots else None,
        context_len=int(slots[1]["ctx"]) if slots else facts.number("n_ctx_seq"),
        weights_mem_gb=round(sum(model_mib) / 1024, 6) if model_mib else None,
        kv_pool_tokens=int(kv[1]["cells"]) * streams if kv and streams else None,
        kv_pool_gb=round(float(kv[1]["mib"]) / 1024, 6) if kv else None,
        kv_dtype=(kv[1]["k"] if kv[1]["k"] == kv[1]["v"] else f"K {kv[1]['k']}, V {kv[1]['v']}") if kv else None,
        boot_seconds=ready[0].seconds if ready else None,
        phases=_phases(lines),
        server_args=args,
        buffers=tuple(buffers),
        layers_offloaded=int(offloaded[1]["done"]) if offloaded else None,
        layers_total=int(offloaded[1]["total"]) if offloaded else None,
        kv_unified=(unified == "true") if unified is not None else (slots[1]["u"] == "true" if slots else None),
        speculative=speculative,
        warnings=tuple(_log_warnings(facts)),
    )


def _value(text: str) -> Any:
    if text.isdigit():
        return int(text)
    return {"true": True, "false": False}.get(text, text)


def _log_warnings(facts: _Facts) -> list[str]:
    found = facts.found
    warnings = []
    if "fit_user_ctx" in found:
        warnings.append(f"--fit leaves a -c set by the user alone, and this one does not fit "
                        f"({found['fit_user_ctx'][0].text}); lower -c or -np, or quantize the KV cache "
                        "(-ctk q8_0 -ctv q8_0 -fa on)")
    elif "fit_failed" in found:
        warnings.append(f"--fit could not fit the model: {found['fit_failed'][1]['why']}")
    if "overflow" in found:
        warnings.append(f"the slot context exceeds the model's training context: {found['overflow'][0].text}")
    if "prompt_cache" in found:
        warnings.append(f"the prompt cache is on ({found['prompt_cache'][1]['mib']} MiB): repeated prompts are served "
                        "from the cache, so benchmark with unique prompts (or --cache-ram 0)")
    for line in facts.lines:
        overridden = _ENV_OVERRIDDEN.search(line.text)
        if overridden:
            warnings.append(f"{overridden['env']} is set in the environment (here overridden by "
                            f"{overridden['arg']}): any other LLAMA_ARG_* variable changes a launch silently")
        elif (line.level == "W" and "listening on" not in line.text
              and not any(quiet in line.text for quiet in _QUIET_WARNINGS) and not _OVERFLOW.search(line.text)
              and not _FIT_FAILED.search(line.text)):
            warnings.append(line.text)
        if "ready" in found and line is found["ready"][0]:
            break
    return warnings


def merge_server_info(report: BootReport, info: Mapping[str, Any]) -> BootReport:
    """Lay ``/props`` (``total_slots``, ``build_info``, ``default_generation_settings.n_ctx``) and ``/slots``
    (under ``"slots"``: each slot's ``n_ctx`` and ``speculative``) over what the log said."""
    changes: dict[str, Any] = {}
    if isinstance(info.get("build_info"), str) and report.runtime_version is None:
        changes["runtime_version"] = info["build_info"]
    if isinstance(info.get("total_slots"), int):
        changes["max_running_requests"] = info["total_slots"]
    settings = info.get("default_generation_settings")
    if isinstance(settings, Mapping) and isinstance(settings.get("n_ctx"), int):
        changes["context_len"] = settings["n_ctx"]
    slots = [s for s in info.get("slots") or () if isinstance(s, Mapping)]
    if slots:
        changes["max_running_requests"] = len(slots)
        if all(isinstance(s.get("n_ctx"), int) for s in slots):
            changes["context_len"] = min(int(s["n_ctx"]) for s in slots)
        flags = [s["speculative"] for s in slots if isinstance(s.get("speculative"), bool)]
        if flags:
            changes["speculative"] = any(flags)
    return replace(report, **changes)


def find_adjustments(report: BootReport, log_text: str, candidate: Candidate | None = None) -> tuple[Adjustment, ...]:
    """Flags whose effective value differs from the requested (or unset) one, each with its evidence line.

    Without a candidate only what the log itself proves is reported (``-np`` auto, ``--fit`` re-deriving an
    unset ``-c`` or ``-ngl``, an unusable or unused draft); a candidate adds its requested values and
    ``LLAMA_ARG_*`` variables in its environment.
    """
    facts, _ = _facts(split_lines(log_text))
    requested: dict[str, Any] = {}
    env: Mapping[str, str] = {}
    if candidate is not None:
        requested = {canonical(k): v for k, v in candidate.flags.items() if v is not None and v is not False}
        env = candidate.env
    found: dict[str, Adjustment] = {}
    for adjust in (_context, _slots, _layers, _batches, _cache_types, _kv_unified, _draft):
        for adjustment in adjust(facts, report, requested):
            found.setdefault(adjustment.flag, adjustment)
    for var, value in env.items():
        flag = KNOWN_ENV.get(var)
        if flag and flag not in requested and flag not in found:
            found[flag] = Adjustment(flag, None, value, f"environment: {var}={value}",
                                     reason=f"set by the environment variable {var}, not by a flag")
    return tuple(found.values())


def _context(facts: _Facts, report: BootReport, requested: Mapping[str, Any]) -> list[Adjustment]:
    found = facts.found
    asked = _int(requested.get("ctx-size"))
    n_ctx = facts.number("n_ctx")
    per_slot = report.context_len
    if asked:
        if per_slot is not None and per_slot < asked and not report.kv_unified:
            seq = facts.context.get("n_ctx_seq")
            evidence = seq[1].raw if seq and int(seq[0]) == per_slot else found["slots"][0].raw
            slots = report.max_running_requests or facts.number("n_seq_max")
            return [Adjustment("ctx-size", requested["ctx-size"], per_slot, evidence,
                               reason=f"split across {slots} slots: each request holds {per_slot} tokens "
                                      "(-c is the total of all slots unless the KV cache is unified)")]
        if n_ctx is not None and n_ctx != asked:
            line = found["rounded"][0] if "rounded" in found else facts.context["n_ctx"][1]
            return [Adjustment("ctx-size", requested["ctx-size"], n_ctx, line.raw,
                               reason="the runtime rounded the context (a multiple of 256 per slot)")]
        return []
    if "fit_reduced" in found:
        line, match = found["fit_reduced"]
        return [Adjustment("ctx-size", None, int(match["new"]), line.raw,
                           reason=f"--fit reduced the unset context from {match['old']} to fit the free memory")]
    if "fit_unset" in found:
        line, match = found["fit_unset"]
        return [Adjustment("ctx-size", None, int(match["ctx"]), line.raw,
                           reason=f"unset -c: --fit sized it to the model's training context for each of "
                                  f"{match['seqs']} slots")]
    if requested and n_ctx is not None:
        return [Adjustment("ctx-size", None, n_ctx, facts.context["n_ctx"][1].raw,
                           reason="unset -c: the model's training context")]
    return []


def _slots(facts: _Facts, report: BootReport, requested: Mapping[str, Any]) -> list[Adjustment]:
    found = facts.found
    asked = _int(requested.get("parallel"))
    if "np_auto" in found and (asked is None or asked < 0):
        line, match = found["np_auto"]
        pool = "sharing one unified KV pool" if match["u"] == "true" else "each with its own KV share"
        return [Adjustment("parallel", requested.get("parallel"), int(match["np"]), line.raw,
                           reason=f"-np auto resolved to {match['np']} slots {pool}")]
    if asked and asked > 0 and report.max_running_requests is not None and report.max_running_requests != asked:
        evidence = found["slots"][0].raw if "slots" in found else f"/slots lists {report.max_running_requests} slots"
        return [Adjustment("parallel", requested["parallel"], report.max_running_requests, evidence,
                           reason="the server runs a different number of slots")]
    return []


def _layers(facts: _Facts, report: BootReport, requested: Mapping[str, Any]) -> list[Adjustment]:
    found = facts.found
    if report.layers_offloaded is None or report.layers_total is None or "offloaded" not in found:
        return []
    raw = requested.get("n-gpu-layers")
    asked = _int(raw)
    if raw is None or str(raw) == "auto":
        if "fit_layers" in found:
            return [Adjustment("n-gpu-layers", raw, report.layers_offloaded, found["fit_layers"][0].raw,
                               reason=f"--fit placed {report.layers_offloaded} of {report.layers_total} layers "
                                      "on the GPU for the free memory")]
        return []
    expected = report.layers_total if str(raw) == "all" or asked is None else min(asked, report.layers_total)
    if report.layers_offloaded < expected:
        return [Adjustment("n-gpu-layers", raw, report.layers_offloaded, found["offloaded"][0].raw,
                           reason=f"only {report.layers_offloaded} of {report.layers_total} layers went to the GPU")]
    return []


def _batches(facts: _Facts, report: BootReport, requested: Mapping[str, Any]) -> list[Adjustment]:
    adjustments = []
    for flag, key in (("batch-size", "n_batch"), ("ubatch-size", "n_ubatch")):
        asked = _int(requested.get(flag))
        effective = facts.number(key)
        if asked is not None and effective is not None and asked != effective:
            adjustments.append(Adjustment(flag, requested[flag], effective, facts.context[key][1].raw,
                                          reason=f"the context runs {key} = {effective}"))
    return adjustments


def _cache_types(facts: _Facts, report: BootReport, requested: Mapping[str, Any]) -> list[Adjustment]:
    kv = facts.found.get("kv")
    if kv is None:
        return []
    adjustments = []
    for flag, group in (("cache-type-k", "k"), ("cache-type-v", "v")):
        asked = requested.get(flag)
        if asked is not None and str(asked).lower() != kv[1][group]:
            adjustments.append(Adjustment(flag, asked, kv[1][group], kv[0].raw,
                                          reason="the KV cache holds another type"))
    return adjustments


def _kv_unified(facts: _Facts, report: BootReport, requested: Mapping[str, Any]) -> list[Adjustment]:
    line = facts.context.get("kv_unified")
    if line is None or report.kv_unified is None:
        return []
    for flag, wanted in (("kv-unified", True), ("no-kv-unified", False)):
        if requested.get(flag) is True and report.kv_unified is not wanted:
            return [Adjustment(flag, True, report.kv_unified, line[1].raw,
                               reason="the context reports another kv_unified")]
    return []


def _draft(facts: _Facts, report: BootReport, requested: Mapping[str, Any]) -> list[Adjustment]:
    found = facts.found
    if "draft" not in found:
        return []
    path = requested.get("model-draft", found["draft"][1]["path"])
    if "spec_vocab" in found:
        return [Adjustment("model-draft", path, None, found["spec_vocab"][0].raw,
                           reason="the draft's vocabulary does not match the target's: the server serves on "
                                  "without speculative decoding")]
    if "spec_failed" in found:
        return [Adjustment("model-draft", path, None, found["spec_failed"][0].raw,
                           reason="speculative decoding failed to start: the server serves on without it")]
    if "spec_none" in found:
        return [Adjustment("model-draft", path, None, found["spec_none"][0].raw,
                           reason="the draft model is loaded (its memory is spent) but never used: no --spec-type "
                                  "names a draft type (e.g. --spec-type draft-simple)")]
    return []


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        return int(str(value))
    except ValueError:
        return None


def build_report(log_text: str, candidate: Candidate | None = None,
                 info: Mapping[str, Any] | None = None) -> BootReport:
    """The ``BootReport`` of one boot: the log, then ``/props`` + ``/slots`` (``info``), then the adjustments
    and the warnings the numbers imply. Never raises on any text."""
    report = parse_log(log_text)
    if info:
        report = merge_server_info(report, info)
    report = replace(report, adjustments=find_adjustments(report, log_text, candidate))
    return replace(report, warnings=tuple(dict.fromkeys((*report.warnings, *_derived_warnings(report)))))


def _derived_warnings(report: BootReport) -> list[str]:
    warnings = []
    slots = report.max_running_requests
    if report.kv_unified and slots and slots > 1:
        warnings.append(f"the KV cache is one unified pool of {_n(report.kv_pool_tokens)} cells shared by {slots} "
                        "slots: a request may grow to the whole pool, but when the pool fills every running "
                        "generation is aborted (set -np N --no-kv-unified for a fixed share per slot)")
    if any(a.requested is None and "--fit" in a.reason for a in report.adjustments):
        warnings.append("--fit is on (the default): the unset -c / -ngl were derived from the memory free at this "
                        "boot, so another boot of the same flags can differ (set them, or --fit off)")
    return warnings


def _n(value: int | None) -> str:
    return "?" if value is None else f"{value:,}"

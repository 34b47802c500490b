"""Startup-log parsing on real SGLang log lines (``tests/runtime/logs``, each citing its source)."""

from __future__ import annotations

from pathlib import Path

import pytest

from elsa_tune.runtime.startup_log import (
    build_report,
    looks_booted,
    merge_server_info,
    parse_log,
    parse_server_args,
    split_lines,
)
from elsa_tune.search_spaces.candidate import Candidate

LOGS = Path(__file__).parent / "logs"


def log(name: str) -> str:
    text = (LOGS / name).read_text()
    assert text.startswith("# source: "), f"{name} must cite its source on the first line"
    return text


def test_every_fixture_cites_a_source() -> None:
    names = sorted(p.name for p in LOGS.glob("*.log"))
    assert len(names) >= 5
    for name in names:
        first = (LOGS / name).read_text().splitlines()[0]
        assert first.startswith("# source: "), name
        assert any(where in first for where in ("github.com", "code index", "produced on this project's build machine"))


def test_hybrid_mamba_tp2_log_reads_rank0_pools_and_summary() -> None:
    report = parse_log(log("hybrid_mamba_qwen35_tp2.log"))
    assert report.max_total_num_tokens == 327310
    assert report.max_running_requests == 62
    assert report.context_len == 262144
    assert report.chunked_prefill_size == 2048
    assert report.max_prefill_tokens == 16384
    assert report.available_gpu_mem_gb == pytest.approx(3.79)
    assert report.mamba_cache_size == 186
    assert report.mamba_pool_gb == pytest.approx(0.10 + 4.38)
    assert report.kv_pool_tokens == 327310
    assert report.kv_pool_gb == pytest.approx(5.0)
    assert report.kv_dtype == "torch.bfloat16"
    assert report.weights_mem_gb == pytest.approx(8.85)
    phases = {p.name: p for p in report.phases}
    assert phases["load_weights"].seconds == pytest.approx(5.54)   # TP0's own line, not TP1's 5.46
    assert phases["cuda_graph"].seconds == pytest.approx(4.86)
    assert phases["cuda_graph"].mem_usage_gb == pytest.approx(0.26)
    assert phases["memory_pool"].avail_mem_gb == pytest.approx(4.49)
    assert report.cuda_graph_mem_gb == pytest.approx(0.26)


def test_0523_log_without_max_running_requests_in_summary_and_ready_line() -> None:
    text = log("hybrid_mamba_ling_0523_ready.log")
    report = parse_log(text)
    assert looks_booted(text)
    assert report.max_total_num_tokens == 1226984
    assert report.max_running_requests is None      # this build's summary line omits it
    assert report.kv_pool_gb == pytest.approx(9.21)  # single "KV size" form
    assert report.mamba_cache_size == 117
    phases = {p.name: p for p in report.phases}
    assert phases["load_weights"].seconds == pytest.approx(329.53)
    assert phases["cuda_graph_target_decode"].seconds == pytest.approx(10.10)
    assert phases["warmup"].seconds == pytest.approx(22.0)   # summary 11:59:51 → ready 12:00:13
    assert report.boot_seconds == pytest.approx(376.0)        # first stamp 11:53:57 → ready


def test_spec_decoding_target_and_draft_graph_phases() -> None:
    report = parse_log(log("spec_eagle_draft_graph_10088.log"))
    phases = {p.name: p for p in report.phases}
    assert phases["cuda_graph"].seconds == pytest.approx(12.11)
    assert phases["cuda_graph_draft"].seconds == pytest.approx(62.67)
    assert report.cuda_graph_mem_gb == pytest.approx(0.54 + 0.21)


def test_decode_batch_lines_with_accept_len_do_not_confuse_the_parser() -> None:
    report = parse_log(log("spec_eagle3_accept_len_11948.log"))
    assert report.max_total_num_tokens is None and report.adjustments == () and report.phases == ()


def test_older_kv_line_without_dtype_and_many_ranks() -> None:
    report = parse_log(log("kv_pool_graph_begin_11716.log"))
    assert report.kv_pool_tokens == 2795207
    assert report.kv_pool_gb == pytest.approx(106.62)


def test_mamba_clamp_warning_becomes_an_adjustment_with_its_line() -> None:
    text = log("clamp_mamba_cap_38846.log")
    report = build_report(text, Candidate(flags={"max-running-requests": 32}))
    (adj,) = report.adjustments
    assert (adj.flag, adj.requested, adj.effective) == ("max-running-requests", 32, 9)
    assert adj.evidence.startswith("max_running_requests is capped to 9 by the mamba state cache")
    assert report.warnings and "capped to 9" in report.warnings[0]


def test_negative_profiled_kv_is_an_adjustment_of_max_total_tokens() -> None:
    report = build_report(log("no_room_for_kv_profiled_7691.log"), Candidate(flags={"max-total-tokens": 131072}))
    (adj,) = report.adjustments
    assert adj.flag == "max-total-tokens" and adj.effective == -561981
    assert "DP0 TP0" in adj.evidence
    assert len(report.warnings) == 1     # eight ranks print the same warning: kept once


def test_old_serverargs_repr_even_when_cut_off() -> None:
    report = parse_log(log("server_args_old_format_2591.log"))
    args = report.server_args
    assert args["model_path"] == "deepseek-ai/DeepSeek-V3"
    assert args["mem_fraction_static"] == 0.88
    assert args["max_running_requests"] is None
    assert args["trust_remote_code"] is True
    assert "show_tim" not in args


# ---- formats built from the 0.5.23 f-strings (sglang.md §2): prefixes, ms, DP, compose -----------

SEED_004_CLAMP = """\
[2026-02-27 17:10:20.123] server_args={'model_path': '/m', 'max_running_requests': 4, 'mem_fraction_static': 0.97, \
'enable_mixed_chunk': False, 'speculative_algorithm': 'EAGLE', 'mamba_radix_cache_strategy': 'extra_buffer_lazy', \
'page_size': 32, 'attention_backend': 'flashinfer', 'sampling_backend': <SamplingBackend.FLASHINFER: 1>}
[2026-02-27 17:10:28.456 TP0] Load weight end. elapsed=12.30 s, type=Qwen3_5ForConditionalGeneration, \
quant=modelopt_fp4, avail mem=11.20 GB, mem usage=18.59 GB.
[2026-02-27 17:10:29.001 TP0] max_total_num_tokens=134016, chunked_prefill_size=2048, max_prefill_tokens=16384, \
max_running_requests=2, context_len=159776, available_gpu_mem=0.68 GB
[2026-02-27 17:10:41.500] The server is fired up and ready to roll!
"""


def test_seed_004_silent_clamp_and_silently_ignored_flag() -> None:
    candidate = Candidate(flags={"max-running-requests": 4, "enable-mixed-chunk": True, "page-size": 32,
                                 "mem-fraction-static": 0.97, "context-length": 159776})
    report = build_report(SEED_004_CLAMP, candidate)
    by_flag = {a.flag: a for a in report.adjustments}
    assert set(by_flag) == {"max-running-requests", "enable-mixed-chunk"}
    clamp = by_flag["max-running-requests"]
    assert (clamp.requested, clamp.effective) == (4, 2)
    assert "max_running_requests=2" in clamp.evidence
    ignored = by_flag["enable-mixed-chunk"]
    assert ignored.effective is False and ignored.reason == "accepted and silently ignored"
    assert "'enable_mixed_chunk': False" in ignored.evidence
    assert report.server_args["sampling_backend"] == "<SamplingBackend.FLASHINFER: 1>"   # non-literal kept as text
    assert report.max_total_num_tokens == 134016 and report.context_len == 159776
    assert report.boot_seconds == pytest.approx(21.377)


def test_prefixes_dp_tp_and_compose_are_tolerated() -> None:
    text = ("sglang-1  | [2026-01-02 03:04:05 DP1 TP1] max_total_num_tokens=1, chunked_prefill_size=-1, "
            "max_prefill_tokens=2, max_running_requests=3, context_len=4, available_gpu_mem=5.00 GB\n"
            "sglang-1  | [2026-01-02 03:04:05 DP0 TP0] max_total_num_tokens=10, chunked_prefill_size=-1, "
            "max_prefill_tokens=20, max_running_requests=30, context_len=40, available_gpu_mem=50.00 GB\n")
    lines = split_lines(text)
    assert [ln.rank0 for ln in lines] == [False, True]
    report = parse_log(text)
    assert (report.max_total_num_tokens, report.chunked_prefill_size, report.max_running_requests) == (10, -1, 30)


def test_dp_attention_compares_per_dp_worker() -> None:
    text = ("[2026-01-02 03:04:05 DP0 TP0] max_total_num_tokens=10, chunked_prefill_size=8192, "
            "max_prefill_tokens=20, max_running_requests=16, context_len=40, available_gpu_mem=50.00 GB\n")
    same = build_report(text, Candidate(flags={"max-running-requests": 64, "dp-size": 4, "enable-dp-attention": True}))
    assert same.adjustments == ()


def test_server_info_fills_gaps_and_flags_disagreement() -> None:
    report = parse_log(log("hybrid_mamba_ling_0523_ready.log"))
    info = {"version": "0.5.23", "max_total_num_tokens": 1, "enable_mixed_chunk": False,
            "internal_states": [{"effective_max_running_requests_per_dp": 1,
                                 "memory_usage": {"weight": 80.0, "kvcache": 9.0, "graph": {"decode": 0.5}}}]}
    merged = merge_server_info(report, info)
    assert merged.runtime_version == "0.5.23"
    assert merged.max_running_requests == 1
    assert merged.max_total_num_tokens == 1226984     # the log wins where both speak
    assert merged.server_args["enable_mixed_chunk"] is False
    full = build_report(log("hybrid_mamba_ling_0523_ready.log"), Candidate(flags={"max-running-requests": 2}), info)
    (adj,) = full.adjustments
    assert (adj.flag, adj.effective) == ("max-running-requests", 1)


def test_server_args_parser_handles_nested_and_broken_values() -> None:
    args = parse_server_args("{'a': [1, 2], 'b': {'x': 'y, z'}, 'c': Foo(bar=1), 'd': 'it''s'}")
    assert args["a"] == [1, 2]
    assert args["c"] == "Foo(bar=1)"
    assert "b" in args


def test_report_round_trips_through_dict() -> None:
    from elsa_tune.runtime.boot_report import BootReport

    report = build_report(SEED_004_CLAMP, Candidate(flags={"max-running-requests": 4}))
    again = BootReport.from_dict(report.to_dict())
    assert again.adjustments == report.adjustments and again.phases == report.phases


def test_requested_mamba_slots_and_reported_numbers_are_compared() -> None:
    candidate = Candidate(flags={"max-mamba-cache-size": 64, "chunked-prefill-size": 8192,
                                 "context-length": 262144})
    report = build_report(log("hybrid_mamba_ling_0523_ready.log"), candidate)
    (adj,) = report.adjustments
    assert (adj.flag, adj.requested, adj.effective) == ("max-mamba-cache-size", 64, 117)
    assert "Mamba Cache is allocated. max_mamba_cache_size: 117" in adj.evidence


def test_pool_smaller_than_context_and_forced_overlap_off_are_warned() -> None:
    text = SEED_004_CLAMP.replace("'page_size': 32,", "'page_size': 32, 'disable_overlap_schedule': True,")
    report = build_report(text, Candidate(flags={"context-length": 159776}))
    assert any("one full-length request cannot fit" in w and "134016" in w for w in report.warnings)
    assert any("disable_overlap_schedule=True" in w for w in report.warnings)
    quiet = build_report(text, Candidate(flags={"disable-overlap-schedule": True}))
    assert not any("overlap" in w for w in quiet.warnings)


def test_hybrid_mamba_issue_log_with_older_dtype_form() -> None:
    report = build_report(log("hybrid_mamba_qwen35moe_issue1870.log"),
                          Candidate(flags={"max-running-requests": 1, "context-length": 8192}))
    assert (report.max_total_num_tokens, report.max_running_requests, report.context_len) == (580364, 1, 8192)
    assert report.mamba_cache_size == 82 and report.mamba_pool_gb == pytest.approx(0.13 + 7.29)
    assert report.kv_pool_gb == pytest.approx(8.30) and report.weights_mem_gb == pytest.approx(3.76)
    phases = {p.name: p for p in report.phases}
    assert phases["load_weights"].seconds == pytest.approx(653.47)
    assert phases["memory_pool"].seconds == pytest.approx(1.0)
    assert report.adjustments == ()


def test_post_capture_kv_sizing_form_and_labelled_pools() -> None:
    text = ("[2026-01-01 00:00:00 TP0] SWA KV Cache is allocated. dtype: torch.bfloat16, #tokens: 999, "
            "K size: 9.00 GB, V size: 9.00 GB\n"
            "[2026-01-01 00:00:00 TP0] KV Cache VA upper bound. dtype: torch.bfloat16, #tokens: 4096, "
            "K size: 1.00 GB, V size: 1.00 GB\n")
    report = parse_log(text)
    assert (report.kv_pool_tokens, report.kv_pool_gb) == (4096, 2.0)   # the full-attention pool, not the SWA one

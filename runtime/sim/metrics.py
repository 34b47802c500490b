"""SGLang 0.5.23's Prometheus metrics for the simulated server: same names, labels and buckets.

``SglangMetrics`` owns the collectors (SGLang's
``srt/observability/metrics_collector.py``) and renders the text exposition format the way
``prometheus_client`` does in multiprocess mode (no ``_created`` samples, ``le`` as Go floats). Tokenizer
metrics carry ``model_name`` and ``engine_type``; scheduler metrics add ``tp_rank``, ``pp_rank`` and
``moe_ep_rank``. Scheduler gauges are refreshed by the serving loop on prefill batches and every
``--decode-log-interval`` decode steps, so they go stale when idle, like SGLang's.
"""

from __future__ import annotations

import bisect
import math
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import TypeVar

LabelValues = tuple[str, ...]

TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080, 0.100,
               0.200, 0.400, 0.600, 0.800, 1, 2, 4, 6, 8)
E2E_BUCKETS = (*TTFT_BUCKETS, 600, 1200, 1800, 2400)
TOKEN_BUCKETS = (100, 300, 500, 700, 1000, 1500, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 9000, 10000, 12500,
                 15000, 17500, 20000, 22500, 25000, 27500, 30000, 35000, 40000, 60000, 80000, 100000, 200000,
                 300000, 400000, 600000, 800000, 1000000, 1100000)
QUEUE_BUCKETS = (0.000, 0.001, 0.005, 0.010, 0.050, 0.100, 0.200, 0.500, 1, 2, 3, 4, 5, 10, 15, 20, 30, 40, 50, 60,
                 70, 80, 90, 100, 200, 300, 400, 500, 600, 700, 800, 900, 1000, 1200, 1400, 1600, 1800, 2000,
                 2500, 3000)


#: The scheduler's gauges with SGLang 0.5.23's documentation (``srt/observability/metrics_collector.py``). What the
#: simulator puts in those whose meaning is not in their name, after SGLang's ``srt/managers/scheduler_components/``:
#: ``token_usage``/``full_token_usage`` = ``num_used / max_total_num_tokens`` with ``num_used = max_total_num_tokens
#: − (available + evictable)`` (``pool_stats_observer.py``, ``_get_token_info``): prompts the radix cache keeps
#: unlocked are not used, so an idle server with a warm cache reads 0; ``mamba_usage`` = the running requests'
#: state slots over the pool, cached prompts' states being evictable (``_get_mamba_token_info``);
#: ``gen_throughput`` = tokens generated since the last decode log over the time since it (``metrics_reporter.py``;
#: simulated seconds here); ``spec_accept_length`` = accepted tokens per verify forward over the last decode-log
#: interval (``metrics_reporter.py``, ``spec_num_accept_tokens / spec_num_forward_ct``, reset at each log), whereas
#: ``/server_info``'s ``avg_spec_accept_length`` is cumulative since start (``internal_state.py``,
#: ``_average_accept_length``: ``spec_total_num_accept_tokens / spec_total_num_forward_ct``).
SCHEDULER_GAUGES = {
    "num_running_reqs": "The number of running requests.",
    "num_queue_reqs": "The number of requests in the waiting queue.",
    "num_grammar_queue_reqs": "The number of requests in the grammar waiting queue.",
    "token_usage": "The token usage.",
    "full_token_usage": "The token usage for full attention layers.",
    "mamba_usage": "The token usage for Mamba layers.",
    "num_used_tokens": "The number of used tokens.",
    "kv_available_tokens": "Number of free token slots in the KV cache pool.",
    "kv_evictable_tokens": "Number of evictable (radix-cached) token slots in the KV cache pool.",
    "kv_used_tokens": "Number of actively used token slots in the KV cache pool.",
    "mamba_available_tokens": "Number of free state slots in the mamba SSM pool (hybrid-SSM only).",
    "mamba_evictable_tokens": "Number of evictable (radix-cached) state slots in the mamba SSM pool.",
    "mamba_used_tokens": "Number of actively used state slots in the mamba SSM pool.",
    "cache_hit_rate": "The prefix cache hit rate.",
    "gen_throughput": "The generation throughput (token/s).",
    "spec_accept_length": "Mean acceptance length of speculative decoding (accepted drafts + bonus token per forward).",
    "spec_accept_rate": "Speculative acceptance rate (`accepted drafts / proposed drafts` in batch).",
    "spec_num_steps": "Currently active speculative_num_steps.",
    "spec_num_draft_tokens": "Currently active speculative_num_draft_tokens (decouples from steps under topk>1).",
    "num_retracted_reqs": "The number of retracted requests.",
    "max_total_num_tokens": "Maximum total number of tokens in the KV cache pool.",
    "weight_memory_usage_gb": "Memory used by model weights in GB.",
    "kv_cache_memory_usage_gb": "Memory used by the KV cache pools in GB.",
    "page_size": "KV cache page size in tokens.",
    "num_pages": "Number of KV cache pages.",
    "context_len": "Maximum context length.",
    "startup_available_gpu_memory_gb": "Available GPU memory in GB at startup.",
}


class Metric:
    """One metric family: its name, help text, label names and ``kind`` (the ``# TYPE`` word); ``samples`` are its
    exposition lines."""

    kind = ""

    def __init__(self, name: str, doc: str, labels: Sequence[str]) -> None:
        self.name = name
        self.doc = doc
        self.labels = tuple(labels)

    def _key(self, values: Mapping[str, str]) -> LabelValues:
        return tuple(str(values[label]) for label in self.labels)

    def _label_text(self, key: LabelValues, extra: Iterable[tuple[str, str]] = ()) -> str:
        pairs = [*zip(self.labels, key, strict=True), *extra]
        if not pairs:
            return ""
        return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in pairs) + "}"

    def samples(self) -> list[str]:
        raise NotImplementedError


class Counter(Metric):
    kind = "counter"

    def __init__(self, name: str, doc: str, labels: Sequence[str]) -> None:
        super().__init__(name, doc, labels)
        self.values: dict[LabelValues, float] = {}

    def inc(self, labels: Mapping[str, str], amount: float = 1.0) -> None:
        key = self._key(labels)
        self.values[key] = self.values.get(key, 0.0) + amount

    def samples(self) -> list[str]:
        return [f"{self.name}{self._label_text(k)} {_num(v)}" for k, v in sorted(self.values.items())]


class Gauge(Metric):
    kind = "gauge"

    def __init__(self, name: str, doc: str, labels: Sequence[str]) -> None:
        super().__init__(name, doc, labels)
        self.values: dict[LabelValues, float] = {}

    def set(self, labels: Mapping[str, str], value: float) -> None:
        self.values[self._key(labels)] = float(value)

    def samples(self) -> list[str]:
        return [f"{self.name}{self._label_text(k)} {_num(v)}" for k, v in sorted(self.values.items())]


class Histogram(Metric):
    kind = "histogram"

    def __init__(self, name: str, doc: str, labels: Sequence[str], buckets: Sequence[float]) -> None:
        super().__init__(name, doc, labels)
        self.buckets = tuple(sorted(float(b) for b in buckets))
        self.counts: dict[LabelValues, list[float]] = {}
        self.sums: dict[LabelValues, float] = {}

    def observe(self, labels: Mapping[str, str], value: float, weight: float = 1.0) -> None:
        key = self._key(labels)
        counts = self.counts.setdefault(key, [0.0] * (len(self.buckets) + 1))
        counts[bisect.bisect_left(self.buckets, value)] += weight
        self.sums[key] = self.sums.get(key, 0.0) + value * weight

    def samples(self) -> list[str]:
        lines: list[str] = []
        for key, counts in sorted(self.counts.items()):
            running = 0.0
            for bound, count in zip((*self.buckets, math.inf), counts, strict=True):
                running += count
                lines.append(f"{self.name}_bucket{self._label_text(key, [('le', _go_float(bound))])} {_num(running)}")
            lines.append(f"{self.name}_sum{self._label_text(key)} {_num(self.sums[key])}")
            lines.append(f"{self.name}_count{self._label_text(key)} {_num(running)}")
        return lines


MetricT = TypeVar("MetricT", bound=Metric)


class MetricRegistry:
    """The metric families of one simulated server in exposition order, under one lock; ``render()`` gives the
    ``/metrics`` body."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._metrics: list[Metric] = []

    def render(self) -> str:
        with self.lock:
            return exposition(self._metrics)

    def _add(self, metric: MetricT) -> MetricT:
        self._metrics.append(metric)
        return metric

    def _gauge(self, name: str, doc: str, labels: Sequence[str]) -> Gauge:
        return self._add(Gauge(name, doc, labels))


class SglangMetrics(MetricRegistry):
    """The collectors of one simulated SGLang server. Thread-safe; ``render()`` gives the ``/metrics`` body."""

    def __init__(self, model_name: str) -> None:
        super().__init__()
        self.tok = {"model_name": model_name, "engine_type": "unified"}
        self.sched = {**self.tok, "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"}
        tl, sl = tuple(self.tok), tuple(self.sched)
        c, g, h = self._counter, self._gauge, self._histogram
        self.prompt_tokens = c("sglang:prompt_tokens_total", "Number of prefill tokens processed.",
                               (*tl, "is_streaming"))
        self.generation_tokens = c("sglang:generation_tokens_total", "Number of generation tokens processed.",
                                   (*tl, "is_streaming"))
        self.num_requests = c("sglang:num_requests_total", "Number of requests processed.", (*tl, "is_streaming"))
        self.aborted = c("sglang:num_aborted_requests_total", "Number of requests aborted.", tl)
        self.cached_tokens = c("sglang:cached_tokens_total",
                               "Number of cached prompt tokens by source (device/host/storage).", (*tl, "cache_source"))
        self.spec_verify = c("sglang:spec_verify_calls_total", "Number of speculative decoding verification calls.",
                             tl)
        self.retracted_total = c("sglang:num_retracted_requests_total", "Total number of retracted requests.", sl)
        self.retracted_input = c("sglang:num_retracted_input_tokens_total", "Total number of retracted input tokens.",
                                 sl)
        self.retracted_output = c("sglang:num_retracted_output_tokens_total",
                                  "Total number of retracted output tokens.", sl)
        self.realtime_tokens = c("sglang:realtime_tokens_total", "Total number of tokens processed (updated on each "
                                 "log interval). mode: prefill_compute, prefill_cache, decode.", (*sl, "mode"))
        self.http_requests = c("sglang:http_requests_total", "Total number of HTTP requests by endpoint and method",
                               ("endpoint", "method"))
        self.http_responses = c("sglang:http_responses_total",
                                "Total number of HTTP responses by endpoint and status code",
                                ("endpoint", "status_code", "method"))
        self.http_active = g("sglang:http_requests_active", "Number of currently active HTTP requests",
                             ("endpoint", "method"))
        self.ttft = h("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                      (*tl, "is_streaming"), TTFT_BUCKETS)
        self.itl = h("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", tl,
                     ITL_BUCKETS)
        self.tpot = h("sglang:request_time_per_output_token_seconds",
                      "Per-request TPOT in seconds: (finished_time - first_token_time) / (completion_tokens - 1).",
                      (*tl, "is_streaming"), ITL_BUCKETS)
        self.e2e = h("sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds",
                     (*tl, "is_streaming"), E2E_BUCKETS)
        self.prompt_hist = h("sglang:prompt_tokens_histogram", "Histogram of prompt token length.", tl,
                             TOKEN_BUCKETS)
        self.uncached_hist = h("sglang:uncached_prompt_tokens_histogram",
                               "Histogram of uncached (compute) prompt token length.", tl, TOKEN_BUCKETS)
        self.generation_hist = h("sglang:generation_tokens_histogram", "Histogram of generation token length.", tl,
                                 TOKEN_BUCKETS)
        self.queue_time = h("sglang:queue_time_seconds", "Histogram of queueing time in seconds.", sl, QUEUE_BUCKETS)
        self.gauges: dict[str, Gauge] = {name: g(f"sglang:{name}", doc, sl) for name, doc in SCHEDULER_GAUGES.items()}
        self.graph_memory = g("sglang:graph_memory_usage_gb", "Memory used by captured device graphs in GB.",
                              (*sl, "phase"))
        self.startup_time = g("sglang:startup_time_seconds", "Engine startup duration by phase in seconds.",
                              (*tl, "phase"))

    def set_gauges(self, values: Mapping[str, float]) -> None:
        with self.lock:
            for name, value in values.items():
                self.gauges[name].set(self.sched, value)

    def spec_step(self, drafts: int, draft_tokens: int, accepted: int) -> None:
        """One verify round of speculative decoding (SGLang counts the verify calls)."""
        self.spec_verify.inc(self.tok, drafts)

    def _counter(self, name: str, doc: str, labels: Sequence[str]) -> Counter:
        return self._add(Counter(name, doc, labels))

    def _histogram(self, name: str, doc: str, labels: Sequence[str], buckets: Sequence[float]) -> Histogram:
        return self._add(Histogram(name, doc, labels, buckets))


def exposition(metrics: Iterable[Metric]) -> str:
    """The Prometheus text exposition of ``metrics``: ``# HELP``, ``# TYPE`` and the samples of each metric that has
    any, in order."""
    lines: list[str] = []
    for metric in metrics:
        samples = metric.samples()
        if not samples:
            continue
        lines.append(f"# HELP {metric.name} {metric.doc}")
        lines.append(f"# TYPE {metric.name} {metric.kind}")
        lines.extend(samples)
    return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _go_float(value: float) -> str:
    if math.isinf(value):
        return "+Inf"
    return repr(float(value))


def _num(value: float) -> str:
    return repr(float(value))

"""vLLM 0.33.0's Prometheus metrics for the simulated server: its names, labels and buckets.

``VllmMetrics`` has the collector attributes the serving loop and the HTTP server update (the same attributes as
``SglangMetrics``), each bound to vLLM's series (``vllm/v1/metrics/loggers.py``, ``v1/spec_decode/metrics.py``):
gauges ``vllm:num_requests_running``, ``num_requests_waiting``, ``kv_cache_usage_perc``; counters
``prompt_tokens``, ``generation_tokens``, ``prefix_cache_queries`` and ``prefix_cache_hits`` (tokens),
``request_success``, ``num_preemptions``, ``spec_decode_num_drafts``, ``num_draft_tokens``,
``num_accepted_tokens``; histograms ``time_to_first_token_seconds``, ``inter_token_latency_seconds``,
``request_time_per_output_token_seconds``, ``e2e_request_latency_seconds``, ``request_queue_time_seconds``,
``request_prompt_tokens`` and ``request_generation_tokens``; and ``vllm:cache_config_info`` with the resolved cache
configuration (``num_gpu_blocks``, ``kv_cache_size_tokens``, ``kv_cache_max_concurrency``). Every series is
labelled ``model_name`` and ``engine``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from elsa_tune.runtime.sim.metrics import Counter, Histogram, Metric, MetricRegistry

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
               80.0)
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                   480.0, 960.0, 1920.0, 7680.0)


def _token_buckets(max_model_len: int) -> tuple[int, ...]:
    """``build_1_2_5_buckets(max_model_len)``: 1, 2, 5, 10, 20, 50, … up to the context length."""
    buckets: list[int] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_model_len:
                return tuple(buckets)
            buckets.append(value)
        exponent += 1


class _Fan:
    """One update the serving loop makes, applied to several of vLLM's series (or none)."""

    def __init__(self, *targets: Counter) -> None:
        self.targets = targets

    def inc(self, labels: Mapping[str, str], amount: float = 1.0) -> None:
        for target in self.targets:
            target.inc(labels, amount)


class _When:
    """A counter update that counts only when a label has one value (``cache_source="device"``)."""

    def __init__(self, target: Counter | None, label: str, value: str) -> None:
        self.target, self.label, self.value = target, label, value

    def inc(self, labels: Mapping[str, str], amount: float = 1.0) -> None:
        if self.target is not None and labels.get(self.label) == self.value:
            self.target.inc(labels, amount)


class _Drop:
    """An update for a series vLLM does not export."""

    def inc(self, labels: Mapping[str, str], amount: float = 1.0) -> None:
        return None

    def observe(self, labels: Mapping[str, str], value: float, weight: float = 1.0) -> None:
        return None

    def set(self, labels: Mapping[str, str], value: float) -> None:
        return None


class _Info(Metric):
    """An info-style gauge (value 1) whose labels are the configuration."""

    kind = "gauge"

    def __init__(self, name: str, doc: str) -> None:
        super().__init__(name, doc, ())
        self.info: dict[str, str] = {}

    def samples(self) -> list[str]:
        if not self.info:
            return []
        labels = ",".join(f'{k}="{v}"' for k, v in sorted(self.info.items()))
        return [f"{self.name}{{{labels}}} 1.0"]


#: The serving loop's gauge names (``SglangMetrics``'s) → vLLM's gauges; a fraction stays a fraction.
_GAUGES = {"num_running_reqs": "vllm:num_requests_running", "num_queue_reqs": "vllm:num_requests_waiting",
           "token_usage": "vllm:kv_cache_usage_perc"}


class VllmMetrics(MetricRegistry):
    """The collectors of one simulated vLLM server. Thread-safe; ``render()`` gives the ``/metrics`` body."""

    def __init__(self, model_name: str, max_model_len: int = 32768) -> None:
        super().__init__()
        self.tok = {"model_name": model_name, "engine": "0"}
        self.sched = dict(self.tok)
        labels = tuple(self.tok)
        tokens = _token_buckets(max_model_len)
        c, h = self._counter, self._histogram
        prompt = c("vllm:prompt_tokens", "Number of prefill tokens processed.")
        queries = c("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.")
        hits = c("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.")
        self.prompt_tokens = _Fan(prompt, queries)
        self.generation_tokens = c("vllm:generation_tokens", "Number of generation tokens processed.")
        self.num_requests = c("vllm:request_success", "Count of successfully processed requests.")
        self.cached_tokens = _When(hits, "cache_source", "device")
        self.retracted_total = c("vllm:num_preemptions", "Cumulative number of preemption from the engine.")
        self.spec_drafts = c("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.")
        self.spec_draft_tokens = c("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.")
        self.spec_accepted_tokens = c("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.")
        self.ttft = h("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                      TTFT_BUCKETS)
        self.itl = h("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL_BUCKETS)
        self.tpot = h("vllm:request_time_per_output_token_seconds",
                      "Histogram of time_per_output_token_seconds per request.", ITL_BUCKETS)
        self.e2e = h("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                     LATENCY_BUCKETS)
        self.queue_time = h("vllm:request_queue_time_seconds",
                            "Histogram of time spent in WAITING phase for request.", LATENCY_BUCKETS)
        self.prompt_hist = h("vllm:request_prompt_tokens", "Number of prefill tokens processed.", tokens)
        self.generation_hist = h("vllm:request_generation_tokens", "Number of generation tokens processed.", tokens)
        self.gauges = {name: self._gauge(series, _GAUGE_DOCS[series], labels) for name, series in _GAUGES.items()}
        self.cache_config = _Info("vllm:cache_config_info", "Information of the LLMEngine CacheConfig")
        self._add(self.cache_config)
        drop = _Drop()
        self.aborted = self.uncached_hist = self.realtime_tokens = self.graph_memory = drop
        self.http_requests = self.http_responses = self.http_active = drop

    def set_gauges(self, values: Mapping[str, float]) -> None:
        with self.lock:
            for name, value in values.items():
                gauge = self.gauges.get(name)
                if gauge is not None:
                    gauge.set(self.sched, value)

    def spec_step(self, drafts: int, draft_tokens: int, accepted: int) -> None:
        """One verify round of speculative decoding: drafts proposed, their tokens and the accepted ones."""
        self.spec_drafts.inc(self.tok, drafts)
        self.spec_draft_tokens.inc(self.tok, draft_tokens)
        self.spec_accepted_tokens.inc(self.tok, accepted)

    def set_cache_config(self, info: Mapping[str, object]) -> None:
        with self.lock:
            self.cache_config.info = {k: str(v) for k, v in info.items()}

    def _counter(self, name: str, doc: str) -> Counter:
        return self._add(Counter(f"{name}_total", doc, tuple(self.tok)))

    def _histogram(self, name: str, doc: str, buckets: Sequence[float]) -> Histogram:
        return self._add(Histogram(name, doc, tuple(self.tok), buckets))


_GAUGE_DOCS = {"vllm:num_requests_running": "Number of requests in model execution batches.",
               "vllm:num_requests_waiting": "Number of requests waiting to be processed.",
               "vllm:kv_cache_usage_perc": "KV-cache usage. 1 means 100 percent usage."}

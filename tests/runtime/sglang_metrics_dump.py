"""Run by the Python named in ``ELSA_SGLANG_PYTHON`` (SGLang 0.5.23): print the metric definitions of SGLang's
scheduler and tokenizer collectors (``srt/observability/metrics_collector.py``) and of its HTTP middleware
(``srt/observability/http_request_metrics.py``) as JSON on stdout.

Each: name (as exposed, counters with ``_total``), type, documentation, label names, histogram buckets.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile


def main() -> int:
    os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", tempfile.mkdtemp(prefix="elsa-sglang-metrics-"))
    from prometheus_client import Counter, Gauge, Histogram
    from sglang.srt.observability.http_request_metrics import _HttpRequestMetrics
    from sglang.srt.observability.metrics_collector import SchedulerMetricsCollector, TokenizerMetricsCollector
    from sglang.srt.runtime_context import _CONTEXT
    from sglang.srt.server_args import ServerArgs

    args = ServerArgs(model_path="dummy", enable_metrics=True)
    _CONTEXT.set_server_args(args)   # what the launcher does before building the collectors
    tok = {"model_name": "m", "engine_type": "unified"}
    sched = {**tok, "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"}
    out: dict[str, dict[str, object]] = {}
    for collector in (TokenizerMetricsCollector(server_args=args, labels=tok),
                      SchedulerMetricsCollector(labels=sched, server_args=args), _HttpRequestMetrics()):
        for metric in vars(collector).values():
            if not isinstance(metric, (Counter, Gauge, Histogram)):
                continue
            kind = {Counter: "counter", Gauge: "gauge", Histogram: "histogram"}[type(metric)]
            name = metric._name + ("_total" if kind == "counter" else "")
            entry: dict[str, object] = {"type": kind, "doc": metric._documentation,
                                        "labels": list(metric._labelnames)}
            if kind == "histogram":
                entry["buckets"] = [b for b in metric._upper_bounds if b != float("inf")]
            out[name] = entry
    json.dump(out, sys.stdout, indent=0, sort_keys=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

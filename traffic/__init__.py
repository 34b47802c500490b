"""Traffic: the trace format, recording from Prometheus, imports, workloads, replay."""

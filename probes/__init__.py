"""Stress probes (OOM-safe), the quality gate, memory headroom watching."""

"""elsa-tune: an unattended tuner for LLM serving runtimes (SGLang and its single-card forks)."""

__version__ = "0.1.0"

"""Simulated servers for the probe tests (``conftest.py`` holds the fixtures): the tiny card with a tiny vision
model whose profile carries one technique per kind of quality damage (``profiles/probe-tiny.yaml``),
sped up, told the arithmetic answers."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from elsa_tune.probes.protocol import ProbeBudget
from elsa_tune.probes.quality import QualityGate, QualitySettings, knowledge_file
from elsa_tune.runtime.protocol import Server
from elsa_tune.runtime.sim.faults import ENV_FAULT
from elsa_tune.runtime.sim.runtime import SIM_TIMEOUTS, SimulatedSGLang
from elsa_tune.search_spaces.candidate import Candidate, FlagValue

PROFILE = Path(__file__).resolve().parent / "profiles" / "probe-tiny.yaml"
BASE: dict[str, FlagValue] = {"mem-fraction-static": 0.8, "max-running-requests": 4, "max-mamba-cache-size": 24}
SPEC: dict[str, FlagValue] = {**BASE, "speculative-algorithm": "EAGLE"}
SPEEDUP = 20.0
MIB = 1024 * 1024
BUDGET = ProbeBudget(deadline_s=90.0, request_timeout_s=45.0, hang_s=3.0, headroom_floor_bytes=512 * MIB)
# a smaller gate than the default (fewer greedy prompts' tokens, fewer tool calls): same checks, faster
GATE = QualityGate(QualitySettings(greedy_max_tokens=32, tool_requests=4, cache_words=1200))


class SimBoots:
    """Boots candidates on one simulated card and stops every server it started."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.runtime = SimulatedSGLang(PROFILE, card_dir=root / "card", seed=3, speedup=SPEEDUP,
                                       timeouts=replace(SIM_TIMEOUTS, boot_s=60.0, stop_s=10.0,
                                                        memory_release_s=15.0),
                                       knowledge=knowledge_file())
        self.servers: list[Server] = []

    def start(self, flags: Mapping[str, FlagValue], env: Mapping[str, str] | None = None,
              fault: str | None = None) -> Server:
        full_env = {**(env or {}), **({ENV_FAULT: fault} if fault else {})}
        server = self.runtime.start(Candidate(flags=dict(flags), env=full_env),
                                    self.root / f"boot-{len(self.servers)}")
        self.servers.append(server)
        return server

    def stop_all(self) -> None:
        for server in self.servers:
            self.runtime.stop(server)
        self.servers.clear()


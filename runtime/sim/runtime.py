"""``SimulatedServer``: the ``Runtime`` for the simulated server, a ``ServerProcess`` with a simulated card.

It is the real process manager (``runtime/process.py``: process group, log tee, ready line + ``/health``,
classification, stop that waits for the GPU memory) of a runtime family (SGLang by default, or vLLM: the server
speaks that family's dialect, ``dialect.py``, and the family reads its log) pointed at ``elsa-tune sim serve``
instead of the runtime's own launch, with a ``SimulatedGpu`` as its ``GpuView``. Every boot gets its own seed (so boot
drift differs between boots, as on a real card: the seed the booter wrote into the boot folder, else one more than
the last) and may get injected faults (``faults=`` for every boot, or
``ELSA_SIM_FAULT`` in a candidate's env for one boot).
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from elsa_tune.runtime.boot_seed import read_boot_seed
from elsa_tune.runtime.family import RuntimeFamily, family
from elsa_tune.runtime.lease import LeaseBook
from elsa_tune.runtime.process import ServerProcess
from elsa_tune.runtime.protocol import RuntimeTimeouts, Server
from elsa_tune.runtime.sim.answers import ENV_KNOWLEDGE
from elsa_tune.runtime.sim.card import CardSpec, SimulatedGpu, default_card_dir
from elsa_tune.runtime.sim.faults import ENV_FAULT, Faults
from elsa_tune.runtime.sim.profile import SimProfile, load_profile
from elsa_tune.search_spaces.candidate import Candidate

GIB = 1024**3
#: A simulated server boots, answers and stops in seconds: a stuck one is given up on sooner than a real one.
SIM_TIMEOUTS = RuntimeTimeouts(boot_s=600.0, health_s=10.0, stop_s=15.0, memory_release_s=30.0)


def simulated_gpu(profile: SimProfile, card_dir: Path | None = None, index: int = 0) -> SimulatedGpu:
    """The ``GpuView`` of the simulated card a profile describes (shared by every server on that folder)."""
    card = profile.card
    spec = CardSpec(name=card.name, memory_total=int(card.memory_gb * GIB), power_limit_w=card.power_limit_w,
                    power_default_limit_w=card.default_power_w, index=index)
    return SimulatedGpu(card_dir if card_dir is not None else default_card_dir(card.name, index), spec)


class SimulatedServer(ServerProcess):
    """Boot simulated servers of ``family`` (``sglang``, ``vllm``) for candidates; everything else is
    ``ServerProcess``.

    ``speedup`` runs simulated time faster than real time (tests use 20–100). ``seed`` is the first boot's
    seed; each later boot adds one. ``faults`` is ``--sim-fault`` text applied to every boot. ``knowledge`` is a
    JSON-lines file of questions and answers the simulated model knows (``answers.py``; e.g. the quality gate's
    ``probes.quality.knowledge_file()``).
    """

    def __init__(self, profile: str | Path, *, card_dir: Path | None = None, seed: int = 0, speedup: float = 1.0,
                 faults: str | None = None, python: str = sys.executable, model_path: str | None = None,
                 timeouts: RuntimeTimeouts = SIM_TIMEOUTS, extra_env: Mapping[str, str] | None = None,
                 knowledge: Path | None = None, leases: LeaseBook | None = None,
                 family_name: str = "sglang") -> None:
        if faults:
            Faults.parse(faults)   # fail now, on a bad fault name, rather than in the first boot
        self.profile = load_profile(profile)
        self.profile_ref = str(profile)
        gpu = simulated_gpu(self.profile, card_dir)
        self.card_dir = gpu.card_dir
        self.speedup = speedup
        self.faults = faults
        self.model_path = model_path or self.profile.model.served_name
        self._seeds = itertools.count(seed)
        self._seed = seed
        # Millisecond timestamps (SGLang's SGLANG_LOG_MS) so sped-up boots still show their phase timings.
        env = {"SGLANG_LOG_MS": "1", **(extra_env or {})}
        if faults:
            env[ENV_FAULT] = faults
        if knowledge is not None:
            env[ENV_KNOWLEDGE] = str(Path(knowledge).resolve())
        runtime_family: RuntimeFamily = family(family_name)
        launch: Sequence[str] = (python, "-m", "elsa_tune", "sim", "serve", "--family", runtime_family.name.value,
                                 "--sim-profile", self.profile_ref, "--sim-card-dir", str(self.card_dir),
                                 "--sim-speedup", repr(float(speedup)))
        super().__init__(runtime_family, launch, gpu, timeouts=timeouts, extra_env=env, leases=leases)
        self.lease_card_dir = self.card_dir

    @property
    def version(self) -> str:
        """The runtime version the simulated server reports (the profile's SGLang, or vLLM 0.33.0)."""
        from elsa_tune.runtime.sim.dialect import dialect

        return dialect(self.family.name.value).endpoints(self.profile).version

    def start(self, candidate: Candidate, boot_dir: Path) -> Server:
        """Boot with the seed the booter wrote into ``boot_dir`` (``runtime/boot_seed.py``), else the next of ours:
        a resumed study replays a boot's drift exactly."""
        seed = read_boot_seed(boot_dir)
        self._seed = next(self._seeds) if seed is None else seed
        return super().start(candidate, boot_dir)

    def argv(self, candidate: Candidate, port: int) -> list[str]:
        args = super().argv(candidate, port)
        extra = ["--sim-seed", str(self._seed)]
        if "model-path" not in candidate.flags and "model" not in candidate.flags:
            extra += [f"--{self.family.model_flag}", self.model_path]
        return [*args, *extra]


#: The SGLang-speaking simulated runtime under its former name.
SimulatedSGLang = SimulatedServer

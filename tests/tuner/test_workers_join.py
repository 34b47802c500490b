"""A worker joins a shared study only with the study's search space and setup (no boot needed to refuse)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from elsa_tune.errors import ConfigError
from elsa_tune.tuner.fleet.workers import Worker, WorkerConfig
from elsa_tune.tuner.flow.preflight import Preflight, run_preflight
from elsa_tune.tuner.flow.settings import Settings

SPACE = Path(__file__).resolve().parents[2] / "benchmarks" / "workers" / "tiny-space.yaml"


def _preflight(tmp_path: Path, gpu: int, space: Path = SPACE) -> Preflight:
    settings = Settings(gpu=str(gpu), runtime="sim", sim_profile="tiny-test", space=str(space), traffic="demo",
                        out=tmp_path / "runs" / f"host-gpu{gpu}", study="shared", budget_s=60.0)
    return run_preflight(settings, card_dir=tmp_path / "cards" / f"gpu{gpu}", harvest_flags=False)


def _config(tmp_path: Path, gpu: int) -> WorkerConfig:
    return WorkerConfig(storage_url=f"sqlite:///{tmp_path / 'study.db'}", study="shared", gpu=str(gpu),
                        worker=f"w{gpu}")


def test_workers_on_two_cards_of_one_kind_join_and_other_setups_are_refused(tmp_path: Path) -> None:
    first = Worker(_preflight(tmp_path, 0), _config(tmp_path, 0))
    first.join()
    second_pre = _preflight(tmp_path, 1)
    assert second_pre.fingerprint.gpu_uuid != first.pre.fingerprint.gpu_uuid    # two cards, two fingerprints
    Worker(second_pre, _config(tmp_path, 1)).join()                             # same kind of card: welcome

    other_space = tmp_path / "other-space.yaml"
    other_space.write_text(SPACE.read_text().replace("high: 0.7", "high: 0.75"))
    with pytest.raises(ConfigError, match="another space"):
        Worker(_preflight(tmp_path, 2, other_space), _config(tmp_path, 2)).join()

    pre = _preflight(tmp_path, 3)
    other_card = replace(pre, fingerprint=replace(pre.fingerprint, gpu_name="RTX PRO 6000 (simulated)"))
    with pytest.raises(ConfigError, match="another setup"):
        Worker(other_card, _config(tmp_path, 3)).join()

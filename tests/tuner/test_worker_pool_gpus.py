"""``parse_gpus``: the ``--gpu`` list of a worker pool."""

from __future__ import annotations

import pytest

from elsa_tune.errors import ConfigError
from elsa_tune.tuner.fleet.worker_pool import parse_gpus


def test_gpu_lists_name_each_card_once() -> None:
    assert parse_gpus("0, 1,3") == ["0", "1", "3"]
    with pytest.raises(ConfigError):
        parse_gpus("0,0")
    with pytest.raises(ConfigError):
        parse_gpus(" , ")

"""Probe settings come from the search space's ``probes:`` section, with defaults; bad values stop the load with
the line and a remedy, before any boot (the loader's checks, seen from the probes' side)."""

from __future__ import annotations

import pytest

from elsa_tune.errors import SpaceError
from elsa_tune.probes.plan import budget_from_settings
from elsa_tune.search_spaces.loader import parse_space, resolve_space_path

MIB = 1024 * 1024
SHIPPED: str = resolve_space_path("qwen3.8-27b-nvfp4-rtx5090").read_text(encoding="utf-8")
SECTION = "probes:\n  headroom_floor_mib: 512\n  probe_timeout_s: 900\n  hang_s: 120\n  boot_timeout_s: 1800\n"


def with_probes(section: str) -> str:
    assert SECTION in SHIPPED
    return SHIPPED.replace(SECTION, section)


def test_values_from_the_section_reach_the_budget() -> None:
    space = parse_space(with_probes("probes:\n  headroom_floor_mib: 1024\n  probe_timeout_s: 300\n  hang_s: 20\n"),
                        "space.yaml")
    budget = budget_from_settings(space.probes)
    assert budget.headroom_floor_bytes == 1024 * MIB
    assert budget.deadline_s == 300 and budget.hang_s == 20 and budget.request_timeout_s == 300


def test_an_absent_section_gives_the_defaults() -> None:
    budget = budget_from_settings(parse_space(with_probes(""), "space.yaml").probes)
    assert budget.headroom_floor_bytes == 512 * MIB      # seed 001: 825 MiB ran, 144 MiB short crashed
    assert budget.deadline_s == 900 and budget.hang_s == 120


@pytest.mark.parametrize("section", [
    "probes:\n  probe_timeout_s: 0\n",
    "probes:\n  probe_timeout_s: -30\n",
    "probes:\n  probe_timeout_s: soon\n",
    "probes:\n  hang_s: 0\n",
    "probes:\n  hang_s: 1000\n",                     # not below the 900 s default timeout
    "probes:\n  headroom_floor_mib: 0\n",
    "probes:\n  headroom_floor_mb: 512\n",           # unknown key
    "probes:\n  boot_timeout_s: 1\n",
])
def test_bad_probe_settings_are_rejected_at_load_time(section: str) -> None:
    text = with_probes(section)
    with pytest.raises(SpaceError) as caught:
        parse_space(text, "space.yaml")
    key = section.splitlines()[1].split(":")[0].strip()
    assert caught.value.line == text.splitlines().index(f"  {key}: {section.splitlines()[1].split(': ')[1]}") + 1
    assert caught.value.remedy

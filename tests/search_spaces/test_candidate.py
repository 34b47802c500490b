from __future__ import annotations

import pytest

from elsa_tune.search_spaces.candidate import Candidate


def test_key_ignores_label_and_order() -> None:
    a = Candidate(flags={"mem-fraction-static": 0.9, "page-size": 32}, label="a")
    b = Candidate(flags={"page-size": 32, "mem-fraction-static": 0.9}, label="b")
    assert a.key() == b.key()
    assert a.key() != a.with_flags(page_size=64).key()


def test_argv_renders_switches_and_values() -> None:
    c = Candidate(flags={"enable-metrics": True, "disable-radix-cache": False, "mem-fraction-static": 0.9,
                         "max-running-requests": 4})
    assert c.argv() == ["--enable-metrics", "--max-running-requests", "4", "--mem-fraction-static", "0.9"]


def test_rejects_underscored_or_dashed_names() -> None:
    with pytest.raises(ValueError):
        Candidate(flags={"--page-size": 32})
    with pytest.raises(ValueError):
        Candidate(flags={"page_size": 32})


def test_round_trip_and_merge() -> None:
    c = Candidate(flags={"page-size": 32}, env={"SGLANG_X": "1"}, label="base")
    assert Candidate.from_dict(c.to_dict()) == c
    m = c.merged(flags={"page-size": None, "kv-cache-dtype": "fp8_e4m3"}, env={"Y": "2"}, label="t")
    assert dict(m.flags) == {"kv-cache-dtype": "fp8_e4m3"}
    assert dict(m.env) == {"SGLANG_X": "1", "Y": "2"}

"""Whose run folder ``--out`` is: the checks a study or a comparison passes before it writes a byte there.

``refuse_before_preflight`` needs the settings alone (a foreign ``study.db``, a folder of another kind or name, a
finished study); ``identity`` is what the preflight adds (the space's and the traffic's digests, the setup), for
``check_owner`` before the folder is created and ``claim`` under the run lock (``history/run_identity.py``).
``remove_created`` undoes what a refused preflight created.
"""

from __future__ import annotations

import contextlib
import importlib.resources
import shutil
from pathlib import Path

from elsa_tune.errors import ConfigError
from elsa_tune.history.ledger import Ledger
from elsa_tune.history.run_identity import RunIdentity, RunKind, check_owner, file_digest, refuse_finished
from elsa_tune.history.study_database import check_study_database
from elsa_tune.tuner.flow.preflight import BUNDLED_TRACES, Preflight


def refuse_before_preflight(run_dir: Path, kind: RunKind, name: str, *, extending: bool = False) -> None:
    """Refuse a run folder that is not this run's to write, from what the settings say; creates nothing.

    A study also reads the ledger beside the folder now: one it cannot read would end it after its first boots. A
    finished study is refused unless the run extends it (``--extend``).
    """
    if kind is RunKind.STUDY:
        Ledger.for_run_dir(run_dir).backend.read()     # corrupt lines are skipped (the study warns of them)
    if not run_dir.is_dir():
        return
    check_study_database(run_dir / "study.db")
    check_owner(run_dir, RunIdentity(kind, name))
    if kind is RunKind.STUDY and not extending:
        refuse_finished(run_dir)


def identity(pre: Preflight, kind: RunKind, arms: tuple[str, ...] = ()) -> RunIdentity:
    """This run's identity: its kind and name, the space and traffic it reads, the setup it measures."""
    traffic = pre.settings.traffic
    return RunIdentity(kind, pre.settings.study_name, space=pre.space.name, space_digest=pre.space.digest[:16] or None,
                       traffic=traffic, traffic_digest=_traffic_digest(traffic), setup=pre.fingerprint.key(),
                       setup_text=pre.fingerprint.describe(), arms=arms)


def _traffic_digest(traffic: str) -> str:
    path = (Path(str(importlib.resources.files("elsa_tune.traffic").joinpath("data", BUNDLED_TRACES[traffic])))
            if traffic in BUNDLED_TRACES else Path(traffic))
    try:
        return file_digest(path)
    except OSError as exc:    # the preflight has just read it: only a file removed since gets here
        raise ConfigError(f"--traffic {traffic} cannot be read: {exc.strerror or exc}",
                          remedy="give --traffic a trace file you can read") from exc


def remove_created(card_dir: Path, root: Path) -> None:
    """Undo what a refused preflight created under a new run folder ``root``: the simulated card ``card_dir``, then
    the folders above it that are left empty (a folder holding another run's files is left as it is)."""
    shutil.rmtree(card_dir, ignore_errors=True)
    for folder in (card_dir.parent, root):
        with contextlib.suppress(OSError):   # not empty, or already gone
            folder.rmdir()

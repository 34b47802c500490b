"""A boot's seed, written into its boot folder before ``Runtime.start``.

A real GPU draws its own noise; a simulated runtime draws a boot's drift from a seed. The booter derives each boot's
seed from the boot's identity in the study (so a resumed study replays a boot's drift exactly) and writes it into the
boot folder; a simulated runtime's ``start`` reads it there, and a real runtime never looks.
"""

from __future__ import annotations

from pathlib import Path

SEED_FILE = "seed"


def write_boot_seed(boot_dir: Path, seed: int) -> None:
    """Write ``seed`` into ``boot_dir`` (created if missing)."""
    boot_dir.mkdir(parents=True, exist_ok=True)
    (boot_dir / SEED_FILE).write_text(f"{seed}\n", encoding="utf-8")


def read_boot_seed(boot_dir: Path) -> int | None:
    """The seed written into ``boot_dir``; ``None`` when there is none (a boot started outside a study)."""
    try:
        return int((boot_dir / SEED_FILE).read_text(encoding="utf-8").strip())
    except (OSError, ValueError):
        return None

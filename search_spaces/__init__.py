"""Search spaces: which launch settings a study may try, and the ``Candidate`` they produce."""

from elsa_tune.search_spaces.candidate import Candidate, FlagValue

__all__ = ["Candidate", "FlagValue"]

"""Search spaces: which launch settings a study may try, and the ``Candidate`` they produce.

``load_space(path_or_name)`` reads and validates a YAML space (a bare name finds a shipped one, see
``list_shipped_spaces()``); ``SearchSpace.baseline()`` and ``SearchSpace.candidate(values, techniques)``
build candidates, refusing any that break the space's rules (``RuleViolation``).
"""

from elsa_tune.search_spaces.candidate import Candidate, FlagValue
from elsa_tune.search_spaces.loader import list_shipped_spaces, load_space, parse_space
from elsa_tune.search_spaces.parameter import Parameter, ParameterKind
from elsa_tune.search_spaces.rules import DerivationError, RuleViolation
from elsa_tune.search_spaces.space import SearchSpace, Technique, TechniqueKind

__all__ = [
    "Candidate",
    "DerivationError",
    "FlagValue",
    "Parameter",
    "ParameterKind",
    "RuleViolation",
    "SearchSpace",
    "Technique",
    "TechniqueKind",
    "list_shipped_spaces",
    "load_space",
    "parse_space",
]

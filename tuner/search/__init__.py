"""The numeric search phase: the seam a search backend implements, what it may see of its study, and Optuna's ask-
and-tell search around the incumbent."""

"""CLI subcommands, one module each (see ``elsa_tune.tuner.cli``)."""

"""A study from baseline to recommendation, in four sub-packages and the CLI.

``ab``: the A/B gate and its statistics. ``flow``: one study's flow on one GPU (preflight, the night and its phases,
the booter, the budget, the virtual- and simulated-time studies). ``search``: the numeric search phase and its
backends' seam. ``fleet``: a study searched by several GPUs. ``cli``, ``commands``, ``console`` and
``argument_types``: the command line and what a person sees.
"""

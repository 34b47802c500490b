"""The search loop and its phases, the A/B gate and its statistics, budget, the CLI."""

"""One study's flow on one GPU: preflight, the night and its phases (baseline, screening, confirmation), the booter
and the load it puts on a server, the budget, and the virtual-time and simulated-time studies that run the same
flow."""

"""The study store, trial and boot records, fingerprints, the rejected-technique ledger."""

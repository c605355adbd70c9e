"""Runtime truth: PyTorch memory snapshots (and native allocation records)
read safely, normalised, and attributed to the census's sites
(DESIGN.md, "Runtime truth"). Nothing here imports torch."""

"""The bottom layer, shared by `jobs`, `analysis` and `orchestrator`: atomic files, declared
settings (typed config with constraints), registries, and the specification of a metric.

It imports nothing of the project's, so every other package may import it."""

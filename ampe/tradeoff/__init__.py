"""ampe.tradeoff: the domain-free time–energy trade-off core (lowtime's split: a DAG of operations with
Pareto-filtered options, their cost model, and the solvers), used by :mod:`ampe.energy` for pipelines.

Modules (data flows top to bottom; nothing here imports the rest of ampe, an import-linter contract says so):

* ``options``, ``dag``, ``levels``: discrete (clock, time, energy) options of a computation; the DAG of
  computations and constant-time transfers in topological order; its topological levels for vectorised passes;
* ``hull``, ``cpm``, ``mincut``, ``pd``: convex costs, the critical-path graph, min cuts, and the
  Phillips–Dessouky frontier (hot loop);
* ``evaluate``, ``repair``, ``frontier``: realized points on the discrete options, greedy speed-ups to a deadline,
  the traced frontier;
* ``direct``, ``periodic``: the cheapest point at a deadline through the LP relaxation, and its fold over the
  repeating middle of a 1F1B DAG.

What a DAG's nodes stand for (pipeline stages, micro-batches, GPUs, prices) is the caller's: the pipeline DAG is
built by :mod:`ampe.energy.pipeline_dag`, its options by :mod:`ampe.energy.model_options` or a measured profile.
"""

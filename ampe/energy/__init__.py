"""ampe.energy: per-computation GPU clock planning (Perseus frontier, extrinsic bloat, baselines).

Modules (data flows top to bottom; nothing here imports search or launch):

* ``dvfs``: analytic time/power model per GPU type (``time_ratio``, ``power_w``, ``blocking_power_w``);
  ``dvfs_fit``: its fit to measured clock sweeps (scipy) and its error on them (``ampe dvfs fit``);
* ``model_options``, ``profile_csv``: discrete (clock, time, energy) options, from the model or a measured profile;
* ``pipeline_dag``, ``inputs``: the computation DAG of one pipeline (in the order of
  :mod:`ampe.costmodel.schedules`) and its per-stage inputs;
* the DAG type, the frontier and the point solvers are the domain-free core, :mod:`ampe.tradeoff`;
* ``bloat``, ``baselines``, ``plan``: straggler/heterogeneous replicas, EnvPipe and global-clock baselines, and the
  JSON frequency plan; ``run``: a training run's kWh at the plan and at all-max clocks.
* ``strategy``, ``ranking``, ``budget``: one costed strategy's energy and frequency plan, choosing among strategies
  under an objective, and the work bound applied first.

Kept free of imports so that ``from ampe.energy import dvfs`` stays light (the trial worker uses it).
See docs/energy.md.
"""

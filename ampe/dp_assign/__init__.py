"""Layer-to-stage assignment: exact DP for AMP's pipeline objective, AMP's own DP, baselines, brute force.

Array-based and cluster-agnostic: build a :class:`StageCosts` from a candidate strategy, call :func:`solve`.
See docs/dp_assign.md.
"""

from ampe.dp_assign._kernels import MAX_BAND_ENTRIES, band_entries
from ampe.dp_assign.amp_reference import amp_pipe_ast, amp_pipe_cost
from ampe.dp_assign.baselines import balanced_partition, uniform_by_count, uniform_layers, uniform_parameters
from ampe.dp_assign.brute import brute_force
from ampe.dp_assign.costs import Assignment, StageCosts, StageOption, evaluate_partition
from ampe.dp_assign.exact import Bands, Solution, bands, reaches, reaches_bands, solve, stage_ceiling
from ampe.dp_assign.spread import spread_partition

__all__ = [
    "MAX_BAND_ENTRIES", "Assignment", "Bands", "Solution", "StageCosts", "StageOption", "amp_pipe_ast",
    "amp_pipe_cost", "balanced_partition", "band_entries", "bands", "brute_force", "evaluate_partition", "reaches",
    "reaches_bands", "solve", "spread_partition", "stage_ceiling", "uniform_by_count", "uniform_layers",
    "uniform_parameters",
]

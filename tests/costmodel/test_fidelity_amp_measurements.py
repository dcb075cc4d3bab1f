"""The cost model against real measurements: AMP's published per-strategy iteration times (Tables 6-9).

Twenty strategies measured by the AMP authors on AWS (homogeneous 4×g4dn, het-cluster 3×p3 + 1×g4dn), predicted
from AMP's own per-layer profile. ampe must rank and size them at least as well as AMP's cost model does.

One allowance (issue 32, docs/cost_model.md "Slow and shared links"): on the homogeneous cluster ampe's MAPE may be
up to :data:`HOMOGENEOUS_MAPE_SLACK` above AMP's. Charging the two tensor-parallel shards' data-parallel all-reduces
the g4dn node's one 50 Gbit/s interface they share adds 0.10 s to Megatron's two tp = 2 strategies, whose compute
alone (1.76 s, from AMP's mbs-1 profile scaled linearly) is already above the 1.53-1.58 s measured; that moves
ampe's MAPE from 10.2 % to 11.8 % against AMP's 11.2 %, while its ranking stays ahead (Spearman 0.809 vs 0.772).
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import spearmanr

from ampe.costmodel.cluster import load_cluster
from ampe.costmodel.estimate import CostModel
from ampe.costmodel.profile import load_profile
from ampe.costmodel.strategy import Strategy
from ampe.costmodel.zoo import load_model
from ampe.search.amp_compat import amp_cost
from tests.conftest import AMP_PROFILE, SPECS

P16_HET = [0, 3, 5, 7, 9, 11, 13, 15, 16, 17, 19, 20, 21, 22, 23, 25, 30]
P16_HOM = [0, 4, 6, 8, 10, 12, 14, 16, 17, 18, 19, 20, 21, 22, 23, 25, 30]
# (mbs, partition, tp, pp, measured s/iter); dp = 16 / (tp·pp), gbs 32
MEASURED = {
    "amp-het-cluster": [  # Table 8 (Megatron) and Table 9 (AMP)
        (2, [0, 14, 30], 1, 2, 2.27), (4, [0, 14, 30], 1, 2, 2.32), (8, [0, 8, 14, 20, 30], 1, 4, 1.97),
        (8, [0, 14, 30], 2, 2, 2.43), (16, [0, 8, 14, 20, 30], 2, 4, 2.34),
        (1, [0, 7, 14, 20, 30], 1, 4, 1.47), (1, [0, 5, 9, 12, 15, 18, 21, 24, 30], 1, 8, 1.28),
        (1, P16_HET, 1, 16, 1.52), (2, [0, 8, 14, 20, 30], 1, 4, 1.52),
        (2, [0, 5, 9, 12, 14, 17, 20, 23, 30], 1, 8, 1.54)],
    "amp-homogeneous": [  # Table 6 (Megatron) and Table 7 (AMP)
        (1, [0, 30], 1, 1, 1.32), (2, [0, 14, 30], 1, 2, 1.37), (2, [0, 30], 2, 1, 1.58),
        (4, [0, 14, 30], 1, 2, 1.63), (4, [0, 30], 2, 1, 1.53),
        (1, [0, 15, 30], 1, 2, 1.28), (1, [0, 9, 15, 21, 30], 1, 4, 1.20),
        (1, [0, 6, 9, 12, 15, 18, 21, 24, 30], 1, 8, 1.23), (2, [0, 15, 30], 1, 2, 1.38),
        (1, P16_HOM, 1, 16, 1.55)],
}


HOMOGENEOUS_MAPE_SLACK = 0.01  # module docstring


@pytest.mark.parametrize("spec", sorted(MEASURED))
def test_ampe_predicts_amps_measurements_at_least_as_well_as_amp(spec):
    cluster, model, profile = load_cluster(SPECS / f"{spec}.yaml"), load_model("gpt2-amp"), load_profile(AMP_PROFILE)
    cm = CostModel(cluster, model, profile)
    ours, amps, real = [], [], []
    for mbs, part, tp, pp, measured in MEASURED[spec]:
        dp = 16 // (tp * pp)
        ours.append(cm.estimate(Strategy(pp, dp, tp, mbs, 32, tuple(part))).iteration_s)
        amps.append(amp_cost(cluster, model, profile, pp, dp, tp, mbs, 32, part)[0])
        real.append(measured)
    ours, amps, real = map(np.asarray, (ours, amps, real))
    mape_ours, mape_amp = np.mean(np.abs(ours - real) / real), np.mean(np.abs(amps - real) / real)
    rho_ours, rho_amp = spearmanr(ours, real)[0], spearmanr(amps, real)[0]
    print(f"{spec}: ampe MAPE {mape_ours:.1%} Spearman {rho_ours:.3f} | AMP MAPE {mape_amp:.1%} "
          f"Spearman {rho_amp:.3f}")
    assert mape_ours <= mape_amp + (HOMOGENEOUS_MAPE_SLACK if spec == "amp-homogeneous" else 0.0)
    assert rho_ours >= rho_amp
    assert rho_ours > 0.75

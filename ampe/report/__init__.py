"""ampe.report: predicted versus measured trials (Spearman, MAPE, OOM, best vs best, plots) and the calibration that
feeds measurements back into the next search's profile. Reads results folders; starts nothing.

May import: ampe.trials (the results folder and plan reader), ampe.costmodel, ampe.errors, ampe.io.
"""

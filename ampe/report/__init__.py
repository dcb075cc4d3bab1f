"""ampe.report: predicted versus measured trials (Spearman, MAPE, OOM, best vs best, plots) and the calibration that
feeds measurements back into the next search's profile. Reads results folders; starts nothing.

What it may import is docs/layout.md's table (checked by tests/test_layout.py).
"""

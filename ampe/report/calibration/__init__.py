"""The structural calibration behind ``ampe report --calibrate`` (the model, the priors and the selection rule are
described in :mod:`ampe.report.calibrate`), by responsibility: the measured strategies and their inputs
(``measured``), the per-layer table it scales and writes (``table``), the parameter vector and candidate structures
(``structures``), the fit (``fit``), and the structure selection with its folds (``selection``)."""

"""ampe: heterogeneity-aware parallel-strategy and energy planner for large-model training."""

__version__ = "0.1.0"

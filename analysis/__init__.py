"""Analysis: precision model, mpmath ground truth, metrics, bounds, figures, report CLI."""

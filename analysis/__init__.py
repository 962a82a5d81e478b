"""Analysis: precision model, mpmath ground truth, metrics, bounds, figures, report CLI."""

from solvers import __version__  # noqa: F401  (one version for the whole toolkit)

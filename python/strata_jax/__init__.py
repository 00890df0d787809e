"""strata's JAX front-end: it defines models and exports programs; it never trains in production."""

__version__ = "0.1.0"

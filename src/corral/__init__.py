"""Corral: isolated workspaces for AI agents, on the strongest backend the host offers."""

__version__ = "0.1.0"
__all__ = ["__version__"]

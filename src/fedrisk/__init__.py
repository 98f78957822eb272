"""fedrisk: federated optimisation beyond plain averaging."""

__version__ = "0.1.0"

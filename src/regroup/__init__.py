"""regroup: GRPO, DaGRPO and TA-GRPO for reasoning with verifiable rewards."""

__version__ = "0.1.0"

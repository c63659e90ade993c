"""regroup: GRPO, DaGRPO and TA-GRPO for reasoning with verifiable rewards."""

from regroup.runtime.threads import choose_openmp_settings as _choose_openmp_settings

_choose_openmp_settings()  # before torch is imported anywhere in regroup: OpenMP reads it once (runtime.threads)

__version__ = "0.1.0"

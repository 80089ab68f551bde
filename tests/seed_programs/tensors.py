"""The tensor library of the seed programs: real torch, or with SEED_TENSORS=numpy a numpy
stand-in offering the few torch calls the seeds make, so each seed's text runs on both."""
import os

import numpy as np

if os.environ.get("SEED_TENSORS", "torch") == "numpy":
    class torch:  # noqa: N801 - stands in for the torch module
        """torch.zeros / arange / tensor and dtypes, returning numpy arrays (torch's default
        float dtype is float32, and so is this one's)."""

        int64 = np.int64
        float32 = np.float32

        @staticmethod
        def zeros(*shape, dtype=None):
            return np.zeros(shape, dtype or np.float32)

        @staticmethod
        def arange(n, dtype=None):
            return np.arange(n, dtype=dtype or np.int64)

        @staticmethod
        def tensor(values, dtype=None):
            array = np.array(values)
            return array.astype(dtype or (np.float32 if array.dtype.kind == "f" else array.dtype))
else:
    import torch  # noqa: F401

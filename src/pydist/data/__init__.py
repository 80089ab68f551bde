"""Data loading helpers for ``torch.utils.data`` code: ``pydist.data.DistributedSampler``.

``DistributedSampler`` gives the same indices as ``torch.utils.data.DistributedSampler`` for the
same dataset length, replicas, rank, seed and epoch, whether or not torch is installed.
"""
from __future__ import annotations

from .sampler import DistributedSampler, randperm

__all__ = ["DistributedSampler", "randperm"]

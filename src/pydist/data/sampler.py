"""``DistributedSampler``: torch.utils.data.DistributedSampler's indices, with or without torch.

Each of ``num_replicas`` processes draws a disjoint (up to padding) share of a dataset's indices.
The shuffled order is torch's own, bit for bit: ``torch.randperm(n, generator=g)`` after
``g.manual_seed(seed + epoch)``. When torch is already imported it is called exactly so; without
torch, :func:`randperm` replays torch's CPU algorithm (``randperm_cpu`` in ATen's
TensorFactories.cpp) on numpy's MT19937, which is the same Mersenne Twister as ATen's
``at::mt19937`` once it is given the same 624-word state. Torch is never imported here.
"""
from __future__ import annotations

import math
import operator
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np

import pydist as dist

__all__ = ["DistributedSampler", "randperm"]

_MT_STATE_WORDS = 624
_SMALL_N_LIMIT = 0xFFFFFFFF // 20  # randperm_cpu: below this n, 32-bit draws and a forward Fisher-Yates
_CHUNK = 1 << 16                   # random draws generated per numpy call


def _mt19937(seed: int) -> np.random.MT19937:
    """numpy's MT19937 in the state ``at::mt19937(seed)`` starts from (init_genrand, none drawn)."""
    word = seed & 0xFFFFFFFF
    key = [word]
    for j in range(1, _MT_STATE_WORDS):
        word = (1812433253 * (word ^ (word >> 30)) + j) & 0xFFFFFFFF
        key.append(word)
    generator = np.random.MT19937(0)
    generator.state = {"bit_generator": "MT19937",
                       "state": {"key": np.array(key, dtype=np.uint32), "pos": _MT_STATE_WORDS}}
    return generator


def _torch_seed(seed: Any) -> int:
    """``seed`` as ``torch.Generator.manual_seed`` takes it: an int in [-2**63, 2**64)."""
    seed = operator.index(seed)
    if not -(1 << 63) <= seed < (1 << 64):
        raise ValueError("Overflow when unpacking long long")
    return seed


def randperm(n: int, seed: int) -> list[int]:
    """``torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()``, without torch.

    Below ``2**32 // 20`` elements torch swaps ``r[i]`` with ``r[i + random() % (n - i)]`` for
    ``i < n - 1``; from there on it runs the inside-out shuffle with ``random64() % (i + 1)``, where
    ``random64()`` is two 32-bit draws, the first one high. The draws are vectorised; the swaps
    are an O(n) Python loop (about 0.4 s per million elements).
    """
    n = operator.index(n)
    if n < 0:
        raise RuntimeError(f"n must be non-negative, got{n}")
    generator = _mt19937(_torch_seed(seed))
    if n < _SMALL_N_LIMIT:
        return _forward_shuffle(n, generator)
    return _inside_out_shuffle(n, generator)


def _forward_shuffle(n: int, generator: np.random.MT19937) -> list[int]:
    result = list(range(n))
    for start in range(0, n - 1, _CHUNK):
        stop = min(start + _CHUNK, n - 1)
        spans = np.arange(n - start, n - stop, -1, dtype=np.uint64)
        offsets = (generator.random_raw(stop - start) % spans).tolist()
        for i, offset in enumerate(offsets, start):
            j = i + offset
            result[i], result[j] = result[j], result[i]
    return result


def _inside_out_shuffle(n: int, generator: np.random.MT19937) -> list[int]:
    result = list(range(n))
    for start in range(0, n, _CHUNK):
        stop = min(start + _CHUNK, n)
        words = generator.random_raw(2 * (stop - start))
        draws = (words[0::2] << np.uint64(32)) | words[1::2]
        targets = (draws % np.arange(start + 1, stop + 1, dtype=np.uint64)).tolist()
        for i, z in enumerate(targets, start):
            result[i] = result[z]
            result[z] = i
    return result


def _shuffled_indices(n: int, seed: int) -> list[int]:
    """torch's permutation of ``range(n)`` for ``seed``: by torch if it is loaded, else by :func:`randperm`."""
    torch = sys.modules.get("torch")
    if torch is None:
        return randperm(n, seed)
    g = torch.Generator()
    g.manual_seed(seed)
    return torch.randperm(n, generator=g).tolist()


class DistributedSampler:
    """Restricts data loading to this rank's share of a dataset, as torch's DistributedSampler.

    ``dataset`` is anything with ``__len__`` (a torch Dataset, a numpy array, a list).
    ``num_replicas`` and ``rank`` default to ``pydist.get_world_size()`` and ``pydist.get_rank()``.
    With ``shuffle`` the order is torch's ``randperm`` seeded with ``seed + epoch`` (see
    :meth:`set_epoch`), identical on every rank. Without ``drop_last`` the index list is padded
    by repeating it from its start to a multiple of ``num_replicas``; with it, the tail is cut.
    Rank ``r`` then takes every ``num_replicas``-th index from position ``r``.

    It is a plain iterable with ``__len__`` and ``set_epoch``, so it can be passed as
    ``torch.utils.data.DataLoader(dataset, sampler=...)``.

    A job whose world changes mid-epoch (pydist.Elastic) goes on where it was:
    ``set_epoch(epoch, start=s)`` makes this pass take the epoch's order from position ``s``
    (the samples the whole job already took: ranks take interleaved positions, so what ``R``
    ranks took in ``k`` batches of ``b`` is the first ``k*b*R``), split among the sampler's
    ``num_replicas``: no sample is skipped or taken twice in the epoch (beyond torch's padding).
    ``state_dict()``/``load_state_dict()`` carry ``epoch`` and ``start`` (pydist.Elastic heals
    a replacement's sampler with them).
    """

    def __init__(self, dataset: Any, num_replicas: int | None = None, rank: int | None = None,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False) -> None:
        if num_replicas is None:
            if not dist.is_available():
                raise RuntimeError("Requires distributed package to be available")
            num_replicas = dist.get_world_size()
        if rank is None:
            if not dist.is_available():
                raise RuntimeError("Requires distributed package to be available")
            rank = dist.get_rank()
        if rank >= num_replicas or rank < 0:
            raise ValueError(f"Invalid rank {rank}, rank should be in the interval [0, {num_replicas - 1}]")
        self.dataset = dataset
        self.num_replicas = num_replicas
        self.rank = rank
        self.epoch = 0
        self.start = 0
        self.drop_last = drop_last
        self._size_share()
        self.shuffle = shuffle
        self.seed = seed

    def _size_share(self) -> None:
        """``num_samples`` and ``total_size`` of the positions from ``start`` on."""
        remaining = len(self.dataset) - self.start
        if self.drop_last and remaining % self.num_replicas != 0:
            self.num_samples = math.ceil((remaining - self.num_replicas) / self.num_replicas)
        else:
            self.num_samples = math.ceil(remaining / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self) -> Iterator[int]:
        if self.shuffle:
            indices = _shuffled_indices(len(self.dataset), self.seed + self.epoch)
        else:
            indices = list(range(len(self.dataset)))
        indices = indices[self.start:]
        if not self.drop_last:
            padding_size = self.total_size - len(indices)
            if padding_size <= len(indices):
                indices += indices[:padding_size]
            else:
                indices += (indices * math.ceil(padding_size / len(indices)))[:padding_size]
        else:
            indices = indices[:self.total_size]
        if len(indices) != self.total_size:
            raise AssertionError(f"Number of indices ({len(indices)}) does not match total_size ({self.total_size})")
        indices = indices[self.rank:self.total_size:self.num_replicas]
        if len(indices) != self.num_samples:
            raise AssertionError(
                f"Number of subsampled indices ({len(indices)}) does not match num_samples ({self.num_samples})")
        return iter(indices)

    def __len__(self) -> int:
        return self.num_samples

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Set the epoch: with ``shuffle``, each epoch's order is seeded with ``seed + epoch``;
        ``start``: the position in it this pass begins at (see the class note)."""
        if not 0 <= start < max(1, len(self.dataset)):
            raise ValueError(f"start: expected 0 <= start < len(dataset) ({len(self.dataset)}), got {start}")
        self.epoch = epoch
        self.start = start
        self._size_share()

    def state_dict(self) -> dict[str, int]:
        """The epoch and start position (see the class note)."""
        return {"epoch": self.epoch, "start": self.start}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Take a ``state_dict()``: ``set_epoch(state["epoch"], start=state["start"])``."""
        self.set_epoch(int(state["epoch"]), start=int(state["start"]))

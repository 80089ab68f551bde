"""User tensors as flat numpy arrays: numpy, torch CPU tensors and buffer-protocol objects.

``as_buffer(obj, name)`` returns a Buffer whose ``array`` is a 1-D, C-contiguous numpy
array the algorithms read and write. It is a zero-copy view of the user's memory when that
memory is contiguous; otherwise (strided views, torch bfloat16, which numpy lacks and which
is reduced in float32) it is a staging copy and ``write_back()`` writes the result back.
torch is never imported here: a tensor is recognised by its type's module.

A device tensor (a torch tensor on CUDA, an array of the test stand-in: ``device_kind``)
is not host memory: ``as_buffer`` raises DeviceTensorError for it, which the public API
catches to hand the call to the device path (pydist.api.device_collectives); raised out of
a host call (a device tensor among host ones), it names the tensor and its device.
"""
from __future__ import annotations

import ctypes
import sys
from typing import Any

import numpy as np

_SUPPORTED_KINDS = "biufc"


class Buffer:
    """One user tensor, flattened: ``array`` to work on, ``write_back()`` to publish results."""

    __slots__ = ("obj", "name", "array", "dtype_name", "_shape", "staged", "_target", "_from_bf16")

    def __init__(self, obj: Any, name: str, array: np.ndarray, dtype_name: str, shape: tuple[int, ...] | None,
                 target: np.ndarray | None = None, from_bf16: bool = False):
        self.obj = obj
        self.name = name
        self.array = array
        self.dtype_name = dtype_name
        self._shape = shape  # None: ``obj``'s own (a torch tensor's Size costs ~60 ns to make; few calls ask)
        self._target = target
        self._from_bf16 = from_bf16
        #: True when ``array`` is a copy that ``write_back()`` must write back
        self.staged = target is not None

    @property
    def shape(self) -> tuple[int, ...]:
        """The user's tensor's shape."""
        return self._shape if self._shape is not None else self.obj.shape

    def write_back(self) -> None:
        """Copy a staged result back into the user's memory (no-op for zero-copy views)."""
        if self._target is None:
            return
        flat = self.array
        if self._from_bf16:
            flat = float32_to_bf16_bits(flat)
        self._target[...] = flat.reshape(self._target.shape)

    def __repr__(self) -> str:
        return f"Buffer({self.dtype_name}, shape={self.shape})"


def bf16_bits_to_float32(bits: np.ndarray) -> np.ndarray:
    """bfloat16 values stored as int16/uint16 bits, widened exactly to float32."""
    return (bits.astype(np.uint16).astype(np.uint32) << 16).view(np.float32)


def float32_to_bf16_bits(values: np.ndarray) -> np.ndarray:
    """float32 rounded to bfloat16 (round to nearest even, NaN kept), as int16 bits."""
    word = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = (word + (((word >> 16) & 1) + 0x7FFF)) >> 16
    rounded = np.where(np.isnan(values), 0x7FC0, rounded)
    return rounded.astype(np.uint16).view(np.int16)


class DeviceTensorError(ValueError):
    """A device tensor where host memory was expected (see the module docstring): the
    argument's name (``argument``) and the tensor's device (``device``: "cuda:0", "standin:0")."""

    def __init__(self, message: str, argument: str = "", device: str = ""):  # (defaults: unpickled from message)
        super().__init__(message)
        self.argument, self.device = argument, device


def device_kind(obj: Any) -> str | None:
    """"standin" for an array of the test stand-in (pydist.device.standin), "cuda" for a torch
    CUDA tensor, None for anything else (host memory); nothing is imported."""
    kind = type(obj)
    if kind.__name__ == "StandinArray" and kind.__module__.startswith("pydist.device.standin"):
        return "standin"
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor) and obj.is_cuda:
        return "cuda"
    return None


def _on_device(obj: Any, name: str) -> DeviceTensorError:
    place = f"standin:{obj.device.index}" if device_kind(obj) == "standin" else str(obj.device)
    return DeviceTensorError(f"{name}: a tensor on {place} among tensors in host memory; one call's tensors must be "
                             "on one device (move them with .to(device), or this one with .cpu())", name, place)


def _is_torch_tensor(obj: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


class _TensorMemory:
    """A torch tensor's memory described to numpy (``__array_interface__``) without
    ``tensor.numpy()``, which would mark the storage unresizable for good (torch's FSDP
    and PowerSGD resize storages). The array made from it holds this object, and so the
    tensor, alive."""

    __slots__ = ("tensor", "__array_interface__")

    def __init__(self, tensor: Any, dtype: np.dtype, flat: bool = False):
        """``flat``: the tensor is contiguous, described as 1-D."""
        self.tensor = tensor
        if flat:
            shape, strides = (tensor.numel(),), None
        else:
            shape = tuple(tensor.shape)
            strides = None if tensor.is_contiguous() else tuple(step * dtype.itemsize for step in tensor.stride())
        self.__array_interface__ = {"version": 3, "shape": shape, "typestr": _typestr(dtype),
                                    "data": (tensor.data_ptr(), False), "strides": strides}


_NUMPY_DTYPES: dict[Any, np.dtype] = {}  # torch dtype -> numpy dtype
_TYPESTRS: dict[np.dtype, str] = {}


def _typestr(dtype: np.dtype) -> str:
    """``dtype.str``, cached (numpy builds it on each access)."""
    found = _TYPESTRS.get(dtype)
    if found is None:
        found = _TYPESTRS[dtype] = dtype.str
    return found


def _numpy_dtype(torch: Any, dtype: Any, name: str) -> np.dtype:
    """The numpy dtype of a torch dtype (TypeError naming ``name`` if numpy has none)."""
    found = _NUMPY_DTYPES.get(dtype)
    if found is None:
        try:
            found = torch.empty(0, dtype=dtype).numpy().dtype  # a throwaway tensor: its storage may be marked
        except TypeError as error:
            raise TypeError(f"{name}: unsupported tensor dtype {dtype}") from error
        _NUMPY_DTYPES[dtype] = found
    return found


def _torch_to_numpy(obj: Any, name: str, writable: bool) -> tuple[np.ndarray, str, bool]:
    """A torch CPU tensor as a numpy array sharing its memory; bf16 as int16 bits. The
    tensor is left as it was (its storage stays resizable). A conjugate or negative view
    is resolved into a copy when only read, and refused when written (as torch does)."""
    torch = sys.modules["torch"]
    if not obj.is_cpu:  # (is_cpu: ~50 ns, device.type: ~300)
        if obj.is_cuda:
            raise _on_device(obj, name)
        raise ValueError(f"{name}: pydist works on CPU tensors (and CUDA ones); got a tensor on {obj.device} "
                         "(move it with .cpu() first)")
    if obj.layout != torch.strided:
        raise ValueError(f"{name}: only dense (strided) tensors are supported, got {obj.layout}")
    tensor = obj
    if obj.is_conj() or obj.is_neg():
        if writable:
            raise ValueError(f"{name}: this tensor receives data but is a lazily "
                             f"{'conjugated' if obj.is_conj() else 'negated'} view, whose memory "
                             "does not hold its values; resolve it first (t.resolve_conj() / "
                             "t.resolve_neg()) and use the result")
        tensor = obj.resolve_conj().resolve_neg()
    if tensor.dtype == torch.bfloat16:
        return np.asarray(_TensorMemory(tensor, _INT16)), "bfloat16", True
    array = np.asarray(_TensorMemory(tensor, _numpy_dtype(torch, tensor.dtype, name)))
    return array, dtype_name(array.dtype), False


_INT16 = np.dtype(np.int16)
_DTYPE_NAMES: dict[np.dtype, str] = {}


def dtype_name(dtype: np.dtype) -> str:
    """``str(dtype)``, cached (numpy computes it slowly)."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype)
    return name


def _to_numpy(obj: Any, name: str, writable: bool) -> tuple[np.ndarray, str, bool]:
    if isinstance(obj, np.ndarray):
        return obj, dtype_name(obj.dtype), False
    if _is_torch_tensor(obj):
        return _torch_to_numpy(obj, name, writable)
    try:
        view = memoryview(obj)
    except TypeError:
        if device_kind(obj) is not None:
            raise _on_device(obj, name) from None
        raise TypeError(f"{name}: expected a numpy array, a torch CPU tensor or a buffer-protocol "
                        f"object, got {type(obj).__name__}") from None
    if writable and view.readonly:
        raise ValueError(f"{name}: this buffer receives data but is read-only ({type(obj).__name__})")
    array = np.asarray(view)
    return array, dtype_name(array.dtype), False


_TENSOR_CLASSES: set[type] = set()  # torch.Tensor, nn.Parameter...: classes as_buffer took
#: torch dtype taken before -> (numpy dtype, name, complex: its tensors may be lazy conjugates, torch.strided)
_TENSOR_DTYPES: dict[Any, tuple[np.dtype, str, bool, Any]] = {}
_BYTES: dict[int, Any] = {}  # nbytes -> ctypes.c_char * nbytes (bounded: see _memory)
_BYTES_KEPT = 1024
#: (address, nbytes, numpy dtype) -> (a 1-D view of that memory, the alias it holds): see _view
_VIEWS: dict[tuple[int, int, np.dtype], tuple[np.ndarray, Any]] = {}
_VIEWS_KEPT = 256
_VIEW_BYTES = 64 * 1024


def _memory(tensor: Any, nbytes: int) -> Any:
    """The ``nbytes`` bytes at ``tensor.data_ptr()`` as a writable buffer-protocol object that
    holds ``tensor`` (so its memory) alive: numpy's ``frombuffer`` takes it in ~0.1 us, where
    an ``__array_interface__`` object costs ~0.8 (and ``tensor.numpy()`` would mark the
    storage unresizable)."""
    kind: Any = _BYTES.get(nbytes)
    if kind is None:
        if len(_BYTES) >= _BYTES_KEPT:
            _BYTES.clear()
        kind = _BYTES[nbytes] = ctypes.c_char * nbytes
    memory = kind.from_address(tensor.data_ptr())
    memory.tensor = tensor
    return memory


def _view(tensor: Any, nbytes: int, dtype: np.dtype) -> np.ndarray:
    """A 1-D ``dtype`` view of the contiguous ``tensor``'s ``nbytes`` bytes. The views of
    tensors whose whole storage is small (at most _VIEW_BYTES) are kept, at most _VIEWS_KEPT
    of them: a call that repeats on the same memory takes ~0.2 us instead of ~0.43 (torch's
    small calls: issue 49). A kept view holds a detached alias of the tensor it was made for
    (its storage stays allocated, no autograd graph is kept) and serves a tensor at the same
    address, of the same size and dtype, only while that alias is still there: its storage
    may have moved (``resize_``), freeing the address for another tensor's memory, which the
    view would not hold."""
    key = (tensor.data_ptr(), nbytes, dtype)
    kept = _VIEWS.get(key)
    if kept is not None and kept[1].data_ptr() == key[0]:
        return kept[0]
    if nbytes > _VIEW_BYTES or tensor.untyped_storage().nbytes() > _VIEW_BYTES:
        return np.frombuffer(_memory(tensor, nbytes), dtype)  # holds the tensor, pins no big storage
    if len(_VIEWS) >= _VIEWS_KEPT:
        _VIEWS.clear()
    alias = tensor.detach()
    view = np.frombuffer(_memory(alias, nbytes), dtype)
    _VIEWS[key] = (view, alias)
    return view


def _plain_tensor(obj: Any, name: str) -> Buffer | None:
    """The Buffer of a contiguous, dense CPU tensor with elements, of a dtype taken before (not
    bfloat16), not a lazy conjugate or negative view: a 1-D view of its memory made at once
    (as_buffer ~1.0 us; through the general path ~1.8); None for any other tensor."""
    known = _TENSOR_DTYPES.get(obj.dtype)
    if (known is None or not obj.is_cpu or obj.layout is not known[3] or not obj.is_contiguous()
            or (known[2] and obj.is_conj()) or obj.is_neg()):
        return None
    dtype, dtype_name = known[0], known[1]
    nbytes = obj.nbytes
    if not nbytes:
        return None
    return Buffer(obj, name, _view(obj, nbytes, dtype), dtype_name, None)


def as_buffer(obj: Any, name: str, writable: bool = True) -> Buffer:
    """Wrap ``obj`` (named ``name`` in errors); ``writable`` when the operation writes into it."""
    if type(obj) is np.ndarray:  # the common case first (a flags object costs ~0.1 us: read once)
        flags = obj.flags
        if flags.c_contiguous and (flags.writeable or not writable):
            dtype_name = _DTYPE_NAMES.get(obj.dtype)  # checked before
            if dtype_name is not None:
                return Buffer(obj, name, obj if obj.ndim == 1 else obj.reshape(-1), dtype_name, obj.shape)
    if obj.__class__ in _TENSOR_CLASSES:  # a torch tensor of a class met before: its common case next
        buffer = _plain_tensor(obj, name)
        if buffer is not None:
            return buffer
    array, dtype_name, from_bf16 = _to_numpy(obj, name, writable)
    if array.dtype.kind not in _SUPPORTED_KINDS or array.dtype.itemsize == 0:
        _DTYPE_NAMES.pop(array.dtype, None)  # only supported dtypes stay cached (see the fast path)
        raise TypeError(f"{name}: unsupported dtype {dtype_name}; expected bool, int, uint, float "
                        "or complex")
    if writable and not array.flags.writeable:
        raise ValueError(f"{name}: this tensor receives data but its memory is read-only")
    shape = tuple(array.shape)
    if from_bf16:
        return Buffer(obj, name, bf16_bits_to_float32(array.reshape(-1)), dtype_name, shape,
                      target=array, from_bf16=True)
    if _is_torch_tensor(obj):  # this class and dtype are known good from now on (_plain_tensor)
        _TENSOR_CLASSES.add(obj.__class__)
        _TENSOR_DTYPES[obj.dtype] = (array.dtype, dtype_name, array.dtype.kind == "c", sys.modules["torch"].strided)
    if array.flags.c_contiguous:
        return Buffer(obj, name, array.reshape(-1), dtype_name, shape)
    return Buffer(obj, name, np.ascontiguousarray(array).reshape(-1), dtype_name, shape, target=array)

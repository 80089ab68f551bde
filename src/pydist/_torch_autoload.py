"""The ``torch.backends`` entry point: ``import torch`` calls ``load()``, which registers
pydist's backend. A failure here only warns, so that it can never break ``import torch``
(TORCH_DEVICE_BACKEND_AUTOLOAD=0 turns autoloading off altogether)."""
import warnings


def load() -> None:
    try:
        import pydist.torch  # noqa: F401 - registers "pydist" with torch.distributed
    except Exception as error:  # noqa: BLE001
        warnings.warn(f"pydist could not register its torch.distributed backend: {error}", stacklevel=2)

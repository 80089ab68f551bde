"""accelerate under torchrun on BACKEND, by the recipe that works with accelerate 1.15.0:
``torch.distributed.init_process_group(BACKEND)`` first, then ``Accelerator(cpu=True)``, which
adopts the group already made (accelerate refuses ``InitProcessGroupKwargs(backend="pydist")``
itself: "Your assigned backend pydist is not available"). The worker checks both traps first
and reports them: that refusal (pydist only), and that without ``cpu=True`` on a machine with
no GPU accelerate ignores the group and runs as one process of one (``num_processes`` 1).

    torchrun --nproc-per-node 2 accelerate_torchrun.py gloo|pydist OUTDIR
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from _worker import TIMEOUT, args, fit, make_data, make_model, report
from accelerate import Accelerator
from accelerate.state import AcceleratorState
from accelerate.utils import InitProcessGroupKwargs


def refusal(backend: str) -> str | None:
    """accelerate's error for ``InitProcessGroupKwargs(backend=...)`` (None when it accepts it)."""
    try:
        Accelerator(cpu=True, kwargs_handlers=[InitProcessGroupKwargs(backend=backend, timeout=TIMEOUT)])
    except ValueError as error:
        return str(error)
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)  # accelerate's states are singletons
    return None


def processes_without_cpu_flag() -> int:
    """How many processes accelerate sees when the group exists but ``cpu=True`` is left out."""
    try:
        return Accelerator().num_processes
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)


def main() -> None:
    backend, outdir = args()
    torch.set_num_threads(1)  # 2 ranks share 2 cores
    refused = refusal(backend) if backend == "pydist" else None  # gloo's would make the group
    dist.init_process_group(backend, timeout=TIMEOUT)
    without_cpu_flag = processes_without_cpu_flag()
    accelerator = Accelerator(cpu=True)
    assert accelerator.num_processes == 2, accelerator.num_processes
    model = make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(make_data(), batch_size=8, shuffle=False)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    loss = fit(model, optimizer, loader, backward=accelerator.backward)
    report("accelerate", outdir, accelerator.process_index, accelerator.unwrap_model(model), loss,
           group_backend=dist.get_backend(), state_backend=accelerator.state.backend, refused=refused,
           processes_without_cpu_flag=without_cpu_flag)
    accelerator.end_training()  # destroys the process group


if __name__ == "__main__":
    main()

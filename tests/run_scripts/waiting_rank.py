"""A rank that stays up with its connections and shared memory made, until told to end
(tests/test_security_launches.py looks at what the running job exposes).

``waiting_rank.py API SIGNALS``: API "torch" (torch.distributed on backend "pydist") or
"pydist", under any launcher. The rank makes the world and ``new_group([0, 1])`` and
all_reduces on both (so its listeners are open and its segments made), writes
``SIGNALS/ready<rank>`` (its pid), waits for ``SIGNALS/go``, and ends cleanly.
"""
import os
import sys
import time


def main(api: str, signals: str) -> None:
    if api == "torch":
        import torch
        import torch.distributed as dist

        import pydist.torch  # noqa: F401 - registers the backend
        data = torch.ones(4096)
    else:
        import numpy as np

        import pydist as dist
        data = np.ones(4096)
    dist.init_process_group("pydist")
    group = dist.new_group([0, 1])
    dist.all_reduce(data)
    dist.all_reduce(data, group=group)
    rank = dist.get_rank()
    with open(f"{signals}/ready{rank}.tmp", "w") as file:
        file.write(str(os.getpid()))
    os.replace(f"{signals}/ready{rank}.tmp", f"{signals}/ready{rank}")
    ends = time.monotonic() + 120
    while not os.path.exists(f"{signals}/go") and time.monotonic() < ends:
        time.sleep(0.02)  # a file from another process: nothing to wait on but the file system
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

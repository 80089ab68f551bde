"""Lightning Fabric on 2 CPU ranks over BACKEND (its DDP strategy; ``fabric.launch()`` starts
the second rank by running this script again).

    python lightning_fabric.py gloo|pydist OUTDIR
"""
from __future__ import annotations

import torch
from _worker import TIMEOUT, args, fit, make_data, make_model, report
from lightning.fabric import Fabric
from lightning.fabric.strategies import DDPStrategy


def main() -> None:
    backend, outdir = args()
    torch.set_num_threads(1)  # 2 ranks share 2 cores
    fabric = Fabric(accelerator="cpu", devices=2, strategy=DDPStrategy(process_group_backend=backend, timeout=TIMEOUT))
    fabric.launch()
    model = make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    model, optimizer = fabric.setup(model, optimizer)
    loader = fabric.setup_dataloaders(torch.utils.data.DataLoader(make_data(), batch_size=8, shuffle=False))
    loss = fit(model, optimizer, loader, backward=fabric.backward)
    report("fabric", outdir, fabric.global_rank, model.module, loss, world_size=fabric.world_size)


if __name__ == "__main__":
    main()

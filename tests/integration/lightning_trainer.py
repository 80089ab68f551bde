"""Lightning's Trainer on 2 CPU ranks over BACKEND, with Lightning's own launcher (``ddp``: it
starts the second rank by running this script again) or ``ddp_spawn``.

    python lightning_trainer.py gloo|pydist OUTDIR ddp|ddp_spawn
"""
from __future__ import annotations

import sys

import lightning as L
import torch
from _worker import TIMEOUT, args, make_data, make_model, report
from lightning.pytorch.strategies import DDPStrategy


class Report(L.Callback):
    """Each rank reports at the end of training, in its own process (with ``ddp_spawn`` the
    main process only gets rank 0's parameters back)."""

    def __init__(self, name: str, outdir: str) -> None:
        self.name, self.outdir = name, outdir

    def on_train_end(self, trainer, module) -> None:
        report(self.name, self.outdir, trainer.global_rank, module.net, module.last_loss)


class Regression(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = make_model()
        self.last_loss = float("nan")

    def training_step(self, batch, batch_index):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.last_loss = loss.item()
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def main() -> None:
    backend, outdir = args()
    mode = sys.argv[3]
    start_method = {"ddp": "popen", "ddp_spawn": "spawn"}[mode]
    torch.set_num_threads(1)  # 2 ranks share 2 cores
    model = Regression()
    trainer = L.Trainer(accelerator="cpu", devices=2, max_epochs=3, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=outdir,
                        callbacks=[Report(f"lightning-{mode}", outdir)],
                        strategy=DDPStrategy(process_group_backend=backend, start_method=start_method,
                                             timeout=TIMEOUT))
    trainer.fit(model, torch.utils.data.DataLoader(make_data(), batch_size=8, shuffle=False))


if __name__ == "__main__":
    main()

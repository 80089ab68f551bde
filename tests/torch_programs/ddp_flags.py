"""torch's DistributedDataParallel options on 2 ranks, 3 SGD steps each, small buckets:
gradient_as_bucket_view, static_graph, find_unused_parameters (a branch the loss never
uses), and no_sync (2 micro-batches accumulated locally, the third synchronised).

    python ddp_flags.py gloo|pydist
"""
import torch
from _harness import loss_of, main, make_model, rank_batches, state
from torch.nn.parallel import DistributedDataParallel as DDP


class WithUnusedBranch(torch.nn.Module):
    """The MLP plus a layer whose output the loss never sees."""

    def __init__(self):
        super().__init__()
        self.body = make_model()
        self.unused = torch.nn.Linear(8, 2)

    def forward(self, inputs):
        return self.body(inputs)


OPTIONS = {
    "gradient_as_bucket_view": (make_model, {"gradient_as_bucket_view": True}),
    "static_graph": (make_model, {"static_graph": True}),
    "find_unused_parameters": (WithUnusedBranch, {"find_unused_parameters": True}),
}


def train(ddp: DDP, batches: list, micro_batches: int = 1) -> dict:
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(0, len(batches), micro_batches):
        optimizer.zero_grad()
        group = batches[step:step + micro_batches]
        with ddp.no_sync():
            for batch in group[:-1]:
                loss_of(ddp, batch).backward()
        loss_of(ddp, group[-1]).backward()
        optimizer.step()
    return state(ddp.module)


def train_with_each_option(rank: int, size: int, workdir: str) -> dict:
    result = {name: train(DDP(build(), bucket_cap_mb=0.0005, **options), rank_batches(rank, 3))
              for name, (build, options) in OPTIONS.items()}
    result["no_sync"] = train(DDP(make_model(), bucket_cap_mb=0.0005), rank_batches(rank, 6), micro_batches=3)
    return result


if __name__ == "__main__":
    main(train_with_each_option)

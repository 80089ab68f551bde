"""pydist as a torch.distributed backend.

``import pydist.torch`` registers the backend "pydist" with torch.distributed (installing
pydist also registers it at ``import torch``, through the ``torch.backends`` entry point).
Then ``torch.distributed.init_process_group("pydist")``, every torch.distributed call and
``torch.nn.parallel.DistributedDataParallel`` run on pydist. ``pydist.torch.ddp`` holds
pydist's own DistributedDataParallel. torch's env:// rendezvous also reads mpiexec's, srun's
and submitit's variables where torch's own are missing (see env_rendezvous).
"""
from .backend import ProcessGroupPydist
from .elastic import Elastic
from .env_rendezvous import install as _install_env_rendezvous
from .grow import admit_joiners
from .options import Options
from .registration import create_process_group, register
from .shrink import shrink_group

register()
_install_env_rendezvous()

__all__ = ["Elastic", "Options", "ProcessGroupPydist", "admit_joiners", "create_process_group", "register",
           "shrink_group"]

"""Programs the documentation runs, shipped with pydist so that an installed package has them.

- ``pydist-run --nproc-per-node 4 -m pydist.examples.collectives``: point-to-point and every
  collective, what each rank got (numpy only).
- ``pydist-run --nproc-per-node 2 -m pydist.examples.train``: data-parallel training with
  pydist's DDP and sampler (needs torch and scikit-learn: ``pip install 'pydist[demo]'``);
  ``--fault-tolerant`` goes on without the workers that die (fault_tolerant).
- ``python -m pydist.examples.chaos``: that training while workers are killed and stopped.
"""

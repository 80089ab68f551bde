"""The launcher, ``pydist-run`` (torchrun's equivalent): see :mod:`pydist.run.cli`.

Modules: ``cli`` (arguments -> LaunchConfig), ``config`` (worker argv and environment),
``agent`` (store, start/monitor/stop workers, exit code), ``workers`` (process groups),
``output`` (line-prefixed forwarding), ``failure`` (root-cause summary).
"""

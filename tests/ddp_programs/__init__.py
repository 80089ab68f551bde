"""Rank functions and single-process references for tests/test_ddp_training.py.

``training`` holds the models, the data, the DDP rank functions (importable by
thread-ranks and process-ranks alike) and the references they are compared with.
"""

"""clusterddp: start PyTorch DDP training on several machines over SSH, from one command."""

__version__ = "0.1.0"

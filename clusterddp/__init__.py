"""clusterddp: start PyTorch DDP training on several machines over SSH, from one command."""

__version__ = "0.4.0.dev0"

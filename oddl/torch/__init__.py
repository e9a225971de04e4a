"""The `torch.distributed` backend named ``oddl`` (`backend`, which registers it on import) and
the DDP communication hook (`ddp_hook`); the other modules are the backend's parts.

    import oddl.torch.backend  # registers "oddl" with torch.distributed
    dist.init_process_group("oddl")
"""

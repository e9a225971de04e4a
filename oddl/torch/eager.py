"""The backend's process groups run eagerly inside `torch.compile`d code (issue 33).

A model compiled with DistributedDataParallel inside (`torch.compile(ddp)`) calls the process
group's collectives from the compiled region: DDP's optimizer splits the graph at each
gradient bucket, and c10d calls the group's Python methods (the backend API) while TorchDynamo
watches every Python frame. To Dynamo a `ProcessGroup` is an opaque script object whose
attributes it may not read, so tracing into a Python subclass fails ("Member '_work' is not
registered for this opaque object type"). The groups' methods are therefore left out of
tracing (`torch.compiler.disable`): each call is a graph break and runs as it does eagerly,
which is what gloo's C++ methods are to Dynamo too.
"""

from __future__ import annotations

import inspect
from typing import TypeVar

import torch

G = TypeVar("G", bound=type)


def eager_under_compile(cls: G) -> G:
    """`cls` with every method it defines (not the dunders) left out of TorchDynamo's tracing."""
    for name, member in list(vars(cls).items()):
        if inspect.isfunction(member) and not name.startswith("__"):
            setattr(cls, name, torch.compiler.disable(member, recursive=True))
    return cls

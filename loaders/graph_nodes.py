"""Walking a TorchScript graph: every node of a block, those inside its nodes' blocks (an if's branches, a loop's
body) included, in order."""
from __future__ import annotations

from typing import Iterator

import torch


def all_nodes(block: torch._C.Block) -> Iterator[torch._C.Node]:
    for node in block.nodes():
        yield node
        for inner in node.blocks():
            yield from all_nodes(inner)

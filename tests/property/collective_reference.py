"""Brute-force references for syncsim.collectives: the communication patterns built explicitly.

Each function constructs what NCCL builds — the rings of every channel, the two
binary trees of its double binary tree, the chain inside a node — rank by rank,
and counts what each resource carries and which hops a piece of data crosses.
The closed forms in syncsim.collectives must agree with these counts; the
construction rules are NCCL's documented ones, written independently here.
"""

from __future__ import annotations


def rail_gpus(nic: int, gpus: int, nics: int) -> list[int]:
    """GPUs sharing NIC ``nic``'s rail: GPU i uses NIC i mod r; with more NICs than GPUs, NIC j serves GPU j mod g."""
    width = min(gpus, nics)
    return [i for i in range(gpus) if i % width == nic % width]


def ring_pattern(nodes: int, gpus: int, nics: int, channels: int) -> dict:
    """Every channel's ring over ``nodes`` × ``gpus``; per-GPU intra sends and per-NIC sends, in ring edges.

    Channel c leaves each node through NIC c mod nics, from the GPU of that
    NIC's rail that has been the exit least often (channels spread evenly).
    """
    exits = [0] * gpus
    intra_edges = [0] * gpus  # per GPU: channels on which its ring successor is a GPU of its own node
    nic_edges = [0] * nics
    for c in range(channels):
        nic = c % nics
        exit_gpu = min(rail_gpus(nic, gpus, nics), key=lambda i: (exits[i], i))
        exits[exit_gpu] += 1
        for gpu in range(gpus):
            if nodes > 1 and gpu == exit_gpu:
                nic_edges[nic] += 1
            else:
                intra_edges[gpu] += 1
    # One turn of a ring, as hop kinds: inside each node g - 1 GPU-to-GPU hops, then one
    # hop to the next node (or, on one node, the hop that closes the ring inside it).
    turn = (["intra"] * (gpus - 1) + ["inter" if nodes > 1 else "intra"]) * nodes
    return {"intra_edges": intra_edges, "nic_edges": nic_edges, "turn": turn}


def critical_hops(turn: list[str], steps: int) -> dict[str, int]:
    """Hop kinds on the worst path of ``steps`` consecutive hops around a ring (over every start)."""
    worst: dict[str, int] = {"intra": 0, "inter": 0}
    for start in range(len(turn)):
        window = [turn[(start + k) % len(turn)] for k in range(steps)]
        counts = {"intra": window.count("intra"), "inter": window.count("inter")}
        if (counts["inter"], counts["intra"]) > (worst["inter"], worst["intra"]):
            worst = counts
    return worst


def btree_parents(nodes: int) -> list[int]:
    """NCCL's binary tree over ``nodes`` ranks, root 0: parent of each rank (-1 for the root).

    For rank r with lowest set bit b the parent is (r xor b) | 2b, or r xor b
    when that is out of range (the rule stated in NCCL's src/graph/trees.cc).
    """
    parents = [-1] * nodes
    for rank in range(1, nodes):
        bit = rank & -rank
        up = (rank ^ bit) | (bit << 1)
        parents[rank] = up if up < nodes else rank ^ bit
    return parents


def dtree_parents(nodes: int) -> tuple[list[int], list[int]]:
    """NCCL's double binary tree: the btree and its mirror (even counts) or its shift by one (odd counts)."""
    first = btree_parents(nodes)
    if nodes % 2 == 0:
        second = [-1 if first[nodes - 1 - r] < 0 else nodes - 1 - first[nodes - 1 - r] for r in range(nodes)]
    else:
        second = [-1 if first[(r - 1) % nodes] < 0 else (first[(r - 1) % nodes] + 1) % nodes for r in range(nodes)]
    return first, second


def tree_degrees(parents: list[int]) -> list[int]:
    degree = [0] * len(parents)
    for child, parent in enumerate(parents):
        if parent >= 0:
            degree[child] += 1
            degree[parent] += 1
    return degree


def tree_height(parents: list[int]) -> int:
    def depth(rank: int) -> int:
        d = 0
        while parents[rank] >= 0:
            rank, d = parents[rank], d + 1
        return d

    return max(depth(r) for r in range(len(parents)))


def chain_neighbours(gpus: int) -> list[int]:
    """GPU-to-GPU neighbours of each GPU in a node's chain (the head's link up goes to the NIC)."""
    return [(i > 0) + (i < gpus - 1) for i in range(gpus)]

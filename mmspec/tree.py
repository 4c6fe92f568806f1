"""Draft trees: the shape of a tree-shaped step, per row, on the device.

Terms (per row):

- **node**: one fed slot of a tree step. Node 0 is the **root**, the row's last emitted token
  (fed first, as in a chain step); nodes 1..K are the drafts.
- **parent**: ``parents[b, i - 1]`` is the parent of node i, a node < i (nodes are numbered
  so that every node comes after its parent: a topological order).
- **siblings**: the children of one node, in node order (the order verification tries
  them in).
- **depth**: 0 for the root, parent's depth + 1; a node's position is the root's plus its
  depth, so the accepted path's slots have the positions a chain would give them.
- **path**: the root and the accepted drafts, one per depth, ``[B, max_depth + 1]`` node
  indices (``VerifyOutput.path``); the commit keeps exactly those slots.

A chain of K drafts is the tree with ``parents = (0, 1, ..., K - 1)``. Every row has the same
number of nodes K + 1; shapes may differ between rows (dynamic trees), so every derived
table (ancestors, children, depths) is computed on the device, with two host integers known
when the tree is built: the deepest depth and the most children of any node.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Tree:
    """A draft tree per row.

    parents:      [B, K] long, the parent of nodes 1..K (a node index < the node's).
    max_depth:    the deepest node's depth over all rows (host int, >= 1 when K >= 1).
    max_children: the most children any node has (host int).
    """

    parents: torch.Tensor
    max_depth: int
    max_children: int

    @classmethod
    def from_parents(cls, parents, batch: int = 1, device=None) -> "Tree":
        """One shape for every row: ``parents`` a sequence of K ints (node i's parent at
        i - 1, each < i), checked here."""
        parents = [int(p) for p in parents]
        for i, p in enumerate(parents, 1):
            if not 0 <= p < i:
                raise ValueError(f"parents[{i - 1}]={p}: node {i}'s parent must be a node in "
                                 f"[0, {i - 1}] (nodes follow their parents)")
        depth = [0]
        for p in parents:
            depth.append(depth[p] + 1)
        kids = [parents.count(i) for i in range(len(parents) + 1)]
        t = torch.tensor(parents, dtype=torch.long, device=device).expand(batch, -1)
        return cls(t, max(depth), max(kids))

    @classmethod
    def chain(cls, k: int, batch: int = 1, device=None) -> "Tree":
        """K drafts one after another."""
        return cls.from_parents(range(k), batch, device)

    @classmethod
    def uniform(cls, branching, batch: int = 1, device=None) -> "Tree":
        """Every node of depth d has ``branching[d]`` children (level by level)."""
        parents, level, nxt = [], [0], 1
        for b in branching:
            if not isinstance(b, int) or b < 1:
                raise ValueError(f"branching={tuple(branching)}: accepted integers >= 1")
            new = []
            for node in level:
                parents += [node] * b
                new += list(range(nxt, nxt + b))
                nxt += b
            level = new
        return cls.from_parents(parents, batch, device)

    @property
    def num_nodes(self) -> int:
        """K + 1: the root and the drafts."""
        return int(self.parents.shape[1]) + 1

    def full_parents(self) -> torch.Tensor:
        """[B, K + 1] parents with the root its own parent (0)."""
        return torch.cat([self.parents.new_zeros(self.parents.shape[0], 1), self.parents], 1)

    def depths(self) -> torch.Tensor:
        """[B, K + 1] each node's depth (root 0)."""
        par, d = self.full_parents(), torch.zeros_like(self.full_parents())
        for _ in range(self.max_depth):               # parents' depths are final after d rounds
            d = torch.where(torch.arange(d.shape[1], device=d.device) == 0, 0,
                            d.gather(1, par) + 1)
        return d

    def ancestors(self) -> torch.Tensor:
        """[B, K + 1, K + 1] bool: node j is node i itself or one of its ancestors (what
        node i attends to among the step's slots)."""
        par = self.full_parents()
        n = par.shape[1]
        eye = torch.eye(n, dtype=torch.bool, device=par.device).expand(par.shape[0], n, n)
        anc, up = eye.clone(), par
        for _ in range(self.max_depth):            # one level up per round (the root stays)
            anc |= torch.nn.functional.one_hot(up, n).bool()
            up = par.gather(1, up)
        return anc

    def children(self) -> torch.Tensor:
        """[B, K + 1, max_children] long: each node's children in node order, -1 after the
        last."""
        b, k = self.parents.shape
        same = self.parents[:, :, None] == self.parents[:, None, :]              # [B, K, K]
        earlier = torch.ones(k, k, dtype=torch.bool, device=same.device).tril(-1)
        rank = (same & earlier).sum(-1)                                        # among siblings
        table = self.parents.new_full((b, (k + 1) * self.max_children + 1), -1)
        nodes = torch.arange(1, k + 1, device=same.device).expand(b, k)
        table.scatter_(1, self.parents * self.max_children + rank, nodes)
        return table[:, :-1].view(b, k + 1, self.max_children)

    def paths(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Root-to-leaf paths: (nodes [B, L, D + 1] long, each path's nodes by depth, -1 past
        its leaf; L the most leaves of any row, a row with fewer repeating its first path;
        first [B, K + 1] long, the first path through each node)."""
        b, n = self.parents.shape[0], self.num_nodes
        par, depth = self.full_parents(), self.depths()
        leaf = torch.ones(b, n, dtype=torch.bool, device=par.device)
        leaf.scatter_(1, self.parents, False)
        counts = leaf.sum(1)
        width = int(counts.max())
        rank = leaf.long().cumsum(1) - 1                          # each leaf's path index
        slot = torch.arange(width, device=par.device)
        which = torch.where(slot[None] < counts[:, None], slot[None], 0)          # [B, L]
        leaves = (rank[:, None, :] == which[:, :, None]) & leaf[:, None, :]       # [B, L, n]
        node = leaves.float().argmax(-1)                                          # [B, L]
        nodes = node.new_full((b, width, self.max_depth + 1), -1)
        for _ in range(self.max_depth + 1):           # walk up, writing each node at its depth
            d = depth.gather(1, node)
            nodes.scatter_(2, d[..., None], node[..., None])
            node = par.gather(1, node)
        on = (nodes[..., None] == torch.arange(n, device=par.device)).any(2)     # [B, L, n]
        return nodes, on.float().argmax(1)

    def index_select(self, rows: torch.Tensor) -> "Tree":
        """The tree of the rows ``rows`` (indices), e.g. to repeat it for guidance rows."""
        return Tree(self.parents[rows], self.max_depth, self.max_children)

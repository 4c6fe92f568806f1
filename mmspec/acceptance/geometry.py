"""Embedding-table geometry shared by the relaxed rules, computed once per table and cached.

- ``knn_index(table, k)``: the k nearest rows of every row by L2 distance, self excluded
  (LANTERN's latent proximity sets). Chunked, so a 16,384 x d codebook with k = 1000 needs
  the int32 result (65 MB) plus one [chunk, V] distance block.
- ``cosine_groups(table, theta)``: PCG's overlapping groups G(k) = {k} u {t : cos(E_k, E_t) >
  theta} as a sparse CSR matrix M[g, t] = 1 / |S(t)| (t in G(g)), where S(t) = {g : t in G(g)}
  = G(t) by symmetry. Chunked; vocabularies of 65,536 fit when groups are sparse.

The cache is keyed by a fingerprint of the table's contents, so rules built on the same
codebook share one index.
"""

from __future__ import annotations

import hashlib
import warnings
from collections import OrderedDict

import torch

_CACHE: "OrderedDict[tuple, object]" = OrderedDict()
_CACHE_SIZE = 8


def fingerprint(table: torch.Tensor) -> str:
    t = table.detach().to("cpu", torch.float32).contiguous()
    h = hashlib.sha1(t.numpy().tobytes())
    h.update(str(tuple(t.shape)).encode())
    return h.hexdigest()


def _cached(key, build):
    if key in _CACHE:
        _CACHE.move_to_end(key)
        return _CACHE[key]
    value = build()
    _CACHE[key] = value
    if len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return value


def check_table(table, name: str = "embeddings") -> None:
    if not isinstance(table, torch.Tensor) or table.dim() != 2 or table.shape[0] < 1:
        raise ValueError(f"{name} must be a [V, d] tensor (one row per token id), got "
                         f"{getattr(table, 'shape', type(table))}")
    if not bool(torch.isfinite(table).all()):
        raise ValueError(f"{name} contains NaN or inf: accepted finite embeddings")


def _chunk_rows(v: int, budget: int = 1 << 22) -> int:
    return max(1, min(v, budget // max(v, 1)))


def knn_index(table: torch.Tensor, k: int) -> torch.Tensor:
    """[V, k] int32 ids of each row's k nearest other rows (ascending L2 distance).

    Chunks of rows keep the working set to a few tens of MB besides the int32 result.
    """
    v = table.shape[0]
    if k == 0:
        return torch.zeros(v, 0, dtype=torch.int32, device=table.device)

    def build():
        t = table.detach().float()
        out = torch.empty(v, k, dtype=torch.int32, device=t.device)
        sq = (t * t).sum(-1)
        step = _chunk_rows(v)
        for s in range(0, v, step):
            rows = t[s : s + step]
            d = sq[s : s + step, None] + sq[None] - 2 * rows @ t.T        # [c, V]
            d.clamp_min_(0)
            d[torch.arange(rows.shape[0]), torch.arange(s, s + rows.shape[0])] = float("inf")
            out[s : s + step] = d.topk(k, dim=-1, largest=False, sorted=True).indices.to(torch.int32)
        return out

    key = ("knn", fingerprint(table), k, str(table.device))
    return _cached(key, build)


class CosineGroups:
    """Sparse PCG group structure over a [V, d] table.

    matrix:    CSR [V, V], M[g, t] = 1 / |S(t)| for t in G(g) (float64 or float32 on use).
    sizes:     [V] |S(t)| = |G(t)|.
    singleton: True when every group is {k} (theta too high): the rule is then exact.
    """

    def __init__(self, table: torch.Tensor, theta: float):
        t = table.detach().float()
        v = t.shape[0]
        unit = t / t.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        rows, cols = [], []
        step = _chunk_rows(v)
        for s in range(0, v, step):
            cos = unit[s : s + step] @ unit.T                                   # [c, V]
            member = cos > theta
            member[torch.arange(cos.shape[0]), torch.arange(s, s + cos.shape[0])] = True
            r, c = member.nonzero(as_tuple=True)
            rows.append(r + s)
            cols.append(c)
        rows_t, cols_t = torch.cat(rows), torch.cat(cols)
        self.sizes = torch.bincount(rows_t, minlength=v)                       # |G(g)| = |S(g)|
        vals = 1.0 / self.sizes[cols_t].double()
        self.rows, self.cols, self.vals = rows_t, cols_t, vals
        self.num_tokens = v
        self.singleton = bool((self.sizes == 1).all())
        self._mats: dict = {}

    def matrix(self, dtype, device, transpose: bool = False) -> torch.Tensor:
        key = (dtype, str(device), transpose)
        if key not in self._mats:
            r, c = (self.cols, self.rows) if transpose else (self.rows, self.cols)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)   # "invariant checks disabled"
                m = torch.sparse_coo_tensor(torch.stack([r, c]), self.vals.to(dtype),
                                            (self.num_tokens, self.num_tokens)).coalesce()
            self._mats[key] = m.to(device)
        return self._mats[key]

    def apply(self, x: torch.Tensor, transpose: bool = False) -> torch.Tensor:
        """[N, V] -> [N, V]: rows times M^T (coarse-graining) or times M (transpose=True)."""
        m = self.matrix(x.dtype, x.device, transpose)
        return torch.sparse.mm(m, x.T).T


def cosine_groups(table: torch.Tensor, theta: float) -> CosineGroups:
    key = ("cos", fingerprint(table), float(theta), str(table.device))
    return _cached(key, lambda: CosineGroups(table, theta))

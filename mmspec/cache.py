"""Position-based rollback for every cache the targets use.

A batch of rows shares one physical cache whose slots are appended in lock-step; rows that
accepted fewer tokens than others leave *holes*: slots whose validity bit is 0 in the
sequence mask, so later tokens never attend to them. Rows keep their own logical positions
(``next_pos``), so rotary positions stay exact. Rollback never rebuilds anything: it crops
the physical length back (DynamicCache: ``crop(-n)``; StaticCache: move the write pointer)
and records which of the kept slots are valid.

This gives ragged rows (each row keeps its own accepted length) with one physical length:
after a step the cache keeps ``max_b(valid_b)`` new slots and row b has
``max - valid_b`` holes there.
"""

from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass

import torch

try:  # transformers >= 5
    from transformers.cache_utils import (
        Cache,
        DynamicCache,
        DynamicLayer,
        DynamicSlidingWindowLayer,
        StaticCache,
        StaticLayer,
        StaticSlidingWindowLayer,
    )
except ImportError:  # pragma: no cover
    Cache = DynamicCache = StaticCache = StaticLayer = None


def cache_argument(model) -> str:
    """Name of the forward argument that takes the cache: ``cache`` (transformers >= 5.24)
    or ``past_key_values`` (5.17 .. 5.23)."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def physical_length(cache) -> int:
    """Number of slots written in ``cache`` (dynamic caches only: a shape, no sync)."""
    if cache is None:
        return 0
    return int(cache.get_seq_length())


def crop(cache, remove: int) -> None:
    """Drop the last ``remove`` slots of a cache (every layer; encoder caches untouched)."""
    if remove < 0:
        raise ValueError(f"remove={remove}: accepted >= 0")
    if remove == 0 or cache is None:
        return
    target = getattr(cache, "self_attention_cache", cache)  # EncoderDecoderCache
    if not isinstance(target, Cache):
        target.crop(-remove)                      # a cache of its own kind
        return
    # Layer by layer, as Cache.crop. Recurrent states cannot drop slots: the session
    # restores them (``StateSnapshot``). Static layers' write pointers (``cumulative_length``,
    # all that StaticLayer.crop moves; transformers < 5.18 has no crop), one tensor per
    # layer, are moved together in one call (a launch per layer cost 0.3 ms of host time per
    # rollback on a 32-layer model).
    pointers = []
    for layer in target.layers:
        if _is_recurrent(layer):
            if hasattr(layer, "keys"):
                raise TypeError(f"cannot roll back a {type(layer).__name__} cache layer "
                                "(attention and recurrent states in one layer)")
            continue
        pointer = _write_pointer(layer)
        if pointer is not None:
            pointers.append(pointer)
        elif hasattr(layer, "crop"):
            layer.crop(-remove)
        else:
            raise TypeError(f"cannot roll back a {type(layer).__name__} cache layer")
    pointers = list({id(p): p for p in pointers}.values())   # shared pointers move once
    if pointers:
        torch._foreach_sub_(pointers, remove)


def reset(cache) -> None:
    """Empty a reused static cache in place, as ``Cache.reset`` (captured graphs keep its
    tensors' addresses): the static layers' keys and values zeroed in one call, their write
    pointers in another (layer by layer it is three launches per layer at the host's pace;
    one call over both dtypes falls back to the same), any other layer by its own
    ``reset``."""
    if not isinstance(getattr(cache, "layers", None), list):
        cache.reset()                    # a cache of its own kind (encoder-decoder ...)
        return
    zeros = []
    for layer in cache.layers:
        if type(layer).reset is not StaticLayer.reset:
            layer.reset()
            continue
        zeros += [t for t in (getattr(layer, name, None) for name in
                              ("keys", "values", "cumulative_length")) if torch.is_tensor(t)]
        if isinstance(getattr(layer, "cumulative_length", None), int):
            layer.cumulative_length = 0
    for dtype in {t.dtype for t in zeros}:
        torch._foreach_zero_([t for t in zeros if t.dtype == dtype])


def _write_pointer(layer) -> torch.Tensor | None:
    """A static layer's write pointer when a rollback moves only it, else None."""
    own = getattr(type(layer), "crop", None)        # StaticLayer has none before 5.18
    moves_pointer = own is None or own is getattr(StaticLayer, "crop", None)
    pointer = getattr(layer, "cumulative_length", None)
    shared = SharedPointerLayer is not None and isinstance(layer, SharedPointerLayer)
    return pointer if (moves_pointer or shared) and isinstance(pointer, torch.Tensor) else None


class _Pointer:
    """The write pointer the layers of one cache share: a 0-d long tensor, moved to the
    layers' device (and marked as a static address for torch.compile) once."""

    def __init__(self):
        self.value = torch.tensor(0, dtype=torch.long)

    def on(self, device: torch.device) -> torch.Tensor:
        if self.value.device != device:
            self.value = self.value.to(device)
            if not torch.compiler.is_compiling():
                torch._dynamo.mark_static_address(self.value)
        return self.value


if StaticLayer is not None:
    class SharedPointerLayer(StaticLayer):
        """A ``StaticLayer`` whose write pointer (``cumulative_length``) is one tensor shared
        by the cache's layers, moved once per forward by ``advance`` instead of by each
        layer's ``update``: a step of an L-layer model launches one increment, not L.
        ``update`` writes at the pointer and leaves it; ``mmspec.cache.crop`` and ``reset``
        move it once (``crop`` on the layer itself would move the shared pointer once per
        layer: it raises)."""

        def __init__(self, max_cache_len: int, pointer: _Pointer):
            super().__init__(max_cache_len=max_cache_len)
            self.pointer = pointer
            self.cumulative_length = pointer.value

        def lazy_initialization(self, key_states, value_states) -> None:
            super().lazy_initialization(key_states, value_states)
            self.cumulative_length = self.pointer.on(self.device)

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            at = torch.arange(key_states.shape[-2], device=self.device) + self.cumulative_length
            self.keys.index_copy_(2, at, key_states)
            self.values.index_copy_(2, at, value_states)
            return self.keys, self.values

        def crop(self, tokens_to_remove: int) -> None:
            raise TypeError("the layers of this cache share one write pointer: "
                            "mmspec.cache.crop(cache, n) moves it once")
else:  # pragma: no cover
    SharedPointerLayer = None


def dynamic_cache(config):
    """A transformers ``DynamicCache`` for ``config`` whose sliding-window layers keep every
    slot (``DynamicLayer``): a rollback past the window needs the slots a window layer drops,
    and the window is the mask's (``SequenceMask.plan(window=)``)."""
    cache = DynamicCache(config=config)
    cache.layers = [DynamicLayer() if type(layer) is DynamicSlidingWindowLayer else layer
                    for layer in cache.layers]
    return cache


def static_cache(config, max_cache_len: int, shared_pointer: bool = True):
    """A transformers ``StaticCache`` for ``config`` whose sliding-window layers keep every
    slot, as ``dynamic_cache``'s; with ``shared_pointer`` its full attention layers
    (``StaticLayer``) are ``SharedPointerLayer``s sharing one write pointer (other layer
    kinds keep their own). After each forward over it, ``advance(cache, n)``."""
    cache = StaticCache(config=config, max_cache_len=max_cache_len)
    cache.layers = [StaticLayer(max_cache_len=max_cache_len)
                    if type(layer) is StaticSlidingWindowLayer else layer for layer in cache.layers]
    if shared_pointer:
        pointer = _Pointer()
        cache.layers = [SharedPointerLayer(layer.max_cache_len, pointer)
                        if type(layer) is StaticLayer else layer for layer in cache.layers]
        cache.shared_pointer = pointer       # what ``advance`` moves (no walk over the layers)
    return cache


def additive_masks(masks, dtype: torch.dtype):
    """Bool masks (a tensor or ``shaped``'s dict) as additive ones of ``dtype``: 0 visible,
    the dtype's minimum hidden (what eager attention adds to its scores)."""
    if isinstance(masks, dict):
        return {k: additive_masks(m, dtype) for k, m in masks.items()}
    return (~masks).to(dtype) * torch.finfo(dtype).min


@dataclass
class Blocks:
    """A prompt's blocks whose tokens see each other both ways in its pass (an image's tokens,
    a prefix-LM's prompt): ``ids`` [B, n] long, the fed tokens' blocks, -1 outside a block;
    ``keys`` [B, P]: the blocks of the slots from 0 on (the cache's prompt), where the fed
    tokens' own are not all (the first step refeeding the prompt's last token); default the
    fed tokens' ids at their slots. ``sliding_only``: on the sliding-window layers alone
    (Gemma 4's), else on every layer (Gemma 3's, PaliGemma's). ``past_window``: on the
    sliding-window layers a block's tokens see the whole block past the window (PaliGemma 2's
    prefix: window-causal OR block); else the window bounds the block too (Gemma 3's and
    4's images: window AND (causal OR block)), as each model's own masks combine them."""

    ids: torch.Tensor
    sliding_only: bool = False
    keys: torch.Tensor | None = None
    past_window: bool = False


@dataclass(frozen=True)
class Window:
    """A model's sliding-window layers: ``size`` positions back (the query's own included,
    as transformers counts them); ``alone``: every attention layer is windowed (Mistral's),
    so the model takes the windowed mask alone, not one mask per layer kind."""

    size: int
    alone: bool = False


def shaped(mask: torch.Tensor, seq: torch.Tensor, pos: torch.Tensor, new: torch.Tensor,
           window: Window | None = None, blocks: Blocks | None = None):
    """A step's bool mask [R, n, W] (new token i sees slot j) as a model takes it: [R, 1, n, W],
    or for a model with sliding-window layers {"full_attention": it, "sliding_attention": it
    where the slot's position is less than ``window.size`` before the query's} (the latter
    alone where ``window.alone``).

    seq [R, W] the slots' validity (new slots included); pos [R, n] the new tokens'
    positions; new [n] their slots. ``blocks`` (``ids`` [R, n]): new tokens of one block see
    each other both ways, as the model's own prompt pass sees them, past any window.
    Positions are counts of real tokens: a hole or padding between two tokens does not count
    toward the window, as it does not in decoding without holes."""
    same = _same_block(blocks, seq, new) if blocks is not None else None
    full = mask | same if same is not None and not blocks.sliding_only else mask
    if window is None:
        return full[:, None]
    near = pos[:, :, None] - (seq.cumsum(1) - 1)[:, None, :] < window.size
    own = new[None, :, None] == torch.arange(mask.shape[-1], device=mask.device)[None, None]
    if same is None:
        sliding = mask & near | own
    elif blocks.past_window:
        sliding = mask & near | own | same
    else:
        sliding = (mask | same) & near | own
    return sliding[:, None] if window.alone else {"full_attention": full[:, None],
                                                  "sliding_attention": sliding[:, None]}


def _same_block(blocks: Blocks, seq: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """[R, n, W]: new token i and slot j hold tokens of one block (j a real token)."""
    ids = blocks.ids
    if blocks.keys is None:
        keys = torch.full(seq.shape, -1, dtype=ids.dtype, device=ids.device).index_copy(1, new, ids)
    else:
        keys = torch.nn.functional.pad(blocks.keys, (0, seq.shape[1] - blocks.keys.shape[1]),
                                       value=-1)
    return (ids[:, :, None] == keys[:, None, :]) & (ids[:, :, None] >= 0) & seq.bool()[:, None, :]


def advance(cache, n: int) -> None:
    """Move ``cache``'s shared write pointer (``static_cache``) by ``n`` after a forward wrote
    n slots at it (the layers' first writes put it on their device); a cache without one is
    left as it is."""
    pointer = getattr(cache, "shared_pointer", None)
    if pointer is not None:
        pointer.value.add_(n)


def gather_tail(cache, n: int, index: torch.Tensor, length: int | None = None) -> None:
    """Reorder the last ``n`` slots per row: the j-th of them becomes the ``index[r, j]``-th
    (index [R, k], k <= n; the slots past k are left as they were, to be cropped). A tree
    step's commit moves each row's accepted path to the front of the step's slots this way.
    ``length``: the physical length of a static cache (dynamic layers know theirs)."""
    target = getattr(cache, "self_attention_cache", cache)
    k = index.shape[1]
    for layer in getattr(target, "layers", None) or []:
        if _is_recurrent(layer) or "Sliding" in type(layer).__name__:
            raise TypeError(f"cannot reorder a {type(layer).__name__} cache layer (tree steps "
                            "need full attention caches)")
        for name in ("keys", "values"):
            t = getattr(layer, name)
            end = t.shape[-2] if length is None else length
            idx = index[:, None, :, None].expand(t.shape[0], t.shape[1], k, t.shape[3])
            t[:, :, end - n:end - n + k] = t[:, :, end - n:end].gather(2, idx)


def _is_recurrent(layer) -> bool:
    return hasattr(layer, "recurrent_states") and hasattr(layer, "conv_states")


def recurrent_layers(cache) -> list:
    """The cache's layers that hold recurrent and convolution states (linear attention such
    as Qwen3.5's Gated DeltaNet): a rollback restores them, it cannot move a length."""
    target = getattr(cache, "self_attention_cache", cache)
    return [layer for layer in getattr(target, "layers", None) or [] if _is_recurrent(layer)]


@contextlib.contextmanager
def repeated_rows(cache, rows: int, repeats: int):
    """For the body of the ``with``: the cache's rows each repeated ``repeats`` times (row r
    -> rows r * repeats .. r * repeats + repeats - 1; ``Cache.reorder_cache``, as beam search
    does); after it every layer holds its own tensors again, so what the body fed is gone.

    A static cache's slots are repeated even where none is written yet (a reused cache at
    length 0, which ``reorder_cache`` skips), and the tensors the body updates in place
    (a static layer's ``cumulative_length``) get their values back."""
    layers = getattr(cache, "self_attention_cache", cache).layers
    saved = [{k: dict(v) if isinstance(v, dict) else v for k, v in vars(layer).items()}
             for layer in layers]
    device = next((t.device for layer in layers for t in _tensors(layer)), None)
    if device is not None:                  # an empty cache makes its rows in the body
        index = torch.arange(rows, device=device).repeat_interleave(repeats)
        cache.reorder_cache(index)
        for layer in layers:
            for name in ("keys", "values"):
                t = getattr(layer, name, None)
                if isinstance(t, torch.Tensor) and t.dim() == 4 and t.shape[0] == rows:
                    setattr(layer, name, t.index_select(0, index))
    kept = [(t, t.clone()) for layer, attrs in zip(layers, saved)
            for k, t in vars(layer).items() if isinstance(t, torch.Tensor) and attrs[k] is t]
    try:
        yield
    finally:
        for layer, attrs in zip(layers, saved):
            vars(layer).clear()
            vars(layer).update(attrs)
        for t, value in kept:
            t.copy_(value)


def _tensors(layer):
    for v in vars(layer).values():
        for t in v.values() if isinstance(v, dict) else (v,):
            if torch.is_tensor(t):
                yield t


@dataclass
class StateSnapshot:
    """Copies of every recurrent layer's states at one point of a sequence, restored in place
    (the tensors keep their addresses, so captured steps still read them).

    A recurrent layer's state after a verification step has consumed all K + 1 fed tokens;
    the state at an accepted length n is the snapshot from before the step with the n kept
    tokens fed again (the session's ``commit`` does that), which is exactly the state plain
    decoding of those tokens reaches."""

    saved: list          # (layer, {state index: (conv, recurrent, has previous state)})

    @classmethod
    def take(cls, layers: list) -> "StateSnapshot":
        def copy(t):
            return None if t is None else t.clone()
        return cls([(layer, {i: (copy(layer.conv_states[i]), copy(layer.recurrent_states[i]),
                                 layer.has_previous_state[i])
                             for i in range(layer.number_of_states)}) for layer in layers])

    def restore(self, rows: torch.Tensor | None = None) -> None:
        """The saved states back, in place: every row, or only ``rows`` (indices)."""
        for layer, states in self.saved:
            for i, (conv, recurrent, seen) in states.items():
                for now, then in ((layer.conv_states, conv), (layer.recurrent_states, recurrent)):
                    if now[i] is None:
                        continue
                    if rows is None:                # not started then: zeros, as fresh
                        now[i].copy_(then) if then is not None else now[i].zero_()
                    elif then is not None:
                        now[i][rows] = then[rows]
                if rows is None:
                    layer.has_previous_state[i] = seen


@dataclass
class SequenceMask:
    """Validity of every physical slot and the next logical position of every row.

    mask:     [B, L] long  1 = a real token, 0 = left padding or a hole.
    next_pos: [B] long     logical position of the next token fed for each row.
    """

    mask: torch.Tensor
    next_pos: torch.Tensor

    @classmethod
    def from_prompt(cls, attention_mask: torch.Tensor) -> "SequenceMask":
        """Empty sequence (L = 0) whose rows start at position 0."""
        b = attention_mask.shape[0]
        dev = attention_mask.device
        return cls(mask=torch.zeros(b, 0, dtype=torch.long, device=dev),
                   next_pos=torch.zeros(b, dtype=torch.long, device=dev))

    @property
    def length(self) -> int:
        return int(self.mask.shape[1])

    def plan(self, valid: torch.Tensor, tree: "TreeMask | None" = None,
             window: Window | None = None, blocks: Blocks | None = None):
        """Inputs for a forward appending ``valid.shape[1]`` slots.

        valid [B, n] (0/1) -> attention_mask [B, L + n], position_ids [B, n].
        Invalid inputs (padding) repeat the previous position; they are masked out anyway.
        With a ``tree``: a bool 4-D mask [B, 1, n, L + n] (the step's slots see their
        ancestors only; every slot sees itself) and positions by depth. With a ``window``
        (sliding-window layers) or prompt ``blocks``: the bool masks of ``shaped``.
        """
        valid = valid.to(torch.long)
        if tree is None:
            pos = self.next_pos[:, None] + valid.cumsum(1) - valid
            seq = torch.cat([self.mask, valid], dim=1)
            if window is None and blocks is None:
                return seq, pos
            n, width = valid.shape[1], seq.shape[1]
            new = torch.arange(width - n, width, device=valid.device)
            causal = torch.arange(width, device=valid.device)[None] <= new[:, None]
            mask = (seq.bool()[:, None, :] & causal[None]) | (new[:, None] == torch.arange(
                width, device=valid.device)[None])[None]
            return shaped(mask, seq, pos, new, window, blocks), pos
        b, n = valid.shape
        m = tree.ancestors.shape[2]
        cut = self.length - (m - n)                      # the tree covers the last m slots
        past = self.mask[:, :cut].bool()[:, None, :].expand(b, n, cut)
        seen = torch.cat([self.mask[:, cut:], valid], 1).bool()[:, None, :]
        own = torch.zeros(n, m, dtype=torch.bool, device=valid.device)
        own[:, m - n:] = torch.eye(n, dtype=torch.bool, device=valid.device)
        new = (tree.ancestors & seen) | own
        # padding (rows that ended) repeats the previous position, as in a chain
        return torch.cat([past, new], -1)[:, None], self.next_pos[:, None] + tree.offsets * valid

    def append(self, valid: torch.Tensor) -> None:
        """Record appended slots (after the forward)."""
        valid = valid.to(torch.long)
        self.mask = torch.cat([self.mask, valid], dim=1)
        self.next_pos = self.next_pos + valid.sum(1)

    def rollback(self, remove: int) -> None:
        """Forget the last ``remove`` slots; their validity lowers next_pos."""
        if remove == 0:
            return
        self.next_pos = self.next_pos - self.mask[:, -remove:].to(torch.long).sum(1)
        self.mask = self.mask[:, :-remove]

    def repeat_rows(self, repeats: int) -> "SequenceMask":
        """A copy with every row repeated ``repeats`` times (as ``repeated_rows``)."""
        return SequenceMask(self.mask.repeat_interleave(repeats, 0),
                            self.next_pos.repeat_interleave(repeats, 0))

    def invalidate_tail(self, n: int, keep_valid: torch.Tensor) -> None:
        """Among the last ``n`` slots, mark valid only where ``keep_valid`` [B, n] is true."""
        tail = self.mask[:, -n:]
        dropped = tail * (1 - keep_valid.to(torch.long))
        self.next_pos = self.next_pos - dropped.sum(1)
        self.mask = torch.cat([self.mask[:, :-n], tail - dropped], dim=1)


@dataclass
class TreeMask:
    """A tree step's attention and positions over the last m slots (the n fed now last):
    ``ancestors`` [R, n, m] bool (new slot i sees slot j of those m, besides every slot
    before them), ``offsets`` [R, n] long (positions: the row's next position + offset).
    A target's tree step has m = n and offsets = depths (``mmspec.tree.Tree``); a drafter
    that feeds its tree level by level covers the levels fed before as well."""

    ancestors: torch.Tensor
    offsets: torch.Tensor


class StaticSequenceMask:
    """``SequenceMask`` for a static cache of S slots, kept in fixed device buffers so a
    captured step can read and advance it: the validity of every slot in ``buf`` [R, S], the
    physical length on the host (``length``) and on the device (``dev_len`` [1]), and
    ``next_pos`` [R]. Slots at or past the length hold stale bits that no mask reads.

    ``advance`` is the step's device side (inside a captured graph: no host value): write the
    new slots' validity, return the 4-D mask [R, 1, n, W] (W <= S: the slots attention reads,
    ``mmspec.engine.attention``) and the positions [R, n], and move
    ``next_pos`` and ``dev_len``; the host then calls ``appended(n)``."""

    def __init__(self, buf: torch.Tensor, dev_len: torch.Tensor, next_pos: torch.Tensor):
        self.buf, self.dev_len, self.next_pos = buf, dev_len, next_pos
        self.slots = torch.arange(buf.shape[1], device=buf.device)
        self.length = 0

    @classmethod
    def allocate(cls, rows: int, slots: int, device) -> "StaticSequenceMask":
        z = dict(dtype=torch.long, device=device)
        return cls(torch.zeros(rows, slots, **z), torch.zeros(1, **z), torch.zeros(rows, **z))

    def reset(self) -> "StaticSequenceMask":
        """Empty (L = 0), in place: captured steps keep the buffers' addresses."""
        self.buf.zero_()
        self.dev_len.zero_()
        self.next_pos.zero_()
        self.length = 0
        return self

    @property
    def mask(self) -> torch.Tensor:
        return self.buf[:, :self.length]

    def check_room(self, n: int) -> None:
        if self.length + n > self.buf.shape[1]:
            raise RuntimeError(f"static cache full: {self.length + n} slots needed, "
                               f"static_len={self.buf.shape[1]}")

    def advance(self, valid: torch.Tensor, width: int | None = None,
                additive: torch.dtype | None = None, tree: "TreeMask | None" = None,
                window: Window | None = None, blocks: Blocks | None = None):
        """valid [R, n] long -> (mask [R, 1, n, W] over the first W = ``width`` slots
        (default S; at least L + n), position_ids [R, n]). Slot j is visible to new token i
        when it holds a real token and j <= L + i; every token sees itself (so padding rows
        stay finite). Invalid inputs repeat the previous position. The mask is bool (True =
        visible, what SDPA takes), or with ``additive`` a float mask of that dtype (0 visible,
        the dtype's minimum hidden: what eager attention adds to its scores). With a
        ``tree`` the step's slots see only their ancestors and positions follow depths. With a
        ``window`` (sliding-window layers) or prompt ``blocks``: the masks of ``shaped``."""
        n = valid.shape[1]
        w = self.buf.shape[1] if width is None else width
        idx = self.dev_len + self.slots[:n]                                 # the new slots
        self.buf.index_copy_(1, idx, valid)
        steps = valid.cumsum(1) - valid if tree is None else tree.offsets * valid
        pos = self.next_pos[:, None] + steps
        q = idx[:, None]
        slots = self.slots[None, :w]
        mask = (self.buf[:, :w].bool()[:, None, :] & (slots <= q)[None]) | (slots == q)[None]
        if tree is not None:
            m = tree.ancestors.shape[2]
            rel = self.slots[:w] - self.dev_len + (m - n)       # slot -> the tree's last m
            ours = (rel >= 0) & (rel < m)
            anc = tree.ancestors[:, :, rel.clamp(0, m - 1)]                     # [R, n, W]
            mask = torch.where(ours[None, None], mask & anc, mask)
        self.next_pos.add_(valid.sum(1))
        self.dev_len.add_(n)
        masks = shaped(mask, self.buf[:, :w], pos, idx, window, blocks)
        return (masks if additive is None else additive_masks(masks, additive)), pos

    def undo(self, valid: torch.Tensor) -> None:
        """Take back one ``advance`` of ``valid`` (a captured step's warm-up runs)."""
        self.next_pos.sub_(valid.sum(1))
        self.dev_len.sub_(valid.shape[1])

    def appended(self, n: int) -> None:
        self.length += n

    def rollback(self, remove: int) -> None:
        if remove == 0:
            return
        self.next_pos.sub_(self.buf[:, self.length - remove:self.length].sum(1))
        self.dev_len.sub_(remove)
        self.length -= remove

    def repeat_rows(self, repeats: int) -> "StaticSequenceMask":
        """A copy with every row repeated ``repeats`` times (as ``repeated_rows``), in buffers
        of its own: advancing it leaves this mask as it was."""
        out = StaticSequenceMask(self.buf.repeat_interleave(repeats, 0), self.dev_len.clone(),
                                 self.next_pos.repeat_interleave(repeats, 0))
        out.length = self.length
        return out

    def invalidate_tail(self, n: int, keep_valid: torch.Tensor) -> None:
        tail = self.buf[:, self.length - n:self.length]
        dropped = torch.where(keep_valid.to(torch.bool), 0, tail)
        self.next_pos.sub_(dropped.sum(1))
        tail.sub_(dropped)


def take_slots(t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """t [R, n, *event] at ``index`` [R, m] along the slots -> [R, m, *event]."""
    index = index.view(*index.shape, *[1] * (t.dim() - 2))
    return t.gather(1, index.expand(*index.shape[:2], *t.shape[2:]))

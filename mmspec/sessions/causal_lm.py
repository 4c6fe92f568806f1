"""``CausalLMSession`` implements it for any transformers causal LM (``model(input_ids |
inputs_embeds, attention_mask, position_ids, cache)``), with optional classifier-free guidance as a doubled batch: rows [0, B) are
conditional, rows [B, 2B) unconditional, both fed the same tokens and rolled back together;
the returned distributions are of the guided logits u + s (c - u).

Adapters subclass it to change how ids become inputs (``embed``; the first step after the
prompt feeds the prompt's last token, which may live in another id space), how outputs become
logits (``logits``), which ids are allowed where (``mask_logits``, given each predicted
token's index among the generated tokens) and what a step returns (``distributions``:
probabilities by default, densities for continuous tokens, frame distributions for CSM).
"""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass

import torch

from .. import distributions
from ..cache import (Blocks, DynamicCache, SequenceMask, StaticSequenceMask,
                    TreeMask, Window, additive_masks, advance, cache_argument, crop, dynamic_cache,
                    gather_tail, recurrent_layers, reset, static_cache)
from ..distributed import split_group
from ..engine import regions
from ..engine.attention import bucket, module_configs, prefix, sdpa_configs
from ..engine.capture import Captured, compiled, give_back, release, take
from ..engine.plan import Engine, compile_mode
from ..model_facts import decoder_config as _decoder_config
from ..model_facts import max_positions, output_vocab_size  # noqa: F401  (sessions' names)
from ..sampling import SamplingParams, guide
from .base import Session
from .captured import CapturedSteps
from .prompt import prompt_blocks as _prompt_blocks
from .prompt import refeed_blocks, step_blocks, with_uncond
from .recurrent import RecurrentSteps


@dataclass(frozen=True)
class NetFacts:
    """What sessions read of a network's structure, found once per network (``net_facts``)."""

    configs: tuple      # its modules' configs, each once (``attention.module_configs``)
    recurrent: bool     # its cache has recurrent layers (``cache.recurrent_layers``)
    sliding: bool       # some cache layer keeps a sliding window
    cache_arg: str      # the forward argument that takes the cache (``cache.cache_argument``)


_FACTS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def net_facts(net) -> NetFacts:
    """``net``'s ``NetFacts``, kept weakly per network as its static caches are
    (``release_graphs`` forgets them): walking a 32-layer model's modules and building a
    probe cache took about a millisecond of every call's set-up."""
    facts = _FACTS.get(net)
    if facts is None:
        probe = DynamicCache(config=net.config)
        layers = getattr(probe, "layers", [])
        facts = _FACTS[net] = NetFacts(
            module_configs(net), bool(recurrent_layers(probe)),
            any(getattr(layer, "is_sliding", False) for layer in layers), cache_argument(net))
    return facts


def _window(cfg) -> Window:
    """The decoder's sliding window; alone where every attention layer is windowed."""
    kinds = set(getattr(cfg, "layer_types", None) or ["sliding_attention"])
    return Window(cfg.sliding_window, alone=kinds <= {"sliding_attention"})



def release_graphs(model=None) -> None:
    """Free the static caches and captured steps kept for ``model`` (all models if None).

    Static caches (``static_cache=True``, ``compile=True``) are kept after a call returns, so
    that the next call with the same rows and cache length reuses them and replays the
    captured steps instead of capturing them again. Call it after replacing a model's
    Parameters (``param.data = ...``): captured steps read the weights where they were, and
    ``compile=True`` lays the model's projections out again at its next call."""
    if model is None:
        release()
        _FACTS.clear()
    else:
        modules = list(model.modules())    # the network a session runs may be a part of it
        release(modules)
        for module in modules:
            _FACTS.pop(module, None)
    regions.forget_layout(model)



def _engine_of(model, static_len: int | None, compile, engine: Engine | None) -> Engine:
    """A session's engine: ``engine``, or the one ``compile=`` (and ``static_len``) names;
    captured modes refused without a static cache or a CUDA device."""
    if engine is not None and compile is not False:
        raise ValueError("engine: accepted an Engine, given instead of compile= (not with it)")
    if (engine.compile if engine is not None else compile_mode(compile)) and static_len is None:
        raise ValueError("compile=True needs a static cache (static_len)")
    if engine is None:
        engine = Engine.from_switches(compile, static_cache=static_len is not None)
    return engine.check(model)


def _attention_plan(net, facts: NetFacts, static_len: int | None, compile) -> tuple:
    """(the configs whose attention runs over a bucket of a static cache's slots, whether the
    decoder's is one of them, whether steps are bucketed).

    Prefix attention (``mmspec.engine.attention``) for SDPA models on a static cache; not
    under "inductor" (its fused steps would be compiled again for every width). Under
    "regional" every pass runs the prefix function (full width included), so the layers' one
    trace serves every width (the mask's width is a dynamic size). The decoder's attention
    decides (a VLM's vision tower may differ; it gets no 4-D mask). 4-D masks are additive,
    in the model's dtype: eager attention adds them to its scores; SDPA would turn a bool
    mask into one in every layer (a kernel per layer and step), so under prefix attention
    (which casts a mask of another dtype) the step builds it once. SDPA over the whole cache
    keeps bool masks (it checks the dtype)."""
    configs = sdpa_configs(facts.configs) if static_len is not None else []
    text_sdpa = any(c is _decoder_config(net) for c in configs)
    return configs, text_sdpa, text_sdpa and compile in (False, "graphs", "regional")


def _kept_static(session, rows: int, device) -> Captured:
    """A static cache of the session's shape and engine for ``rows`` rows, with the steps
    captured on it, from an earlier call where one is kept (``engine.capture``), zeroed in
    place (captured graphs keep their addresses); given back when the session is collected."""
    net, engine = session.net, session.engine

    def make():
        return Captured(static_cache(net.config, session.static_len, engine.shared_pointer))
    w = next(net.parameters())
    key = (rows, session.static_len, engine.mode, engine.speed, str(w.device), w.dtype)
    entry = take(net, key, make)
    reset(entry.cache)
    if entry.seq is None:
        entry.seq = StaticSequenceMask.allocate(rows, session.static_len, device)
    weakref.finalize(session, give_back, weakref.ref(net), key, entry)
    return entry


def _tree_mask(session, tree, n: int) -> TreeMask:
    """A ``Tree`` over the n slots a session is fed (or a ``TreeMask`` as is), for every row
    (the unconditional rows too)."""
    if not session.trees:
        raise ValueError("tree steps need a cache whose layers all attend over every slot "
                         "(this model has recurrent or sliding-window layers): accepted a "
                         "chain (tree=None)")
    rows = session._rows
    if isinstance(tree, TreeMask):
        return TreeMask(rows(tree.ancestors), rows(tree.offsets))
    if tree.num_nodes != n or tree.parents.shape[0] != session.batch_size:
        raise ValueError(f"tree of {tree.num_nodes} nodes x {tree.parents.shape[0]} rows for "
                         f"a step of {n} slots x {session.batch_size} rows: accepted equal sizes")
    return TreeMask(rows(tree.ancestors()), rows(tree.depths()))


@dataclass(frozen=True)
class CaptureTraits:
    """What an adapter's hooks allow a captured step to do (a captured graph keeps the
    addresses of what it reads: a tensor of one call's session would be freed under it).

    chain_hooks:   the hooks (embed, position_ids, logits, mask_logits, distributions) run on
                   the device alone and read only the model's weights and ``persistent``
                   buffers: a chain of steps, and a step's distributions, can be captured
                   (``chains``). False where a hook reads host values or draws by itself.
    prompt_graphs: ``position_ids(prompt=True)`` reads only ``persistent`` buffers, so a
                   prompt pass can be captured (False: prompt positions are per call).
    row_buffers:   per-row tensors the hooks read during a forward (``position_ids``' rope
                   deltas), repeated with the cache's rows while a tree is fed as its paths
                   (``RecurrentSteps.paths_step``).
    """

    chain_hooks: bool = True
    prompt_graphs: bool = True
    row_buffers: tuple[str, ...] = ()


class CausalLMSession(Session):
    """A transformers causal LM, its cache and its sequence mask.

    model:          a causal LM returning ``.logits`` [B, n, V].
    params:         SamplingParams applied to the (guided) logits.
    guidance_scale: None for no guidance; else a float s >= 0 and ``uncond_ids`` given at
                    ``prefill``.
    static_len:     None: a DynamicCache (crop on rollback). An int: a transformers
                    StaticCache of that many slots, position-indexed; rollback moves its
                    length (nothing is copied); steps pass a 4-D mask [rows, 1, n, static_len]
                    (a public argument) so every step of a width has fixed shapes. The
                    sequence mask lives in fixed device buffers (``StaticSequenceMask``) and
                    the mask and positions are built from them inside the step, so a captured
                    step is one copy of its inputs and one replay.
    compile:        capture each step width once as a CUDA graph and replay it (a static
                    cache and a CUDA device): a captured mode of ``mmspec.engine.plan``
                    (``CapturedSteps``).
    net:            the module called for each step, when it is a part of ``model`` (default:
                    ``model``).
    engine:         the call's ``Engine`` instead of ``compile`` (``Plan.cache`` gives both).
    capture:        the class's ``CaptureTraits`` (adapters declare theirs).
    """

    capture = CaptureTraits()
    _recurrent: list = []         # the cache's recurrent layers (set by ``prefill``)

    def __init__(self, model, params: SamplingParams, guidance_scale: float | None = None,
                 static_len: int | None = None, compile: bool | str = False, net=None,
                 engine: Engine | None = None):
        engine = _engine_of(model, static_len, compile, engine)
        compile = engine.compile
        self.static_len = static_len
        self.engine = engine            # its speed switches (``Engine``), read by captured steps
        self.compile = compile
        self._static: Captured | None = None   # the static cache and the steps captured on it
        self._captured = CapturedSteps(self) if compile else None
        self.model = model
        # The module that is called: the model, or a part of it an adapter names (Janus's
        # language model, CSM's backbone); its cache, attention and positions are the ones used.
        self.net = model if net is None else net
        self.params = params
        self.guidance_scale = guidance_scale
        self.vocab_size = output_vocab_size(model)
        facts = net_facts(self.net)
        self.recurrent, sliding = facts.recurrent, facts.sliding
        # Sliding-window layers: their caches keep every slot (a rollback needs them) and the
        # step's masks carry the window (``cache.shaped``), counted in positions.
        self.window = _window(_decoder_config(self.net)) if sliding else None
        # Tree steps need every layer to attend through the step's mask: linear attention
        # reads every slot fed before it, sliding windows keep their own slots. A recurrent
        # model verifies a tree as its paths (``RecurrentSteps.paths_step``).
        self.trees = not self.recurrent and not sliding
        self._paths = self.recurrent and not sliding and guidance_scale is None
        self._uncaptured = False        # a step fed eagerly on a static cache (its paths)
        self._cache_arg = facts.cache_arg
        self._sdpa_configs, self._text_sdpa, self._bucketed = _attention_plan(
            self.net, facts, static_len, compile)
        # 4-D masks are additive, in the model's dtype (``_attention_plan``).
        self._additive = next(model.parameters()).dtype
        self.cache = None
        self.seq: SequenceMask | StaticSequenceMask | None = None
        self._prompt_embeds: torch.Tensor | None = None   # ``prefill(inputs_embeds=)``
        self.features: torch.Tensor | None = None     # ``keep_features``: the last forward's
        self._feature_layers: tuple[int, ...] = ()
        self._uncond_features = False
        self._extra: dict = {}                         # keyword arguments of every forward
        self.batch_size = 0
        self._since_commit = 0
        self._uncond_last = None
        self._first = True
        self._first_blocks: Blocks | None = None   # the first step's (``_blocks_pass``)
        self._base = None

    @property
    def tree_verify(self) -> bool:
        """``Session.tree_verify``: with ``trees``, or recurrent layers (the tree fed as its
        paths, ``RecurrentSteps.paths_step``)."""
        return self.trees or self._paths

    @property
    def device(self) -> torch.device:
        """The device of the model's parameters."""
        return next(self.model.parameters()).device

    @property
    def split_group(self):
        """``Session.split_group``: the device mesh's group of the model's split parameters."""
        return split_group(self.model)

    def keep_features(self, layers, uncond: bool = False) -> None:
        """After every forward (prompt included), keep ``features`` [B, n, F]: the outputs of
        ``layers`` (indices into the model's ``hidden_states``: 0 the embeddings, L the last
        layer's) concatenated, for the conditional rows; with ``uncond`` (guidance on) each
        row's unconditional row's after them (F doubles). Read by feature-level drafters."""
        if uncond and not self.guided:
            raise ValueError("uncond features: accepted only with classifier-free guidance on "
                             "(guidance_scale set): the unconditional rows hold them")
        self._feature_layers, self._uncond_features = tuple(layers), uncond
        self._extra = {"output_hidden_states": True} if layers else {}

    @property
    def guided(self) -> bool:
        """Classifier-free guidance is on (the batch is doubled: conditional rows, then
        unconditional)."""
        return self.guidance_scale is not None

    # -- hooks for adapters ---------------------------------------------------------------
    def embed(self, tokens: torch.Tensor, first_step: bool = False) -> dict:
        """Model inputs for ids [R, n] (R = rows incl. unconditional): default input_ids.

        On the first step after the prompt, column 0 is the prompt's last token: where the
        prompt came as embeddings (``prefill(inputs_embeds=)``), its embedding. A step whose
        inputs are not all tensors (an adapter's encoder outputs) runs uncaptured."""
        if first_step and self._prompt_embeds is not None:
            e = self.model.get_input_embeddings()(tokens)
            return {"inputs_embeds": torch.cat([self._prompt_embeds[:, -1:].to(e.dtype),
                                                e[:, 1:]], 1)}
        return {"input_ids": tokens}

    def position_ids(self, pos: torch.Tensor, prompt: bool = False) -> torch.Tensor:
        """The ``position_ids`` the model takes for 1-D positions ``pos`` [R, n] (each row's
        count of real tokens before the slot; rolled back with the sequence mask). Default:
        ``pos``. Models with multi-axis rotary positions (Qwen-VL's M-RoPE) map them here;
        a captured step calls this too, and a captured prompt pass with ``prompt=True``, so
        what it reads must be ``persistent`` (or the class declares ``CaptureTraits(prompt_graphs=False)``)."""
        return pos

    def persistent(self, name: str, value: torch.Tensor) -> torch.Tensor:
        """``value`` in a buffer that outlives the call with the static cache (a captured step
        reads it at a fixed address; later calls copy theirs in); ``value`` itself on a
        dynamic cache. Call after ``prefill`` has made the cache."""
        if self._static is None or self._uncaptured:
            return value
        # one shape per static cache (its key holds the rows): copy_ refuses any other
        return self._static.buffers.setdefault(name, torch.empty_like(value)).copy_(value)

    def logits(self, out) -> torch.Tensor:
        """Logits [R, n, V] from the model's output (adapters select or remap the vocabulary here)."""
        return out.logits

    def mask_logits(self, logits: torch.Tensor, gen_index: torch.Tensor) -> torch.Tensor:
        """Restrict the ids allowed at each predicted position.

        logits [B, n, V]; gen_index [B, n]: index of the predicted token among the generated
        tokens (0 = the first token after the prompt)."""
        return logits

    # -- prompt -----------------------------------------------------------------------------
    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                uncond_ids: torch.Tensor | None = None,
                uncond_mask: torch.Tensor | None = None,
                inputs_embeds: torch.Tensor | None = None,
                prompt_blocks: Blocks | torch.Tensor | None = None, **model_kwargs) -> None:
        """Feed the prompt's context: every prompt token but the last column.

        input_ids, attention_mask: [B, P] left-padded. The last column (a real token in every
        row) is fed by the first ``step``. With guidance, ``uncond_ids``/``uncond_mask``
        [B, P'] are the unconditional prompts (left-padded to the same width P' = P).
        inputs_embeds: [B, P, d] the prompt's input embeddings where they are not its ids'
        (a VLM prompt that ends on an image: its merged features); the prompt pass feeds
        them, the first step the last column's.
        prompt_blocks: ``cache.Blocks`` (or its ``ids`` [B, P] long, -1 outside a block, on
        every layer): tokens of one block see each other both ways in the prompt pass (Gemma
        3's and 4's images, PaliGemma's prefix), as in the model's own. The pass then feeds
        every column and the last slot is taken back: the first step feeds the last column
        again, seeing every slot as it did in the pass, and the slots before it keep what
        they saw of it.
        """
        if inputs_embeds is not None and (self.guided or inputs_embeds.shape[:2] !=
                                          input_ids.shape):
            raise ValueError(f"inputs_embeds: accepted [B, P, d] of the prompt's shape "
                             f"{tuple(input_ids.shape)}, without guidance")
        self._prompt_embeds = inputs_embeds
        self.batch_size = input_ids.shape[0]
        if self.guided:
            input_ids, attention_mask = with_uncond(input_ids, attention_mask, uncond_ids,
                                                    uncond_mask)
            self._uncond_last = uncond_ids[:, -1]    # each branch's own last token, fed first
        if self.static_len is not None:
            if input_ids.shape[1] > self.static_len:
                raise ValueError(f"static_len={self.static_len} is shorter than the prompt "
                                 f"({input_ids.shape[1]} tokens)")
            self._static = _kept_static(self, input_ids.shape[0], input_ids.device)
            self.cache = self._static.cache
            self.seq = self._static.seq.reset()
        else:
            self.cache = dynamic_cache(self.net.config)
            self.seq = SequenceMask.from_prompt(attention_mask)
        prompt_blocks = _prompt_blocks(prompt_blocks, input_ids, self.window, self.guided,
                                       self.recurrent)
        self._first_blocks = None
        if prompt_blocks is not None:
            self._blocks_pass(input_ids, attention_mask, prompt_blocks, model_kwargs)
        elif input_ids.shape[1] > 1:
            self._forward(input_ids[:, :-1], attention_mask[:, :-1], prompt=True, **model_kwargs)
        # Recurrent layers (linear attention) roll back by snapshot and replay (``commit``).
        self._recurrent = recurrent_layers(self.cache)
        self._rollback = RecurrentSteps(self) if self._recurrent else None
        self._since_commit = 0
        # The position of the last prompt token (a captured chain reads it).
        self._base = self.persistent("base", self.seq.next_pos[: self.batch_size].clone())
        self._first = True

    def _blocks_pass(self, input_ids, attention_mask, blocks, model_kwargs) -> None:
        """The prompt pass over every column with ``blocks`` open (``prefill``), then its last
        slot taken back (and its features: the first step computes them again)."""
        self._forward(input_ids, attention_mask, prompt=True, blocks=blocks, **model_kwargs)
        crop(self.cache, 1)
        self.seq.rollback(1)
        if self._feature_layers:
            self.features = self.features[:, :-1]
        self._first_blocks = refeed_blocks(blocks, self.window)

    # -- the protocol -------------------------------------------------------------------------
    def _rows(self, t: torch.Tensor) -> torch.Tensor:
        return torch.cat([t, t], 0) if self.guided else t

    def _input_rows(self, tokens: torch.Tensor) -> torch.Tensor:
        if not self.guided:
            return tokens
        uncond = tokens
        if self._uncond_last is not None:   # first step after the prompt
            uncond = tokens.clone()
            uncond[:, 0] = self._uncond_last
            self._uncond_last = None
        return torch.cat([tokens, uncond], 0)

    def prompt_inputs(self, tokens: torch.Tensor) -> dict:
        """Model inputs for the prompt's ids (default: input_ids; the prompt's embeddings
        where ``prefill`` was given them)."""
        if self._prompt_embeds is not None:
            return {"inputs_embeds": self._prompt_embeds[:, :tokens.shape[1]]}
        return {"input_ids": tokens}

    def _forward(self, tokens: torch.Tensor, valid: torch.Tensor, prompt: bool = False,
                 tree: TreeMask | None = None, process: bool = False,
                 blocks: Blocks | None = None, **model_kwargs
                 ) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Feed ``tokens`` [R, n] (``valid`` [R, n] marks padding; ``tree``: the slots'
        ancestors and depths; ``blocks``: the prompt's bidirectional blocks); returns (None for
        the prompt, else the ``logits`` hook's result, or with ``process`` the
        ``distributions`` of the step's rows; position_ids [R, n]). A captured step computes
        its distributions inside its graph (``captures_processing``)."""
        processed = False
        if not prompt:
            blocks = step_blocks(self._first_blocks if self._first else None, tokens.shape[1])
        inputs = self.prompt_inputs(tokens) if prompt else self.embed(tokens, self._first)
        valid = valid.to(torch.long)
        if self.static_len is None:
            attn, pos = self.seq.plan(valid, tree, self.window, blocks)
            if isinstance(attn, dict) or attn.dim() == 4:   # added to the scores (any attention)
                attn = additive_masks(attn, next(self.net.parameters()).dtype)
            out = self.net(**inputs, **{self._cache_arg: self.cache}, attention_mask=attn,
                           position_ids=self.position_ids(pos, prompt), use_cache=True,
                           **self._extra, **model_kwargs)
            self.seq.append(valid)
        else:
            n = valid.shape[1]
            self.seq.check_room(n)
            # Attention over the slots in use (a bucket), where the model's attention allows.
            width = (bucket(self.seq.length + n, self.static_len) if self._bucketed
                     else self.static_len)
            tensors = all(isinstance(v, torch.Tensor) for v in inputs.values())
            steps = self._captured
            if steps and not self._uncaptured and blocks is None and tensors and (
                    not prompt or steps.captures_prompt(inputs, valid, width, model_kwargs)):
                processed = process and not prompt and self.captures_processing
                out, pos = steps.replay(inputs, valid, width, tree, prompt, processed)
            else:
                regional = steps.prompt_regions(n) if steps and prompt else contextlib.nullcontext()
                with regional:
                    out, pos = self._static_step(self.net, inputs, valid, width, prompt, tree,
                                                 blocks, **model_kwargs)
            self.seq.appended(n)
        if self._feature_layers:
            hs = out.hidden_states
            conditional = hs[0].shape[0] // (2 if self.guided else 1)
            f = torch.cat([hs[i] for i in self._feature_layers], -1)
            self.features = (torch.cat([f[:conditional], f[conditional:]], -1)
                             if self._uncond_features else f[:conditional])
        if prompt:
            return None, pos
        if processed:
            return out, pos
        logits = self.logits(out)
        return (self._distributions(logits, pos) if process else logits), pos

    def _distributions(self, logits: torch.Tensor, pos: torch.Tensor):
        """``distributions`` of a step's rows at their positions ``pos`` [R, n]."""
        return self.distributions(logits, pos[: self.batch_size] - self._base[:, None])

    @property
    def captures_processing(self) -> bool:
        """Captured steps compute their distributions inside their graphs: hooks that run on
        the device alone (``chain_hooks``, as chains need), no kept features, no recurrent
        layers. The graph's distributions are copied out: what a step returns stays valid."""
        return self.capture.chain_hooks and not self._feature_layers and not self._recurrent

    def processing_key(self) -> tuple:
        """What the ``distributions`` hook depends on besides tensors: part of the key of
        the graphs that capture it (graphs are reused by the next call on the cache)."""
        return (self.params, self.guidance_scale)

    def _static_step(self, fn, inputs: dict, valid: torch.Tensor, width: int,
                     prompt: bool = False, tree: TreeMask | None = None,
                     blocks: Blocks | None = None, **model_kwargs):
        """One step on the static cache, all on the device (what a captured step replays):
        the mask (``width`` slots wide) and positions from the sequence buffers, the forward,
        the buffers moved."""
        narrow = width < self.static_len or self.compile == "regional"   # prefix attention
        bool_mask = self._text_sdpa and not narrow
        update = type(self.seq).advance if prompt else self._tail(type(self.seq).advance)
        mask, pos = update(self.seq, valid, width, None if bool_mask else self._additive, tree,
                           self.window, blocks)
        if self.compile == "regional":
            regions.dynamic_length(self.cache, mask)
        kernel = self.engine.decode_kernel and bool(self.compile)          # captured: on CUDA
        with prefix(self._sdpa_configs if narrow else [], kernel):
            out = fn(**inputs, **{self._cache_arg: self.cache}, attention_mask=mask,
                     position_ids=self.position_ids(pos, prompt), use_cache=True,
                     **self._extra, **model_kwargs)
        advance(self.cache, valid.shape[1])     # the layers' shared write pointer, once
        return out, pos

    def _tail(self, fn):
        """``fn`` as a step calls it: ``compiled`` under "regional" (``compiled_tail``)."""
        return compiled(fn) if self.compile == "regional" and self.engine.compiled_tail else fn

    def step(self, tokens: torch.Tensor, valid: torch.Tensor | None = None, tree=None):
        """tokens [B, n, *event] -> ``distributions`` of the outputs (default: processed,
        guided probabilities [B, n, V]). ``tree``: the n slots are a draft tree's nodes."""
        if valid is None:
            valid = torch.ones(tokens.shape[:2], dtype=torch.long, device=tokens.device)
        if tree is not None and self._paths and not isinstance(tree, TreeMask):
            return self._rollback.paths_step(tokens, valid, tree)
        if tree is not None:
            tree = _tree_mask(self, tree, tokens.shape[1])
        rows, rows_valid = self._input_rows(tokens), self._rows(valid)
        if self._recurrent:
            self._rollback.record(rows, rows_valid)
        dists, _ = self._forward(rows, rows_valid, tree=tree, process=True)
        self._first = False
        self._since_commit += tokens.shape[1]
        return dists

    # -- captured chains ----------------------------------------------------------------------
    @property
    def chains(self) -> bool:
        """Chains run as one captured graph: captured steps whose hooks need no host value
        (``chain_hooks``), no recurrent layers, no kept features; one-hot draws, or sampled
        ones with ``sampled_chains``."""
        return (bool(self.compile) and self.capture.chain_hooks and not self._recurrent
                and not self._feature_layers and (self.greedy or self.engine.sampled_chains))

    def chain(self, tokens: torch.Tensor, valid: torch.Tensor, k: int, follow: torch.Tensor,
              generator: torch.Generator | None = None):
        """``Session.chain``; with ``chains`` (after the first step) the k steps, their
        processing and their draws one CUDA graph per first width (``CapturedSteps.chain``)."""
        if not self.chains or self._first or k < 2 or (
                generator is not None and generator.device.type != "cuda"):
            return super().chain(tokens, valid, k, follow, generator)
        return self._captured.chain(tokens, valid, k, follow, generator)

    def _greedy_draw(self, logits: torch.Tensor, pos: torch.Tensor):
        """A greedy chain step's draw (``distributions.draw``): its last slot's distributions
        and their argmax, compiled with them (``compiled_tail``) rather than captured as
        PyTorch's single-block reduction over the vocabulary."""
        return distributions.draw(self._distributions(logits, pos)[:, -1], greedy=True)

    def distributions(self, logits: torch.Tensor, gen_index: torch.Tensor):
        """What a step returns for the rows' outputs [R, n, ...] (``logits`` hook's result; R
        = 2B with guidance): here u + s (c - u), masked and processed into probabilities.
        Adapters whose tokens are not ids return other distributions (densities, frames)."""
        b = self.batch_size
        if self.guided:
            logits = guide(logits[:b], logits[b:], self.guidance_scale)
        return self.params.probs(self.mask_logits(logits, gen_index))

    def commit(self, keep: int, valid: torch.Tensor | None,
               path: torch.Tensor | None = None) -> None:
        """Keep ``keep`` of the slots appended since the last commit; ``valid`` [B, keep] (None:
        as fed); ``path`` [B, keep] the slots kept per row after a tree step."""
        n = self._since_commit
        if not 0 <= keep <= n:
            raise ValueError(f"keep={keep}: accepted 0..{n} (slots appended since last commit)")
        if self._recurrent:
            return self._rollback.commit(n, keep, None if valid is None else self._rows(valid),
                                         path)
        if path is not None and keep:
            gather_tail(self.cache, n, self._rows(path[:, :keep]),
                        None if self.static_len is None else self.seq.length)
        crop(self.cache, n - keep)
        self.seq.rollback(n - keep)
        if keep and valid is not None:         # None: the slots' validity stays as fed
            self.seq.invalidate_tail(keep, self._rows(valid))
        self._since_commit = 0
        expected = self.seq.length
        if self.static_len is None and self.cache.get_seq_length() != expected:
            raise RuntimeError(f"cache length {self.cache.get_seq_length()} != committed "
                               f"length {expected}")

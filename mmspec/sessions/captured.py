"""The captured steps of a ``CausalLMSession`` (``compile=`` set): each step width, prompt
shape and chain captured once as a CUDA graph on the session's static cache and replayed
(``mmspec.engine.capture``), under the engine's compile mode: ``"graphs"`` (the network as
it is), ``"regional"`` (its decoder layers compiled, ``mmspec.engine.regions``) or
``"inductor"`` (the network compiled whole).

``CapturedSteps`` decides what is captured and keys the graphs; the session keeps what a
step is (``_static_step``: the mask, positions and forward on the static cache), which the
graphs replay.
"""

from __future__ import annotations

import contextlib
import weakref

import torch

from .. import distributions
from ..cache import StateSnapshot, TreeMask, crop
from ..engine import grouping, regions
from ..engine.attention import bucket
from ..engine.capture import capture_graph, compile_fixed, release


class CapturedSteps:
    """The graphs of one session (``session._static``: its static cache with the graphs kept
    on it, reused by the next session on the cache)."""

    def __init__(self, session):
        self._session = weakref.ref(session)   # no cycle: a session given back at once

    @property
    def s(self):
        """The session (held weakly: its static cache goes back to the pool as soon as the
        call drops it, ``engine.capture.give_back``)."""
        session = self._session()
        if session is None:
            raise ReferenceError("CapturedSteps: its session was collected (keep the session, "
                                 "which holds its helpers)")
        return session

    def graph_key(self, tensors: dict, width: int, prompt: bool = False,
                   processed: bool = False) -> tuple:
        s = self.s
        return (("prompt" if prompt else "step", width, tuple(s._extra),
                 s.processing_key() if processed else None)
                + tuple((k, tuple(v.shape), v.dtype) for k, v in sorted(tensors.items())))

    def captures_prompt(self, inputs: dict, valid: torch.Tensor, width: int,
                         model_kwargs: dict) -> bool:
        """Is this prompt pass replayed from a graph (``capture_prompts_up_to``): its inputs
        the ids or embeddings alone, no recurrent layers, a cache whose slots are allocated,
        and its shape captured already or room for one more prompt graph."""
        s = self.s
        rows, n = valid.shape
        if (not s.capture.prompt_graphs or model_kwargs or s.recurrent or n < 2
                or rows * n > s.engine.capture_prompts_up_to or not self.cache_ready()):
            return False
        graphs = s._static.graphs
        return (self.graph_key({**inputs, "valid": valid}, width, True) in graphs
                or sum(k[0] == "prompt" for k in graphs) < s.engine.captured_prompts)

    def replay(self, inputs: dict, valid: torch.Tensor, width: int, tree: TreeMask | None,
                prompt: bool = False, processed: bool = False):
        """Run one decoding step (or a prompt pass) through a CUDA graph captured for this
        input shape and attention width (a tree's tables are inputs: one graph per node
        count); ``processed``: the step's distributions computed in the graph, copied out."""
        s = self.s
        tensors = {**inputs, "valid": valid}
        if tree is not None:
            tensors.update(tree_ancestors=tree.ancestors, tree_offsets=tree.offsets)
        key = self.graph_key(tensors, width, prompt, processed)
        st = s._static
        if key not in st.graphs:
            static = {k: v.clone() for k, v in tensors.items()}
            static_inputs = {k: static[k] for k in inputs}
            static_tree = (None if tree is None else
                           TreeMask(static["tree_ancestors"], static["tree_offsets"]))
            n = valid.shape[1]
            fn, fusing = (s.net, self.prompt_regions(n)) if prompt else self.fused()
            with fusing:
                st.graphs[key] = self.capture_step(fn, static, static_inputs, static_tree, width,
                                               n, prompt, processed)
        graph, static, out = st.graphs[key]
        for k, v in tensors.items():
            static[k].copy_(v)
        graph.replay()
        return (out[0].clone(), out[1]) if processed else out

    def prompt_regions(self, n: int):
        """The context of a prompt pass of ``n`` tokens: under ``"regional"``, on a static
        cache used before (its layers hold their slots, whose length is then dynamic too),
        the layers compiled with the prompt's length dynamic: one trace for every prompt and
        cache length. A new cache's first pass (it allocates the slots) and a pass of one
        token run eager."""
        s = self.s
        if s.compile != "regional" or n < 2 or not self.cache_ready():
            return contextlib.nullcontext()
        self.lay_out()
        return regions.compiled(s.net, dict(s.engine.prompt_inductor_options), prompt=True,
                                group=s.engine.group_projections)

    def cache_ready(self) -> bool:
        """The static cache's layers hold their slots (allocated by its first pass)."""
        s = self.s
        layers = getattr(s.cache, "layers", ())
        return bool(layers) and all(getattr(x, "is_initialized", False) for x in layers)

    def lay_out(self) -> None:
        """Each decoder layer's projections back to back (``regions.lay_out``), once per
        model. Steps kept captured on the weights' former places are let go, every model's
        (a draft may share the target's layers)."""
        s = self.s
        if s.engine.group_projections and regions.lay_out(s.net):
            release()

    def row_kernels(self) -> grouping.RowKernels | None:
        s = self.s
        return (grouping.RowKernels(norms=s.engine.row_norms, rope=s.engine.row_rope)
                if s.engine.row_kernels else None)

    def fused(self):
        """(the module a captured step calls, the context it is captured in): the network
        under ``"graphs"``, the network fused whole under ``"inductor"`` (made once per
        static cache), the network with its layers compiled while capturing under
        ``"regional"``."""
        s = self.s
        if s.compile == "regional":
            self.lay_out()
            return s.net, regions.compiled(s.net, dict(s.engine.inductor_options),
                                              group=s.engine.group_projections,
                                              rows=self.row_kernels())
        if s.compile != "inductor":
            return s.net, contextlib.nullcontext()
        st = s._static
        if st.fused is None:
            st.fused = compile_fixed(s.net, options=dict(s.engine.inductor_options))
        return st.fused, contextlib.nullcontext()

    def capture_step(self, fn, static: dict, static_inputs: dict, static_tree, width: int, n: int,
                 prompt: bool = False, processed: bool = False):
        """One step (or prompt pass) captured: (graph, static, out); ``processed``: out is
        (the step's distributions, positions)."""
        s = self.s
        states = StateSnapshot.take(s._recurrent) if s._recurrent else None

        def undo():
            crop(s.cache, n)
            s.seq.undo(static["valid"])
            if states is not None:             # recurrent states: from the snapshot
                states.restore()

        def run():
            out, pos = s._static_step(fn, static_inputs, static["valid"], width, prompt,
                                      static_tree)
            if not processed:
                return out, pos
            return s._tail(type(s)._distributions)(s, s.logits(out), pos), pos

        graph, out = capture_graph(run, undo, s._static)
        return graph, static, out

    def chain(self, tokens: torch.Tensor, valid: torch.Tensor, k: int, follow: torch.Tensor,
              generator: torch.Generator | None = None):
        """``CausalLMSession.chain`` as one CUDA graph per first width, replayed: the k steps,
        their processing and their draws in one launch instead of k steps' worth of small
        kernels and host work. A sampled chain drawing from ``generator`` is captured with
        the static cache's own generator, registered with the graph: before a replay it
        takes ``generator``'s seed and offset, after it gives ``generator`` the advanced
        offset, so the draws are the ones the eager steps would make (without ``generator``,
        the device's default generator, which graphs follow)."""
        s = self.s
        sizes = [tokens.shape[1]] + [1] * (k - 1)
        s.seq.check_room(sum(sizes))
        ends = [sum(sizes[: i + 1]) for i in range(k)]
        widths = tuple(bucket(s.seq.length + e, s.static_len) if s._bucketed
                       else s.static_len for e in ends)
        tensors = dict(tokens=tokens, valid=valid.to(torch.long), follow=follow.to(torch.long))
        st = s._static
        own = (None if s.greedy or generator is None
               else self.chain_generator(generator.device))
        key = ("chain", widths, tuple(s._extra), s.processing_key(),
               own is not None) + tuple(
            (name, tuple(v.shape), v.dtype) for name, v in tensors.items())
        if key not in st.graphs:
            static = {name: v.clone() for name, v in tensors.items()}
            fn, fusing = self.fused()
            with fusing:
                st.graphs[key] = self.capture_chain(fn, static, widths, sum(sizes), own)
        graph, static, (draws, dists) = st.graphs[key]
        for name, v in tensors.items():
            static[name].copy_(v)
        if own is not None:
            own.set_state(generator.get_state())
        graph.replay()
        if own is not None:
            generator.set_state(own.get_state())
        s.seq.appended(sum(sizes))
        s._since_commit += sum(sizes)
        return draws.clone(), dists.clone()

    def chain_generator(self, device: torch.device) -> torch.Generator:
        """The static cache's generator for sampled chains (made once, on the cache's
        device: the graphs captured with it hold its state)."""
        s = self.s
        st = s._static
        if st.generator is None:
            st.generator = torch.Generator(device=device)
        return st.generator

    def chain_steps(self, fn, static: dict, widths: tuple[int, ...],
                    generator: torch.Generator | None = None):
        """A chain's steps on the device alone (what its graph replays)."""
        s = self.s
        tokens, valid, follow = static["tokens"], static["valid"], static["follow"]
        draws, dists = [], []
        for width in widths:
            out, pos = s._static_step(fn, s.embed(s._rows(tokens)), s._rows(valid), width)
            if s.greedy:
                x, q = s._tail(type(s)._greedy_draw)(s, s.logits(out), pos)
            else:
                q = s._tail(type(s)._distributions)(s, s.logits(out), pos)
                x, q = distributions.draw(q[:, -1], generator)
            draws.append(x)
            dists.append(q)
            tokens, valid = x[:, None], follow[:, None]
        return torch.stack(draws, 1), distributions.stack(dists)

    def capture_chain(self, fn, static: dict, widths: tuple[int, ...], n: int,
                      generator: torch.Generator | None = None):
        """A chain captured: (graph, static, out); ``generator``: what its draws use."""
        s = self.s

        def undo():
            crop(s.cache, n)
            for _ in widths[1:]:
                s.seq.undo(s._rows(static["follow"][:, None]))
            s.seq.undo(s._rows(static["valid"]))

        graph, out = capture_graph(lambda: self.chain_steps(fn, static, widths, generator),
                                   undo, s._static, generator)
        return graph, static, out

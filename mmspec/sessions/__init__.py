"""Models with their caches: what the loop verifies on and what a model drafter drafts with.

    base.py        the ``Session`` protocol and ``PaddedSession``
    causal_lm.py   ``CausalLMSession``: any transformers causal LM with its cache (dynamic or
                   static), guidance, trees and recurrent layers
    captured.py    ``CapturedSteps``: a session's captured steps, prompt passes and chains
                   (``mmspec.engine.capture``)
    prompt.py      a prompt pass's guidance rows and bidirectional blocks
    recurrent.py   ``RecurrentSteps``: rollback of recurrent (linear-attention) states
    token_span.py  ``TokenSpanSession``: generated ids a subset of the vocabulary
"""

from .base import PaddedSession, Session
from .causal_lm import (CaptureTraits, CausalLMSession, NetFacts, max_positions, net_facts,
                        output_vocab_size, release_graphs)
from .token_span import TokenSpanSession

__all__ = ["CaptureTraits", "CausalLMSession", "NetFacts", "PaddedSession", "Session",
           "TokenSpanSession", "max_positions", "net_facts", "output_vocab_size",
           "release_graphs"]

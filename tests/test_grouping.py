"""Grouped projections (mmspec.grouping): layout back to back, and the graph pass."""

import pytest
import torch
import transformers

from mmspec import grouping, regions


def _model(kind="llama", layers=2):
    torch.manual_seed(0)
    common = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2)
    if kind == "qwen2":     # q/k/v with biases
        return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common)).eval()
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**common)).eval()


def _counting(counts):
    def backend(gm, example_inputs):
        counts.append(sum(n.op == "call_function" and n.target in grouping.LINEAR
                          for n in gm.graph.nodes))
        return gm.forward
    return backend


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_layout_keeps_parameters_values_and_memory(kind):
    """Each module's sibling projections of one input width end back to back in one buffer:
    the same Parameter objects and values, as many bytes; a second call lays out nothing."""
    m = _model(kind)
    before = {n: (p, p.detach().clone()) for n, p in m.named_parameters()}
    nbytes = sum(p.numel() * p.element_size() for p in m.parameters())
    assert not grouping.back_to_back(m)
    assert grouping.contiguous_projections(m) == 2 * 2          # q/k/v/o and gate/up, per layer
    assert grouping.back_to_back(m) and grouping.contiguous_projections(m) == 0
    after = dict(m.named_parameters())
    assert all(after[n] is p and torch.equal(p, v) for n, (p, v) in before.items())
    assert sum(p.numel() * p.element_size() for p in m.parameters()) == nbytes
    a = m.model.layers[0].self_attn
    assert (a.k_proj.weight.storage_offset() == a.q_proj.weight.numel()
            and a.k_proj.weight.untyped_storage().data_ptr()
            == a.q_proj.weight.untyped_storage().data_ptr())
    if kind == "qwen2":
        assert a.v_proj.bias.storage_offset() == a.q_proj.bias.numel() + a.k_proj.bias.numel()


def test_layout_leaves_shared_weights_where_they_are():
    m = _model()
    a = m.model.layers[0].self_attn
    a.k_proj.weight = a.q_proj.weight.__class__(a.q_proj.weight.data[:16])   # a view of q
    ptr = a.q_proj.weight.untyped_storage().data_ptr()
    grouping.contiguous_projections(m)
    assert a.q_proj.weight.untyped_storage().data_ptr() == ptr
    assert not grouping.back_to_back(m)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_pass_runs_one_product_per_input_on_rows_not_one_row(kind):
    """Under the grouped backend a layer's q/k/v and gate/up calls are one product each (7
    linear calls -> 4) with the same logits; at one row the graph keeps its 7 calls."""
    m = _model(kind)
    grouping.contiguous_projections(m)
    with torch.no_grad():
        for ids, calls in ((torch.tensor([[3, 4, 5, 6]]), 4), (torch.tensor([[3]]), 7)):
            counts = []
            ref = m(ids).logits
            torch._dynamo.reset()
            with regions.compiled(m, {}, backend=grouping.grouped(_counting(counts))):
                got = m(ids).logits
            assert counts[0] == calls        # the layers' one trace, then the head's
            assert torch.allclose(got, ref, atol=1e-5, rtol=1e-5)
    torch._dynamo.reset()


def test_pass_leaves_weights_that_are_not_back_to_back():
    m = _model()
    counts = []
    with torch.no_grad():
        with regions.compiled(m, {}, backend=grouping.grouped(_counting(counts))):
            m(torch.tensor([[3, 4, 5, 6]]))
    assert counts[0] == 7
    torch._dynamo.reset()


def test_session_lays_out_the_decoder_layers_and_lets_kept_steps_go():
    """A session's layout moves only the decoder layers' projections (the output head, which
    a head drafter may share, stays) and drops every kept static cache: their steps were
    captured on the weights' former places."""
    import mmspec
    from mmspec.session import _STATIC, CausalLMSession

    m = _model()
    m.extra = torch.nn.Linear(32, 8, bias=False)      # a sibling of the output head
    ids = torch.tensor([[3, 4, 5]])
    mmspec.generate(m, None, ids, temperature=0, max_new_tokens=2, static_cache=True)
    assert m in _STATIC                               # a static cache kept for the next call
    head = m.lm_head.weight.untyped_storage().data_ptr()
    s = CausalLMSession(m, mmspec.SamplingParams(temperature=0))
    s._lay_out()
    assert grouping.back_to_back(m.model.layers) and m not in _STATIC
    assert m.lm_head.weight.untyped_storage().data_ptr() == head
    assert regions._LAID_OUT[m] and not regions.lay_out(m)        # once per model
    mmspec.release_graphs(m)              # after Parameters are replaced: laid out again
    a = m.model.layers[1].mlp
    a.up_proj.weight.data = a.up_proj.weight.data.clone()
    assert m not in regions._LAID_OUT and regions.lay_out(m)
    assert grouping.back_to_back(m.model.layers)


def test_layout_leaves_tensor_subclasses_alone():
    """A weight of a tensor subclass (quantized, distributed) keeps its own layout: it stays
    out of its group, whose other members are laid out."""
    class Packed(torch.Tensor):
        pass

    m = _model(layers=1)
    a = m.model.layers[0].self_attn
    a.q_proj.weight = torch.nn.Parameter(a.q_proj.weight.detach().as_subclass(Packed))
    q = a.q_proj.weight.untyped_storage().data_ptr()
    grouping.contiguous_projections(m)
    assert a.q_proj.weight.untyped_storage().data_ptr() == q
    assert grouping._back_to_back([a.k_proj.weight, a.v_proj.weight, a.o_proj.weight])

"""GPU benchmark: mmspec against Hugging Face on the same target and draft, in one run.

    python -m eval.bench_gpu --out out/bench_gpu                 # 7B Llama shape, bf16, H200
    python -m eval.bench_gpu --shape tiny --device cpu --no-hf-compile   # a smoke run on CPU
    python -m eval.bench_gpu --shape janus-pro-7b      # (or musicgen-large): other modalities
    python -m eval.bench_gpu --peer-gptfast DIR        # gpt-fast side by side (its checkout)
    python -m eval.bench_gpu --peer-rows FILE          # gpt-fast's rows from an earlier call
    python -m eval.bench_gpu --prompts 8               # each row over 8 prompts

Target: a Llama with random bf16 weights (7B shape: 32 layers, hidden 4096, vocab 32000);
the cost of a step does not depend on the weights' values. Acceptance is controlled on
purpose: in the target, layers >= 2 write into the residual stream scaled by ``eps`` (their
o_proj and down_proj weights), and the draft is the target's first two layers with its own
embeddings, final norm and head (shared tensors). eps = 0 makes the draft exact (an upper
bound at draft cost 2/32); larger eps lowers acceptance, which is measured and reported. The
target itself as its own draft (cost ratio 1) is run too.

Per batch size: Hugging Face eager greedy, Hugging Face static cache + compile, Hugging Face
assisted generation (batch 1 only), mmspec plain decoding and mmspec speculative decoding
for each K, in each mode of ``--modes`` (``COMPILE``: ``captured`` is ``compile=True``, each
decoder layer fused and the steps captured; ``graphs`` captures without compiling). Greedy decoding throughout, so every mmspec
output is checked token for token against mmspec plain decoding. Each row reports ms per
generated token, ms per target step against the HBM floor (weight bytes / measured copy
bandwidth; for plain decoding also the decoding step alone, the call less its prompt pass),
measured acceptance and tokens per step, the speedup against mmspec plain decoding in the same
mode, the analytic bound from the measured tokens per step and the measured step costs, and
efficiency = measured / bound; ``bound_call`` adds each call's measured prompt passes (target,
and draft) to both sides, since the timed calls include them; ``efficiency_decode`` instead
takes them out of both measured calls (the decoding loop alone against the per-step bound).
Steps are captured once per shape and reused by later calls (``mmspec.release_graphs``), so
the best-of-two timing leaves capture out. JSON lines go to stdout and bench.jsonl;
report.md summarises.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import dataclass, replace

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import mmspec
from mmspec.engine import INDUCTOR_OPTIONS, PLAIN_STEPS, Engine
from mmspec.sessions import CausalLMSession
from recipes.cli import COUNT, Names, Number, Numbers, Parser, describe, run

# --modes -> generate's compile=
COMPILE = {"eager": False, "captured": True, "graphs": "graphs", "inductor": "inductor"}

SHAPES = {
    "7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
               num_attention_heads=32, num_key_value_heads=32, vocab_size=32000),
    # Janus-Pro-7B's language model generating image tokens: the 7B decoder (30 layers) with
    # its 16,384-id image head as the output layer.
    "janus-pro-7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=30,
                         num_attention_heads=32, num_key_value_heads=32, vocab_size=16384),
    # MusicGen-large's decoder as a Llama-shaped cost proxy: 48 layers of hidden 2048, FFN
    # 8192, four 2048-id codebook heads counted as one 8192-wide output (its cross-attention,
    # about a quarter more attention weights, is not modelled).
    "musicgen-large": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=48,
                           num_attention_heads=32, num_key_value_heads=32, vocab_size=8192),
    # Llasa-1B (single-codebook speech): Llama 1B with 128,264 text and 65,536 codec ids.
    "llasa-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                     num_attention_heads=32, num_key_value_heads=8, vocab_size=193800),
    # Qwen3.5-9B's text decoder: three in four layers Gated DeltaNet linear attention
    # (transformers' defaults for their sizes); its draft the first four layers, up to the
    # first full-attention one.
    "qwen3.5-9b": dict(model="qwen3_5_text", draft_layers=4, hidden_size=4096,
                       intermediate_size=12288, num_hidden_layers=32, num_attention_heads=16,
                       num_key_value_heads=4, head_dim=256, vocab_size=248320),
    "1b": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
               num_attention_heads=32, num_key_value_heads=4, vocab_size=32000),
    "tiny-qwen3.5": dict(model="qwen3_5_text", hidden_size=64, intermediate_size=128,
                         num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=16, linear_num_key_heads=2, linear_num_value_heads=2,
                         linear_key_head_dim=8, linear_value_head_dim=8, vocab_size=512),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                 num_attention_heads=4, num_key_value_heads=4, vocab_size=512),
}


def open_log(out_dir: str):
    """(rows, emit): ``emit(row)`` keeps the row, prints it as a JSON line and appends the
    line to ``out_dir/bench.jsonl`` (so a run cut short keeps what it measured)."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "bench.jsonl")
    rows, start = [], time.perf_counter()

    def emit(row):
        row = {**row, "elapsed_s": round(time.perf_counter() - start, 1)}
        rows.append(row)
        line = json.dumps(row)
        print(line, flush=True)
        with open(path, "a") as f:
            f.write(line + "\n")

    return rows, emit


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def copy_bandwidth(dev) -> float:
    """Bytes per second of a large device-to-device copy (read + write counted)."""
    if dev.type != "cuda":
        return float("nan")
    x = torch.empty(2 * 1024**3, dtype=torch.uint8, device=dev)
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    sync(dev)
    t0 = time.perf_counter()
    for _ in range(10):
        y.copy_(x)
    sync(dev)
    dt = (time.perf_counter() - t0) / 10
    del x, y
    return 2 * 2 * 1024**3 / dt


def build(shape: str, dev, dtype):
    """(target, draft, its later layers' writes) of a ``SHAPES`` entry: random weights (seed
    0), the draft the target's first layers (``draft_layers``, 2 unless given)."""
    spec = dict(SHAPES[shape])
    n, kind = spec.pop("draft_layers", 2), spec.pop("model", "llama")
    config_class, model_class = _classes(kind)
    cfg = config_class(**spec, max_position_embeddings=4096, pad_token_id=0,
                       bos_token_id=1, eos_token_id=None, tie_word_embeddings=False)
    torch.manual_seed(0)
    with torch.device(dev):
        target = model_class(cfg).to(dtype).eval()
    draft = first_layers(target.model, target.lm_head, n, model_class)
    return target, draft, residual_writes(target.model.layers[n:])


def _classes(kind: str) -> tuple[type, type]:
    if kind == "llama":
        return LlamaConfig, LlamaForCausalLM
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    return Qwen3_5TextConfig, Qwen3_5ForCausalLM


def first_layers(body, head, n: int = 2, model_class=LlamaForCausalLM):
    """A ``model_class`` (a causal LM of ``body``'s kind: a LlamaModel's by default) made of
    ``body``'s embeddings, first ``n`` layers, final norm and rotary table, with ``head``:
    shared tensors, nothing copied."""
    cfg = {**body.config.to_dict(), "num_hidden_layers": n}
    if getattr(body.config, "layer_types", None) is not None:
        cfg["layer_types"] = body.config.layer_types[:n]
    with torch.device("meta"):
        draft = model_class(type(body.config)(**cfg))
    draft.model.embed_tokens, draft.model.norm = body.embed_tokens, body.norm
    draft.model.layers = torch.nn.ModuleList(list(body.layers[:n]))
    draft.model.rotary_emb = body.rotary_emb
    draft.lm_head = head
    return draft.eval()


def _writes(layer) -> tuple:
    """The two projections a decoder layer writes into the residual stream with: attention's
    output (softmax or linear attention) and the MLP's down projection."""
    attn = layer.self_attn.o_proj if hasattr(layer, "self_attn") else layer.linear_attn.out_proj
    return attn, layer.mlp.down_proj


def residual_writes(layers) -> list:
    """What ``set_eps`` scales: each layer with copies of its two residual writes' weights."""
    return [(layer, *(m.weight.detach().clone() for m in _writes(layer))) for layer in layers]


def set_eps(originals: list, eps: float) -> None:
    """Layers write into the residual stream scaled by ``eps`` (``residual_writes``' layers;
    0: they write nothing, so a draft of the layers before them is exact)."""
    with torch.no_grad():
        for layer, o, d in originals:
            attn, down = _writes(layer)
            attn.weight.copy_(o * eps)
            down.weight.copy_(d * eps)


def timed(fn, dev, repeats=2, warmup=0):
    """(the last output, the best seconds of ``repeats`` calls after ``warmup`` untimed ones:
    the first calls capture steps and, on a reused static cache, compile the prompt pass)."""
    for _ in range(warmup):
        fn()
    out, best = None, float("inf")
    for _ in range(repeats):
        sync(dev)
        t0 = time.perf_counter()
        out = fn()
        sync(dev)
        best = min(best, time.perf_counter() - t0)
    return out, best


@dataclass
class Calls:
    """One ``generate`` call per prompt: their outputs, counters summed over the calls."""

    outs: list

    @property
    def steps(self) -> int:
        return sum(o.stats.steps for o in self.outs)

    @property
    def tokens_per_step(self) -> float:
        return (sum(o.stats.emitted for o in self.outs)
                / max(1, sum(o.stats.row_steps for o in self.outs)))

    @property
    def acceptance_rate(self) -> float:
        return (sum(o.stats.accepted for o in self.outs)
                / max(1, sum(o.stats.drafted for o in self.outs)))

    def same(self, other: "Calls") -> bool:
        """Token for token the same sequences as ``other``'s, call by call."""
        return all(torch.equal(a.sequences, b.sequences) for a, b in zip(self.outs, other.outs))


def prompts(vocab: int, batch: int, length: int, count: int, dev) -> list[torch.Tensor]:
    """``count`` random prompts [batch, length]; the i-th drawn with seed batch + 1000 i (the
    first is every earlier run's prompt; ``eval.peer_gptfast`` draws the same at batch 1)."""
    return [torch.randint(2, vocab, (batch, length), device=dev,
                          generator=torch.Generator(device=dev).manual_seed(batch + 1000 * i))
            for i in range(count)]


def engine_of(compile, **switches) -> Engine:
    """The Engine of a ``compile=`` value (``COMPILE``) on static caches, with ``switches``
    (Engine's speed fields); an Engine given is returned as it is."""
    if isinstance(compile, Engine):
        return compile
    return replace(Engine.from_switches(compile=compile, static_cache=True), **switches)


def step_cost(model, batch, width, dev, compile, prompt_len=128, reps=20) -> float:
    """Seconds of one decoding step of ``width`` tokens at ``batch`` rows (static cache;
    ``compile``: a ``compile=`` value or an Engine)."""
    s = CausalLMSession(model, mmspec.SamplingParams(temperature=0),
                        static_len=prompt_len + 64 + 4 * reps, engine=engine_of(compile))
    ids = torch.randint(1, model.config.get_text_config().vocab_size, (batch, prompt_len), device=dev)
    with torch.inference_mode():
        s.prefill(ids, torch.ones_like(ids))
        tok = ids[:, :width]
        for _ in range(3):
            s.step(tok)
            s.commit(0, torch.ones(batch, 0, dtype=torch.bool, device=dev))
        sync(dev)
        t0 = time.perf_counter()
        for _ in range(reps):
            s.step(tok)
            s.commit(0, torch.ones(batch, 0, dtype=torch.bool, device=dev))
        sync(dev)
    return (time.perf_counter() - t0) / reps


def prefill_cost(model, batch, dev, prompt_len=128, reps=3, compile=False) -> float:
    """Seconds of one prompt pass (all prompt tokens but the last, static cache; the best of
    ``reps`` after a first pass, which allocates the cache the next ones reuse)."""
    ids = torch.randint(1, model.config.get_text_config().vocab_size, (batch, prompt_len), device=dev)
    best = float("inf")
    with torch.inference_mode():
        for i in range(reps + 1):
            s = CausalLMSession(model, mmspec.SamplingParams(temperature=0),
                                static_len=prompt_len + 64, engine=engine_of(compile))
            sync(dev)
            t0 = time.perf_counter()
            s.prefill(ids, torch.ones_like(ids))
            sync(dev)
            if i:
                best = min(best, time.perf_counter() - t0)
    return best


def build_parser() -> argparse.ArgumentParser:
    ap = Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=list(SHAPES), default="7b", help="model shape")
    ap.add_argument("--device", default="cuda", help="cuda, cuda:1 ... (cpu: eager only)")
    ap.add_argument("--batches", type=Numbers(COUNT), default="1,4,16", help="rows per call")
    ap.add_argument("--ks", type=Numbers(COUNT), default="2,4,8", help="drafts per step K")
    ap.add_argument("--eps", type=Numbers(Number(float, 0)), default="0.0,0.02,0.05",
                    help="scale of the draft's dropped layers' residual writes (0: the draft "
                         "is exact)")
    ap.add_argument("--modes", type=Names(tuple(COMPILE)), default="eager,captured,graphs",
                    help="captured: compile=True (regional); graphs: compile='graphs'; "
                         "inductor runs at batch 1, K=4 only (compilation per width)")
    ap.add_argument("--new-tokens", type=COUNT, default=128)
    ap.add_argument("--prompt", type=COUNT, default=128, help="prompt tokens")
    ap.add_argument("--prompts", type=COUNT, default=1,
                    help="random prompts per row, one generate call each: times and counts "
                         "are over all of them, so trajectories that part on near-ties weigh "
                         "less (transformers' rows use the first; default: 1)")
    ap.add_argument("--no-hf-compile", action="store_true",
                    help="skip transformers' own compiled generate")
    ap.add_argument("--no-hf", action="store_true",
                    help="skip every transformers row (eager, assisted, compiled generate)")
    ap.add_argument("--no-spec-pipeline", action="store_true",
                    help="speculative steps synchronised one by one (generate(pipeline=False)); "
                         "default: generate's (queued ahead with captured steps)")
    ap.add_argument("--peer-gptfast", default=None, metavar="DIR",
                    help="also run gpt-fast from this checkout (pytorch-labs/gpt-fast, fetched "
                         "by you; eval/peer_gptfast.py) on the same shape and draft, batch 1 "
                         "(default: none)")
    ap.add_argument("--peer-rows", default=None, metavar="FILE",
                    help="gpt-fast's rows from an earlier `python -m eval.peer_gptfast` on the "
                         "same machine (its JSON lines), for the side-by-side tables when both "
                         "do not fit in one call (default: none)")
    ap.add_argument("--inductor-option", type=inductor_option, action="append", default=[],
                    metavar="KEY=VALUE",
                    help="set one of the decode steps' inductor options "
                         "(Engine.inductor_options; VALUE as JSON: true, false, 2), "
                         "e.g. triton.enable_pdl=false; repeatable (default: none)")
    ap.add_argument("--no-prompt-graphs", action="store_true",
                    help="prompt passes run uncaptured under the captured modes "
                         "(Engine.capture_prompts_up_to=0); default: captured")
    ap.add_argument("--no-fused-settle", action="store_true",
                    help="greedy steps' acceptance and bookkeeping run op by op under the "
                         "captured modes (Engine.fused_settle=False); default: fused")
    ap.add_argument("--no-row-kernels", action="store_true",
                    help="one-row products under compile=True as inductor's reductions "
                         "(Engine.row_kernels=False); default: mmspec.kernels.gemv's kernel")
    ap.add_argument("--no-row-rope", action="store_true",
                    help="the rotary embedding and cache writes after a one-row q/k/v product "
                         "as kernels of their own (Engine.row_rope=False); default: "
                         "in mmspec.kernels.qkv_rope's")
    ap.add_argument("--no-row-norms", action="store_true",
                    help="the RMSNorms before one-row products as kernels of their own "
                         "(Engine.row_norms=False); default: inside mmspec.kernels.gemv's")
    ap.add_argument("--plain-steps", type=COUNT, default=PLAIN_STEPS,
                    help="plain greedy decoding's target steps per launch under the captured "
                         "modes, one graph (Engine.plain_steps; 1: a step per launch)")
    ap.add_argument("--out", default="out/bench_gpu", help="output folder")
    return describe(ap)


def inductor_option(text: str) -> tuple[str, object]:
    """``KEY=VALUE`` -> (key, value); VALUE read as JSON."""
    key, sep, value = text.partition("=")
    try:
        if not (sep and key):
            raise ValueError
        return key, json.loads(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: accepted KEY=VALUE with VALUE in JSON "
                                         "(true, false, a number, a quoted string)") from None


@dataclass
class Costs:
    """Seconds of the pieces one mode's calls are made of, each timed alone."""

    step: float                 # the target's step of one token
    draft_step: float           # the 2-layer draft's step of one token
    prompt: float               # the target's prompt pass
    draft_prompt: float         # the draft's prompt pass
    verify: dict                # K -> the target's step of K + 1 tokens

    @classmethod
    def measure(cls, target, draft, batch: int, dev, cap, prompt_len: int, ks) -> "Costs":
        return cls(step_cost(target, batch, 1, dev, cap), step_cost(draft, batch, 1, dev, cap),
                   prefill_cost(target, batch, dev, prompt_len, compile=cap),
                   prefill_cost(draft, batch, dev, prompt_len, compile=cap),
                   {k: step_cost(target, batch, k + 1, dev, cap) for k in ks})


def switches(args) -> dict:
    """The Engine speed fields the flags name (every call of the run is given them)."""
    return dict(inductor_options={**dict(INDUCTOR_OPTIONS), **dict(args.inductor_option)},
                capture_prompts_up_to=0 if args.no_prompt_graphs else Engine.capture_prompts_up_to,
                fused_settle=not args.no_fused_settle, plain_steps=args.plain_steps,
                row_kernels=not args.no_row_kernels, row_norms=not args.no_row_norms,
                row_rope=not args.no_row_rope)


def main(argv=None):
    args = build_parser().parse_args(argv)
    check_peer(args)
    speed = switches(args)
    dev = torch.device(args.device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    rows, emit = open_log(args.out)
    bw = copy_bandwidth(dev)
    target, draft, originals = build(args.shape, dev, dtype)
    wbytes = sum(p.numel() * p.element_size() for p in target.parameters())
    floor_ms = 1e3 * wbytes / bw if bw == bw else float("nan")
    emit(dict(kind="setup", device=torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
              shape=args.shape, weight_gb=wbytes / 1e9, copy_tb_s=bw / 1e12, floor_ms=floor_ms,
              transformers=__import__("transformers").__version__, torch=torch.__version__,
              prompts=args.prompts, **speed))
    for eps in args.eps:
        set_eps(originals, eps)
        for b in args.batches:
            ids = prompts(target.config.vocab_size, b, args.prompt, args.prompts, dev)
            for mode in args.modes if dev.type == "cuda" else ["eager"]:
                if mode == "inductor" and (b != 1 or eps != 0.0):
                    continue
                bench = Bench(args, target, draft, ids, engine_of(COMPILE[mode], **speed), dev,
                              floor_ms,
                              dict(mode=mode, eps=eps, batch=b, prompts=args.prompts))
                ks = args.ks if b == 1 and mode != "inductor" else [4]
                costs = Costs.measure(target, draft, b, dev, bench.cap, args.prompt, ks)
                plain, t_plain = bench.plain(costs, emit)
                for k in ks:
                    bench.speculative(k, costs, plain, t_plain, eps, emit)
            if not args.no_hf:
                hf_rows(args, target, draft, ids[0], eps, b, floor_ms, plain.outs[0], emit)
            mmspec.release_graphs()     # the kept static caches of this batch size
    if args.peer_gptfast:               # the report rewritten as rows come: a call cut short
        write_report(args.out, rows)    # during gpt-fast's run keeps what it measured
        for row in run_gptfast(args):
            emit(row)
            write_report(args.out, rows)
    for row in peer_rows(args.peer_rows):
        emit(row)
    write_report(args.out, rows)


@dataclass
class Bench:
    """One mode's rows at one eps and batch: ``generate`` calls over the prompts ``ids``
    (one call each), greedy, ``new_tokens`` each; ``tags`` go into every row."""

    args: argparse.Namespace
    target: object
    draft: object
    ids: list
    cap: Engine                 # the mode's Engine, with the run's switches
    dev: torch.device
    floor_ms: float
    tags: dict

    def calls(self, draft=None, tokens: int | None = None, pipeline=None, **kw) -> Calls:
        n = self.args.new_tokens if tokens is None else tokens
        return Calls([mmspec.generate(
            self.target, draft, p, engine=replace(self.cap, pipeline=pipeline), temperature=0,
            max_new_tokens=n, stop_token_ids=[], attention_mask=torch.ones_like(p), **kw)
            for p in self.ids])

    def plain(self, costs: Costs, emit):
        """The plain row: ms per token, and the decoding step alone (its graph replayed), in
        the loop (the calls less their measured prompt passes, over their steps) and at the
        margin (against calls of half the tokens, without the calls' own fixed costs)."""
        n, calls = self.args.new_tokens, len(self.ids)
        plain, t_plain = timed(lambda: self.calls(), self.dev, 3, warmup=2)
        decode_ms = 1e3 * (t_plain - calls * costs.prompt) / plain.steps
        emit(dict(kind="mmspec-plain", **self.tags,
                  ms_per_token=1e3 * t_plain / (n * calls),
                  ms_per_step=1e3 * t_plain / plain.steps,
                  step_over_floor=(1e3 * t_plain / plain.steps) / self.floor_ms,
                  decode_step_ms=decode_ms, decode_step_over_floor=decode_ms / self.floor_ms,
                  target_step_ms=1e3 * costs.step,
                  **self.margin(plain, t_plain, calls * costs.prompt)))
        return plain, t_plain

    def margin(self, plain: Calls, t_plain: float, t_prompts: float) -> dict:
        """The plain step at the margin: calls of half the tokens timed as ``plain`` was, the
        difference over the difference of their steps; and each call's cost beyond its
        prompt pass and its steps at that margin (set-up, the first step's host work, the
        output)."""
        n = self.args.new_tokens
        if n < 4:
            return {}
        half, t_half = timed(lambda: self.calls(tokens=n // 2), self.dev, 3, warmup=1)
        step_ms = 1e3 * (t_plain - t_half) / (plain.steps - half.steps)
        return dict(marginal_step_ms=step_ms, marginal_step_over_floor=step_ms / self.floor_ms,
                    call_overhead_ms=(1e3 * (t_plain - t_prompts) - step_ms * plain.steps)
                    / len(plain.outs))

    def speculative(self, k: int, costs: Costs, plain: Calls, t_plain: float, eps: float, emit):
        """Speculative rows at K = ``k``: the 2-layer draft, and the target drafting for
        itself (K = 4, eps 0); speedups against the plain row next to their analytic bounds
        (from the steps' costs alone, and with each call's prompt passes on both sides)."""
        n, calls = self.args.new_tokens, len(self.ids)
        pipe = False if self.args.no_spec_pipeline else None
        for dname, dmodel in (("2-layer", self.draft), ("self", self.target)):
            if dname == "self" and (k != 4 or eps != 0.0):
                continue
            st, t = timed(lambda: self.calls(dmodel, pipeline=pipe, num_draft_tokens=k),
                          self.dev, 3, warmup=2)
            d_cost = costs.draft_step if dname == "2-layer" else costs.step
            p_d = costs.draft_prompt if dname == "2-layer" else costs.prompt
            step = costs.verify[k] + k * d_cost
            bound = st.tokens_per_step * costs.step / step
            bound_call = ((calls * costs.prompt + plain.steps * costs.step)
                          / (calls * (costs.prompt + p_d) + st.steps * step))
            speed = t_plain / t
            speed_decode = ((t_plain - calls * costs.prompt)          # each call less its
                            / (t - calls * (costs.prompt + p_d)))     # prompt passes
            emit(dict(kind="mmspec-spec", **self.tags, k=k, draft=dname,
                      acceptance=st.acceptance_rate, tokens_per_step=st.tokens_per_step,
                      ms_per_token=1e3 * t / (n * calls), speedup=speed, bound=bound,
                      efficiency=speed / bound, bound_call=bound_call,
                      efficiency_call=speed / bound_call, speedup_decode=speed_decode,
                      efficiency_decode=speed_decode / bound, cost_ratio=d_cost / costs.step,
                      verify_over_step=costs.verify[k] / costs.step,
                      step_ms=1e3 * costs.step, verify_ms=1e3 * costs.verify[k],
                      draft_step_ms=1e3 * d_cost, identical=st.same(plain)))


def hf_rows(args, target, draft, ids, eps, b, floor_ms, plain, emit) -> None:
    """transformers on the same models and prompts: eager, assisted (batch 1) and its own
    compiled generate (eps 0, batch 1, CUDA; unless ``--no-hf-compile``)."""
    dev, n, mask = ids.device, args.new_tokens, torch.ones_like(ids)
    with torch.inference_mode():
        ref, t_hf = timed(lambda: target.generate(ids, attention_mask=mask, do_sample=False,
                                                  max_new_tokens=n, min_new_tokens=n), dev, 2)
    emit(dict(kind="hf-eager", eps=eps, batch=b, ms_per_token=1e3 * t_hf / n,
              step_over_floor=(1e3 * t_hf / n) / floor_ms,
              identical_to_mmspec=bool(torch.equal(ref, plain.sequences))))
    if b == 1:
        with torch.inference_mode():
            ast, t_as = timed(lambda: target.generate(ids, attention_mask=mask, do_sample=False,
                                                      max_new_tokens=n, min_new_tokens=n,
                                                      assistant_model=draft), dev, 2)
        emit(dict(kind="hf-assisted", eps=eps, batch=b, ms_per_token=1e3 * t_as / n,
                  speedup_vs_hf_eager=t_hf / t_as,
                  identical_to_plain=bool(torch.equal(ast, ref))))
    if not args.no_hf_compile and eps == 0.0 and b == 1 and dev.type == "cuda":
        with torch.inference_mode():
            t0 = time.perf_counter()
            target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=n,
                            min_new_tokens=n, cache_implementation="static")
            warm = time.perf_counter() - t0
            _, t_c = timed(lambda: target.generate(ids, attention_mask=mask, do_sample=False,
                                                   max_new_tokens=n, min_new_tokens=n,
                                                   cache_implementation="static"), dev, 1)
        emit(dict(kind="hf-static-compile", eps=eps, batch=b, ms_per_token=1e3 * t_c / n,
                  step_over_floor=(1e3 * t_c / n) / floor_ms, warmup_s=warm))


def check_peer(args) -> None:
    """``--peer-gptfast`` and ``--peer-rows`` refused before any work: the 7B shape only, a
    gpt-fast folder, a file of gpt-fast's rows, not both."""
    if args.peer_gptfast is None and args.peer_rows is None:
        return
    flag = "--peer-gptfast" if args.peer_gptfast is not None else "--peer-rows"
    if args.shape != "7b":
        raise ValueError(f"{flag}: accepted with --shape 7b (gpt-fast's 7B config), "
                         f"not {args.shape}")
    if args.peer_rows is not None:
        if args.peer_gptfast is not None:
            raise ValueError("--peer-rows: accepted without --peer-gptfast (gpt-fast's rows "
                             "come from one or the other)")
        counts = {r.get("prompts", 1) for r in peer_rows(args.peer_rows)
                  if r["kind"] != "gptfast-steps"}               # the steps alone: no prompt
        if counts != {args.prompts}:
            raise ValueError(f"--peer-rows {args.peer_rows}: gpt-fast's rows are over "
                             f"{sorted(counts)} prompts; accepted rows over --prompts "
                             f"{args.prompts} (the same prompts on both sides)")
        return
    if not os.path.isfile(os.path.join(args.peer_gptfast, "generate.py")):
        raise ValueError(f"--peer-gptfast {args.peer_gptfast}: accepted a gpt-fast checkout "
                         "(a folder with generate.py and model.py)")


def run_gptfast(args):
    """gpt-fast's rows (``eval.peer_gptfast`` in a child process: its imports set inductor
    flags), on the same shape, draft, eps values, prompt and token counts, batch 1; each
    row yielded as the child prints it (a call cut short keeps the rows measured)."""
    import sys

    cmd = [sys.executable, "-m", "eval.peer_gptfast", args.peer_gptfast,
           "--eps", ",".join(str(e) for e in args.eps), "--new-tokens", str(args.new_tokens),
           "--prompt", str(args.prompt), "--prompts", str(args.prompts), "--repeats", "5"]
    yield from streamed_rows(cmd, f"--peer-gptfast {args.peer_gptfast}: gpt-fast")


def streamed_rows(cmd: list[str], what: str):
    """The JSON lines ``cmd`` prints, each as it comes; a ValueError naming ``what`` and the
    last line of its errors if it fails."""
    import subprocess
    import tempfile

    with tempfile.TemporaryFile("w+") as err:
        with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True) as child:
            for line in child.stdout:
                if line.startswith("{"):
                    yield json.loads(line)
        if child.returncode != 0:
            err.seek(0)
            tail = err.read().strip().splitlines()[-1:] or ["no output"]
            raise ValueError(f"{what} failed: {tail[0]}")


def peer_rows(path: str | None) -> list[dict]:
    """gpt-fast's rows from ``path`` (``eval.peer_gptfast``'s JSON lines; other lines are
    skipped); none when ``path`` is None."""
    if path is None:
        return []
    if not os.path.isfile(path):
        raise ValueError(f"--peer-rows {path}: no such file; accepted the JSON lines of "
                         "`python -m eval.peer_gptfast`")
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.startswith("{")]
    rows = [r for r in rows if str(r.get("kind", "")).startswith("gptfast-")]
    if not rows:
        raise ValueError(f"--peer-rows {path}: no gpt-fast rows (kind gptfast-...); accepted "
                         "the JSON lines of `python -m eval.peer_gptfast`")
    return rows


def write_report(out_dir, rows):
    setup = rows[0]
    lines = ["# GPU benchmark", "",
             f"{setup['device']}, {setup['shape']} Llama shape, {setup['weight_gb']:.1f} GB of "
             f"weights, copy bandwidth {setup['copy_tb_s']:.2f} TB/s, HBM floor "
             f"{setup['floor_ms']:.2f} ms per step; torch {setup['torch']}, transformers "
             f"{setup['transformers']}. Greedy decoding. Decode steps' inductor options: "
             f"{setup.get('inductor_options', '')}.", "",
             "| eps | batch | what | mode | K | draft | acceptance | tokens/step | ms/token | "
             "step / floor | decode step / floor | marginal step / floor | speedup | bound | "
             "efficiency | bound with prefill | efficiency with prefill | decoding speedup | "
             "decoding efficiency | identical |", "|" + "---|" * 20]
    for r in rows[1:]:
        lines.append("| " + " | ".join(str(x) for x in (
            r.get("eps", ""), r.get("batch", ""), r["kind"], r.get("mode", ""), r.get("k", ""),
            r.get("draft", ""), _f(r.get("acceptance"), 3), _f(r.get("tokens_per_step")),
            _f(r.get("ms_per_token")), _f(r.get("step_over_floor")),
            _f(r.get("decode_step_over_floor")), _f(r.get("marginal_step_over_floor")),
            _f(r.get("speedup", r.get("speedup_vs_hf_eager"))), _f(r.get("bound")),
            _f(r.get("efficiency")), _f(r.get("bound_call")), _f(r.get("efficiency_call")),
            _f(r.get("speedup_decode")), _f(r.get("efficiency_decode")),
            r.get("identical", r.get("identical_to_mmspec", r.get("identical_to_plain", ""))))) + " |")
    lines += _side_by_side(rows)
    with open(os.path.join(out_dir, "report.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def _side_by_side(rows) -> list[str]:
    """mmspec's captured modes (``compile=True``, ``"graphs"``) against gpt-fast, batch 1."""
    peer = {(r["kind"], r["eps"]): r for r in rows if r["kind"].startswith("gptfast-")}
    if not peer:
        return []
    out = ["", "mmspec against gpt-fast, batch 1, ms per token (the call, prompt pass "
           "included):", "",
           "| eps | what | mmspec mode | mmspec | gpt-fast | mmspec / gpt-fast | tokens per "
           "step, mmspec / gpt-fast | per step: mmspec / gpt-fast | gpt-fast first call s |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("mode") not in ("captured", "graphs") or r.get("batch") != 1:
            continue
        if r["kind"] == "mmspec-plain":      # gpt-fast times plain decoding at its first eps
            g = peer.get(("gptfast-plain", r["eps"]))
            what = "plain"
        elif r["kind"] == "mmspec-spec" and r.get("k") == 4 and r.get("draft") == "2-layer":
            g = peer.get(("gptfast-spec", r["eps"]))
            what = "speculative K = 4"
        else:
            continue
        mode = "`compile=True`" if r["mode"] == "captured" else '`compile="graphs"`'
        if g is not None:
            # ms per step (ms per token x tokens per step): the engines' costs, whatever
            # each side's trajectory accepted
            mine, theirs = r.get("tokens_per_step", 1.0), g["tokens_per_step"]
            per_step = r["ms_per_token"] * mine / (g["ms_per_token"] * theirs)
            out.append(f"| {r['eps']} | {what} | {mode} | {r['ms_per_token']:.2f} | "
                       f"{g['ms_per_token']:.2f} | {r['ms_per_token'] / g['ms_per_token']:.2f} "
                       f"| {mine:.2f} / {theirs:.2f} | {per_step:.2f} | "
                       f"{g['first_call_s']:.0f} |")
    return out + _steps_side_by_side(rows, peer)


def _steps_side_by_side(rows, peer) -> list[str]:
    """The speculative call's steps alone, each side timing its own compiled steps."""
    head = ["", "Steps alone, ms (mmspec / gpt-fast), batch 1:", "",
            "| eps | mmspec mode | K | target step | verification (K + 1 tokens) | draft step |",
            "|---|---|---|---|---|---|"]
    out = list(head)
    for r in rows:
        g = peer.get(("gptfast-steps", r.get("eps")))
        if (g is None or r["kind"] != "mmspec-spec" or r.get("batch") != 1
                or r.get("draft") != "2-layer" or r.get("k") != g["k"]):
            continue
        cells = [f"{r[key]:.2f} / {g[key]:.2f}" for key in ("step_ms", "verify_ms",
                                                            "draft_step_ms")]
        out.append(f"| {r['eps']} | {r['mode']} | {r['k']} | " + " | ".join(cells) + " |")
    return out if len(out) > len(head) else []


def _f(v, nd=2):
    return "" if v is None else f"{v:.{nd}f}"


if __name__ == "__main__":
    run(main, "eval.bench_gpu")

"""The GPU benchmarks' CPU smoke runs: every mmspec row equals plain greedy, Hugging Face's
rows equal mmspec's, the bounds are computed; the loop-overhead benchmark's stub run (no
timing is asserted)."""

from __future__ import annotations

import json
import math

import pytest
import torch


def test_bench_gpu_tiny_cpu_rows_are_identical_and_bounded(tmp_path, monkeypatch):
    from eval.bench_gpu import main
    from mmspec.engine import INDUCTOR_OPTIONS

    defaults = dict(INDUCTOR_OPTIONS)
    main(["--shape", "tiny", "--device", "cpu", "--no-hf-compile", "--batches", "1,2",
          "--ks", "2", "--eps", "0.0", "--new-tokens", "12", "--prompt", "8",
          "--inductor-option", "triton.enable_pdl=false", "--out", str(tmp_path)])
    rows = [json.loads(line) for line in (tmp_path / "bench.jsonl").read_text().splitlines()]
    assert rows[0]["inductor_options"] == {**defaults, "triton.enable_pdl": False}
    spec = [r for r in rows if r["kind"] == "mmspec-spec"]
    assert {(r["batch"], r["k"]) for r in spec} == {(1, 2), (2, 4)}
    assert all(r["identical"] for r in spec)
    assert all(r["bound"] > 0 and r["bound_call"] > 0 for r in spec)
    assert all(r["identical_to_mmspec"] for r in rows if r["kind"] == "hf-eager")
    assert "bound with prefill" in (tmp_path / "report.md").read_text()
    assert all(r["verify_ms"] > 0 and r["draft_step_ms"] > 0 for r in spec)
    plain = [r for r in rows if r["kind"] == "mmspec-plain"]     # the step at the margin too
    assert plain and all(math.isfinite(r["marginal_step_ms"]) and "call_overhead_ms" in r
                         for r in plain)
    assert "marginal step / floor" in (tmp_path / "report.md").read_text()


def test_bench_gpu_no_hf_runs_no_transformers_rows(tmp_path, monkeypatch):
    from eval.bench_gpu import main

    main(["--shape", "tiny", "--device", "cpu", "--no-hf", "--batches", "1", "--ks", "2",
          "--eps", "0.0", "--new-tokens", "4", "--prompt", "4", "--no-prompt-graphs",
          "--no-fused-settle", "--no-row-kernels", "--no-row-norms", "--no-row-rope",
          "--out", str(tmp_path)])
    lines = (tmp_path / "bench.jsonl").read_text().splitlines()
    setup = json.loads(lines[0])
    assert setup["capture_prompts_up_to"] == 0 and setup["fused_settle"] is False
    assert setup["row_kernels"] is False and setup["row_norms"] is False
    assert setup["row_rope"] is False
    kinds = {json.loads(line)["kind"] for line in lines}
    assert {"mmspec-plain", "mmspec-spec"} <= kinds and not any(k.startswith("hf-") for k in kinds)
    elapsed = [json.loads(line)["elapsed_s"] for line in lines]     # where a call's time went
    assert elapsed == sorted(elapsed) and elapsed[-1] > 0


def test_gptfast_rows_stream_from_the_child_and_from_a_file(tmp_path):
    """gpt-fast's rows arrive one by one (a failing child's earlier rows are kept before its
    one-line error); ``--peer-rows`` reads an earlier call's, refused before any work when
    the file holds none, with ``--peer-gptfast`` or off the 7B shape."""
    import sys
    from types import SimpleNamespace

    from eval.bench_gpu import check_peer, peer_rows, streamed_rows

    code = ("import sys; print('{\"kind\": \"gptfast-plain\", \"eps\": 0.0}', flush=True); "
            "sys.stderr.write('boom\\n'); sys.exit(3)")
    got = []
    with pytest.raises(ValueError, match="gpt-fast failed: boom"):
        for row in streamed_rows([sys.executable, "-c", code], "gpt-fast"):
            got.append(row)
    assert got == [{"kind": "gptfast-plain", "eps": 0.0}]
    good, bad = tmp_path / "peer.jsonl", tmp_path / "none.jsonl"
    good.write_text('warning\n{"kind": "gptfast-spec", "eps": 0.05}\n{"kind": "setup"}\n'
                    '{"kind": "gptfast-steps", "eps": 0.05}\n')
    bad.write_text('{"kind": "mmspec-plain"}\n')
    assert peer_rows(str(good)) == [{"kind": "gptfast-spec", "eps": 0.05},
                                    {"kind": "gptfast-steps", "eps": 0.05}]
    args = lambda **kw: SimpleNamespace(**{"shape": "7b", "peer_gptfast": None,  # noqa: E731
                                           "peer_rows": None, "prompts": 1, **kw})
    check_peer(args(peer_rows=str(good)))
    four = tmp_path / "four.jsonl"                 # rows over 4 prompts, the steps alone none
    four.write_text('{"kind": "gptfast-plain", "prompts": 4}\n{"kind": "gptfast-steps"}\n')
    check_peer(args(peer_rows=str(four), prompts=4))
    for kw, msg in ((dict(peer_rows=str(bad)), "no gpt-fast rows"),
                    (dict(peer_rows=str(good), prompts=4), "over \\[1\\] prompts"),
                    (dict(peer_rows=str(tmp_path / "x")), "no such file"),
                    (dict(peer_rows=str(good), peer_gptfast=str(tmp_path)), "without --peer"),
                    (dict(peer_rows=str(good), shape="1b"), "accepted with --shape 7b")):
        with pytest.raises(ValueError, match=msg):
            check_peer(args(**kw))


def test_bench_gpu_rows_over_several_prompts(tmp_path):
    """``--prompts 3``: each row times one call per prompt (the first prompt is the one-prompt
    run's), its tokens per step counted over all of them; speculative greedy equals plain
    greedy on every prompt."""
    from eval.bench_gpu import main, prompts

    first = prompts(512, 1, 4, 3, torch.device("cpu"))
    assert len(first) == 3 and torch.equal(first[0], prompts(512, 1, 4, 1, torch.device("cpu"))[0])
    assert not torch.equal(first[0], first[1])
    main(["--shape", "tiny", "--device", "cpu", "--no-hf", "--batches", "1", "--ks", "2",
          "--eps", "0.0", "--new-tokens", "6", "--prompt", "4", "--prompts", "3",
          "--out", str(tmp_path)])
    rows = [json.loads(line) for line in (tmp_path / "bench.jsonl").read_text().splitlines()]
    assert rows[0]["prompts"] == 3
    spec = [r for r in rows if r["kind"] == "mmspec-spec"]
    plain = [r for r in rows if r["kind"] == "mmspec-plain"]
    assert spec and all(r["prompts"] == 3 and r["identical"] for r in spec)
    # 6 tokens per call, 3 calls: plain decoding took 18 steps
    assert plain[0]["ms_per_step"] == pytest.approx(plain[0]["ms_per_token"])
    assert all(1.0 <= r["tokens_per_step"] <= 3.0 for r in spec)


def test_bench_gpu_refuses_a_malformed_inductor_option_in_one_line():
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "eval.bench_gpu", "--inductor-option", "pdl"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "--inductor-option" in r.stderr and "KEY=VALUE" in r.stderr
    assert len(r.stderr.strip().splitlines()) <= 2


def test_loop_overhead_benchmark_runs_the_three_loops_on_stub_networks():
    from eval.bench_overhead import loop_us

    r = loop_us("cpu", k=3, tokens=20, repeats=0)
    assert r["identical"]                     # stub target and draft share their logits
    assert r["speculative_acceptance"] == r["speculative_pipelined_acceptance"] == 1.0
    assert all(r[n] > 0 for n in ("plain", "speculative", "speculative_pipelined"))


def test_call_overhead_benchmark_times_whole_calls_of_one_token(monkeypatch):
    """bench_overhead --call: 21 whole calls on one stub network, whose structure (its
    modules' configs) the sessions read once, not per call (``causal_lm.net_facts``)."""
    from eval.bench_overhead import main
    from mmspec.sessions import causal_lm as session

    walks = []
    walk = session.module_configs
    monkeypatch.setattr(session, "module_configs", lambda net: walks.append(net) or walk(net))
    assert main(["--call", "--repeats", "1"]) > 0
    assert len(walks) == 1


def test_loop_runs_fewer_tensor_operations_per_plain_step_than_before():
    """bench_overhead --ops: the plain loop's operations around the static step (40 per step
    before the trimming, docs/benchmarks.md "GPU path"); speculative steps add the draft's."""
    from eval.bench_overhead import ops_per_step

    r = ops_per_step(k=4)
    assert 0 < r["plain"] < 40
    assert r["speculative"] > r["plain"]


def test_profile_gpu_smoke_run_on_the_cpu():
    from eval.profile_gpu import main

    (row,) = main(["--shape", "tiny", "--device", "cpu", "--modes", "eager", "--new-tokens", "12",
                   "--prompt", "8"])
    assert row["identical"]                   # pipelined and synchronised plain decoding
    assert row["spec_acceptance"] == 1.0      # eps 0: layers past the draft's two write nothing
    assert row["spec_pipelined_acceptance"] == 1.0 and row["spec_model_ms"] > 0
    assert row["step_ms"] > 0 and row["step_sync_ms"] > 0 and row["spec_steps"] > 0
    assert row["prompt_host_ms"] > 0 and row["prompt_kernels"] > 0


def test_call_timeline_splits_a_call_at_its_graph_replays():
    """Synthetic trace events: a check before the prompt's graph, then three step graphs with
    an eager kernel and a copy between them; times in microseconds."""
    from eval.profile_gpu import call_timeline

    events, corr = [], iter(range(100))

    def queued(api, ts, *kernels):
        c = next(corr)
        events.append(dict(cat="cuda_runtime", name=api, ts=ts - 1, dur=1,
                           args=dict(correlation=c)))
        events.extend(dict(cat=cat, name=name, ts=t, dur=d, args=dict(correlation=c))
                      for cat, t, d, name in kernels)

    queued("cudaLaunchKernel", 0, ("kernel", 0, 2, "check"))             # the call's checks
    queued("cudaGraphLaunch", 100, ("kernel", 100, 50, "k"), ("kernel", 150, 50, "k"))  # prompt
    for start in (300, 420, 540):                                       # steps of 100 us
        queued("cudaGraphLaunch", start, ("kernel", start, 60, "k"),
               ("kernel", start + 60, 40, "k"))
        queued("cudaLaunchKernel", start + 105, ("kernel", start + 105, 3, "settle"))
        queued("cudaMemcpyAsync", start + 110, ("gpu_memcpy", start + 110, 2, "copy"))
    between = [dict(name="settle", per_step=1.0, us=3.0), dict(name="copy", per_step=1.0,
                                                               us=2.0)]
    assert call_timeline(events) == dict(graph_ms=0.1, between_us=20, between_ms=0.04,
                                         before_ms=0.1, after_ms=0.012,
                                         between_kernels=between)
    assert call_timeline(events[:2]) == {}


def test_bench_adapters_tiny_cpu_rows_equal_plain_decoding(tmp_path):
    """The adapters' benchmark on tiny shapes (float32 on the CPU), at batch 1 and 3: every
    speculative row gives plain decoding's tokens at its batch; at eps 0 the image draft and
    the two-layer codec draft are exact (acceptance 1), the text draft misses the image."""
    from eval.bench_adapters_gpu import main

    main(["--tiny", "--device", "cpu", "--new-tokens", "12", "--eps", "0.0", "--batches", "1,3",
          "--out", str(tmp_path)])
    rows = [json.loads(line) for line in (tmp_path / "bench.jsonl").read_text().splitlines()]
    spec = {(r["kind"], r["draft"], r["batch"]): r for r in rows if r["kind"].endswith("-spec")}
    assert set(spec) == {(k, d, b) for k, d in (("vlm-spec", "text"), ("vlm-spec", "image"),
                                                ("tts-spec", "2-layer")) for b in (1, 3)}
    assert all(r["identical"] for r in rows[1:] if "identical" in r)
    for b in (1, 3):
        assert spec["vlm-spec", "image", b]["acceptance"] == 1.0
        assert spec["tts-spec", "2-layer", b]["acceptance"] == 1.0
        assert spec["vlm-spec", "text", b]["acceptance"] < 1.0
    for r in spec.values():         # the call's time per target step, beside the steps alone
        assert r["ms_per_step"] == pytest.approx(r["ms_per_token"] * 12 / r["steps"])
        assert min(r["step_ms"], r["verify_ms"], r["draft_step_ms"]) > 0
    report = (tmp_path / "report.md").read_text()
    assert "speedup vs eager plain" in report and "verification + K draft steps" in report


def test_bench_jacobi_reports_step_compression_of_the_batch(capsys):
    """compression = tokens / NFE of the batch (its slowest row), beside tokens per step per
    row (which it once printed as compression)."""
    import json

    from eval.bench_jacobi import main

    main(["--grid", "4", "--batch", "3", "--steps", "3", "--windows", "4"])
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    assert len(rows) == 9
    for r in rows:
        assert abs(r["step_compression"] - 16 / r["nfe"]) < 1e-3
        assert r["tokens_per_step"] >= r["step_compression"] - 1e-3


def test_bench_trees_tiny_cpu_rows_equal_plain_decoding(tmp_path):
    """The tree benchmark on the tiny shape (float32 on the CPU): chains and trees give plain
    decoding's tokens at batch 1 and 4; a tree step and a chain step are both timed."""
    from eval.bench_trees_gpu import main

    main(["--shape", "tiny", "--device", "cpu", "--modes", "eager", "--batches", "1,4",
          "--eps", "0.05", "--new-tokens", "12", "--out", str(tmp_path)])
    rows = [json.loads(line) for line in (tmp_path / "bench.jsonl").read_text().splitlines()]
    gen = [r for r in rows if r["kind"] == "gen" and r["method"] != "plain"]
    assert {r["method"] for r in gen} == {"chain K=4", "tree 22 nodes"} and len(gen) == 4
    assert all(r["identical"] for r in gen)
    assert all(r["tree_ms"] > 0 and r["chain_ms"] > 0 for r in rows if r["kind"] == "step")


def test_bench_trees_times_a_recurrent_targets_tree_steps(tmp_path):
    """On a Qwen3.5 shape (linear attention) the tree steps are fed as their paths and timed;
    its recurrent draft takes no trees, so no generation rows."""
    from eval.bench_trees_gpu import main

    main(["--shape", "tiny-qwen3.5", "--device", "cpu", "--modes", "eager", "--batches", "2",
          "--new-tokens", "4", "--prompt", "8", "--out", str(tmp_path)])
    rows = [json.loads(line) for line in (tmp_path / "bench.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["kind"] == "step"]
    assert [r["tokens"] for r in steps] == [3, 7, 15, 31] and len(rows) == 5
    assert all(r["tree_ms"] > 0 and r["chain_ms"] > 0 for r in steps)
    assert "float32 random weights" in (tmp_path / "report.md").read_text()


def test_tree_sizes_runs_on_the_bundled_models(capsys):
    from eval.tree_sizes import main

    main(["--captions", "1", "--trees", "2x2x2", "--ks", "2"])
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["name"] for r in rows] == ["exact K=2", "draft tree 2x2x2", "head tree 2x2x2"]
    assert all(r["tokens_per_step"] >= 1.0 for r in rows)


def test_gptfast_side_by_side_rows_and_bad_input(tmp_path):
    """The side-by-side table pairs mmspec's captured rows with gpt-fast's; a gpt-fast folder
    is checked before any work."""
    from eval.bench_gpu import _side_by_side, main

    rows = [dict(kind="mmspec-plain", mode="captured", eps=0.0, batch=1, ms_per_token=6.0),
            dict(kind="mmspec-spec", mode="captured", eps=0.05, batch=1, k=4, draft="2-layer",
                 ms_per_token=4.0, tokens_per_step=2.5, step_ms=4.0, verify_ms=5.2,
                 draft_step_ms=0.4),
            dict(kind="gptfast-plain", eps=0.0, batch=1, ms_per_token=5.0, first_call_s=95.0,
                 tokens_per_step=1.0),
            dict(kind="gptfast-spec", eps=0.05, batch=1, ms_per_token=4.0, first_call_s=90.0,
                 tokens_per_step=2.25),
            dict(kind="gptfast-steps", eps=0.05, batch=1, k=4, step_ms=4.5, verify_ms=5.0,
                 draft_step_ms=0.35)]
    table = "\n".join(_side_by_side(rows))
    assert ("| 0.0 | plain | `compile=True` | 6.00 | 5.00 | 1.20 | 1.00 / 1.00 | 1.20 "
            "| 95 |") in table
    assert ("| 0.05 | speculative K = 4 | `compile=True` | 4.00 | 4.00 | 1.00 | 2.50 / 2.25 "
            "| 1.11 | 90 |") in table
    assert "| 0.05 | captured | 4 | 4.00 / 4.50 | 5.20 / 5.00 | 0.40 / 0.35 |" in table
    assert "| 0.0 | captured" not in table.split("Steps alone")[1]   # no gpt-fast steps at 0
    later = dict(rows[0], eps=0.05, ms_per_token=4.5)          # plain paired at its own eps
    table = "\n".join(_side_by_side([later] + rows[2:] + [dict(rows[2], eps=0.05,
                                                                ms_per_token=5.625)]))
    assert "| 0.05 | plain | `compile=True` | 4.50 | 5.62 | 0.80 |" in table
    assert "Steps alone" not in "\n".join(_side_by_side(rows[:-1]))   # a call cut before them
    with pytest.raises(ValueError, match="accepted a gpt-fast checkout"):
        main(["--peer-gptfast", str(tmp_path), "--out", str(tmp_path)])


def test_interleaved_rows_carry_transformers_rotary_pairs_to_gptfast_layout():
    """gpt-fast is fed the benchmark's own weights: a query projection reordered by
    ``interleaved_rows`` and rotated in interleaved pairs gives transformers' half-split
    rotation of the original, element for element (the pairs renumbered)."""
    import torch
    from transformers.models.llama.modeling_llama import rotate_half

    from eval.peer_gptfast import interleaved_rows

    heads, d, dim, n = 3, 8, 12, 5
    g = torch.Generator().manual_seed(0)
    w, x = torch.randn(heads * d, dim, generator=g), torch.randn(n, dim, generator=g)
    angle = torch.arange(n)[:, None] / 10000 ** (torch.arange(0, d, 2) / d)        # [n, d/2]
    cos, sin = angle.cos()[:, None], angle.sin()[:, None]
    q = (x @ w.T).view(n, heads, d)
    half = q * torch.cat([cos, cos], -1) + rotate_half(q) * torch.cat([sin, sin], -1)

    def interleaved(weight):                                                     # gpt-fast's
        a, b = (x @ weight.T).view(n, heads, d // 2, 2).unbind(-1)
        return torch.stack([a * cos - b * sin, b * cos + a * sin], -1)          # [n, h, d/2, 2]

    expected = half.view(n, heads, 2, d // 2).transpose(-1, -2)
    torch.testing.assert_close(interleaved(interleaved_rows(w, heads)), expected)
    with pytest.raises(AssertionError):                 # the rows as they are: other pairs
        torch.testing.assert_close(interleaved(w), expected)


def test_first_call_smoke_run_and_bad_input(capsys):
    """eval.first_call's five timings on the CPU (eager), in this process; compiled modes
    are refused off CUDA in one line."""
    from eval.first_call import main, measure

    row = measure("tiny", "cpu", "eager", k=2, new_tokens=4, prompt_len=8)
    assert row["mode"] == "eager" and row["device"] == "cpu"
    assert all(row[k] > 0 for k in ("spec_first_s", "spec_second_s", "spec_s", "plain_first_s",
                                    "plain_s"))
    with pytest.raises(ValueError, match="--modes captured: accepted eager only on cpu"):
        main(["--device", "cpu", "--modes", "captured"])


def test_bench_gemv_refuses_bad_rows_and_a_machine_without_cuda(capsys):
    import torch

    from eval.bench_gemv import main

    with pytest.raises(SystemExit):
        main(["--rows", "0"])
    assert "--rows: 0: accepted an integer >= 1" in capsys.readouterr().err
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="accepted a machine with a CUDA GPU"):
            main(["--rows", "1"])


def test_step_kernels_smoke_run_interleaves_settings_and_summarises_them(capsys):
    """eval.step_kernels on the CPU: one fresh process per compilation, settings in the order
    given, each row with its step time and kernels, then one summary line per setting."""
    from eval.step_kernels import main

    rows = main(["--shape", "tiny", "--device", "cpu", "--compilations", "1", "--kernels", "3",
                 "--width", "5", "--setting", "",
                 "--setting", "coordinate_descent_tuning=false,engine.row_kernels=false"])
    second = {"coordinate_descent_tuning": False, "engine.row_kernels": False}
    assert [r["setting"] for r in rows] == [{}, second]
    assert [r["width"] for r in rows] == [5, 5]
    assert all(r["replay_ms"] > 0 and 0 < len(r["kernels"]) <= 3 for r in rows)
    lines = [json.loads(x) for x in capsys.readouterr().out.strip().splitlines()]
    summary = [x for x in lines if "median_ms" in x]
    assert [s["setting"] for s in summary] == [{}, second]
    assert all(s["compilations"] == 1 and s["min_ms"] == s["median_ms"] == s["max_ms"]
               for s in summary)


def test_step_kernels_refuses_a_malformed_setting_before_any_work():
    from eval.step_kernels import main

    with pytest.raises(ValueError, match="--setting: 'pdl': accepted KEY=VALUE"):
        main(["--device", "cpu", "--setting", "realize_opcount_threshold=6,pdl"])
    with pytest.raises(ValueError, match="'engine.fast': accepted an Engine speed field"):
        main(["--device", "cpu", "--setting", "engine.fast=true"])


def test_gptfast_steps_alone_are_called_as_its_loops_call_them():
    """``step_costs`` passes gpt-fast's compiled steps the dtypes and layouts its own loops
    pass (int32 tokens; int32 plain and int64 draft positions; int64 verification positions),
    the one-token steps under the math attention ``decode_n_tokens`` selects, so timing them
    compiles nothing new."""
    from types import SimpleNamespace

    import torch

    from eval.peer_gptfast import step_costs

    seen = []

    def decode_one_token(model, x, pos, **kw):
        seen.append(("one", model, x.dtype, tuple(x.shape), x.is_contiguous(), pos.dtype,
                     tuple(pos.tolist()), torch.backends.cuda.math_sdp_enabled(),
                     torch.backends.cuda.flash_sdp_enabled()))

    def model_forward(model, x, pos):
        seen.append(("wide", model, x.dtype, tuple(x.shape), x.is_contiguous(), pos.dtype,
                     tuple(pos.tolist())))

    G = SimpleNamespace(decode_one_token=decode_one_token, model_forward=model_forward)
    target = torch.nn.Module()
    target.output = torch.nn.Linear(1, 1)
    costs = step_costs(G, target, "draft", k=4, pos=10, reps=2)
    assert set(costs) == {"step_ms", "verify_ms", "draft_step_ms"}
    assert set(seen) == {
        ("one", target, torch.int32, (1, 1), True, torch.int32, (10,), True, False),
        ("wide", target, torch.int32, (1, 5), True, torch.int64, (10, 11, 12, 13, 14)),
        ("one", "draft", torch.int32, (1, 1), True, torch.int64, (10,), True, False)}
    assert torch.backends.cuda.flash_sdp_enabled()           # the context is left after


def test_bench_jacobi_gpu_tiny_cpu_rows_and_bounds(tmp_path):
    """The Jacobi GPU benchmark's smoke run (tiny shape, CPU, 16 image tokens, window 4):
    plain and every Jacobi method produce one image of 16 tokens through the text-to-image
    path with guidance; each row's bounds are its compression (and the bundled model's, one
    per method) x the plain step / the window step; a compression per method is required."""
    from eval.bench_jacobi_gpu import METHODS, main

    with pytest.raises(ValueError, match="--compressions"):
        main(["--shape", "tiny", "--device", "cpu", "--compressions", "3,4",
              "--out", str(tmp_path)])
    main(["--shape", "tiny", "--device", "cpu", "--new-tokens", "16", "--prompt", "8",
          "--windows", "4", "--compressions", "3.0,3.5,4.0,4.5", "--out", str(tmp_path)])
    rows = [json.loads(line) for line in (tmp_path / "bench.jsonl").read_text().splitlines()]
    assert rows[0]["kind"] == "setup" and rows[0]["grid"] == [4, 4]
    (plain,) = [r for r in rows if r["kind"] == "plain"]
    jacobi = {r["method"]: r for r in rows if r["kind"] == "jacobi"}
    assert not [r for r in rows if r["kind"] == "error"]
    assert set(jacobi) == set(METHODS)
    assert (plain["tokens"], plain["images"], plain["steps"]) == (16, 1, 16)
    bundled = dict(zip(METHODS, (3.0, 3.5, 4.0, 4.5)))
    for label, r in jacobi.items():
        assert (r["tokens"], r["images"], r["window"]) == (16, 1, 4)
        assert r["lossless"] == (not label.startswith("sjd-continue"))
        assert r["compression"] == pytest.approx(16 / r["steps"])
        assert r["plain_step_ms"] == plain["step_ms"] and r["window_step_ms"] > 0
        step_ratio = r["plain_step_ms"] / r["window_step_ms"]
        assert r["bound"] == pytest.approx(r["compression"] * step_ratio)
        assert r["bundled_compression"] == bundled[label]
        assert r["bound_bundled"] == pytest.approx(bundled[label] * step_ratio)
        assert r["efficiency"] == pytest.approx(r["speedup"] / r["bound"])
    report = (tmp_path / "report.md").read_text()
    assert "| eager | plain |" in report and "bound at bundled" in report
    assert all(f"| eager | {m}" in report for m in METHODS)

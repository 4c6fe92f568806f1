"""Runs in vLLM's environment (.venv-vllm): greedy generation in vLLM, with and without an
EAGLE-3 head, for tests/drafters/test_vllm.py.

    python vllm_serve.py JOB.json OUT.json

JOB: {"target": folder, "prompts": [[ids]...], "max_tokens": M,
      "runs": [{"name": str, "head": folder or null, "k": K}]}
OUT: {name: {"tokens": [[ids]...], "draft_tokens": n, "accepted_tokens": n, "seconds": s}}
"""

import gc
import json
import os
import sys
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def serve(job: dict, run: dict) -> dict:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    spec = None
    if run["head"] is not None:
        spec = {"model": run["head"], "method": "eagle3", "num_speculative_tokens": run["k"]}
    longest = max(len(p) for p in job["prompts"])
    t0 = time.perf_counter()
    llm = LLM(model=job["target"], skip_tokenizer_init=True, dtype="float32", seed=0,
              speculative_config=spec, max_model_len=longest + job["max_tokens"] + 8,
              enforce_eager=True, disable_log_stats=False)
    params = SamplingParams(temperature=0, max_tokens=job["max_tokens"], ignore_eos=True,
                            detokenize=False)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in job["prompts"]], params,
                        use_tqdm=False)
    counts = {m.name: m.value for m in llm.get_metrics() if hasattr(m, "value")}
    result = dict(tokens=[list(o.outputs[0].token_ids) for o in outs],
                  draft_tokens=counts.get("vllm:spec_decode_num_draft_tokens", 0),
                  accepted_tokens=counts.get("vllm:spec_decode_num_accepted_tokens", 0),
                  seconds=time.perf_counter() - t0)
    del llm
    gc.collect()
    return result


def main(job_path: str, out_path: str) -> None:
    with open(job_path) as f:
        job = json.load(f)
    out = {run["name"]: serve(job, run) for run in job["runs"]}
    with open(out_path, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main(*sys.argv[1:])

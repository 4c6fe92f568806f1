#!/usr/bin/env bash
# The continuous-token image models, trained in one GPU session, and their CSpD benchmark.
# Mixture pair (bundled: shapes-continuous, shapes-continuous-draft: 32 components, input noise
# 0.2, 390 s each) and a diffusion-head pair (benchmark only). Uses two GPUs when there are two
# (else the trainings share one). The bundled pair came from this script's mixture lines on two
# H200s, run without the diffusion lines (~8 minutes of training and evaluation).
# Usage: bash recipes/train/train_continuous_gpu.sh OUT_DIR [TRAIN_SECONDS]
set -u
out=${1:-out/continuous}
budget=${2:-390}
mkdir -p "$out/logs"
cache=/tmp/mmspec-continuous/latents.safetensors
python3 -m recipes.train.continuous --prepare-only --images 100000 --cache $cache > "$out/logs/prep.log" 2>&1 || { cat "$out/logs/prep.log"; exit 1; }
tail -1 "$out/logs/prep.log"
g2=$(( $(python3 -c 'import torch; print(torch.cuda.device_count())') > 1 ? 1 : 0 ))
common="--data shapes --images 100000 --cache $cache --time-budget $budget --steps 30000"
mix="--head mixture --components 32 --input-noise 0.2 --eval 500 --eval-temperatures 1.0,0.7,0.5"
CUDA_VISIBLE_DEVICES=0 python3 -m recipes.train.continuous $common --size target $mix --out "$out/shapes-continuous" > "$out/logs/mix-target.log" 2>&1 & p1=$!
CUDA_VISIBLE_DEVICES=$g2 python3 -m recipes.train.continuous $common --size draft $mix --out "$out/shapes-continuous-draft" > "$out/logs/mix-draft.log" 2>&1 & p2=$!
CUDA_VISIBLE_DEVICES=$g2 python3 -m recipes.train.continuous $common --size target --head diffusion --eval 500 --guidance 2.0 --out "$out/diffusion-target" > "$out/logs/diff-target.log" 2>&1 & p3=$!
CUDA_VISIBLE_DEVICES=0 python3 -m recipes.train.continuous $common --size draft --head diffusion --out "$out/diffusion-draft" > "$out/logs/diff-draft.log" 2>&1 & p4=$!
wait $p1 $p2 $p3 $p4
grep -h '^{\|ms/step' "$out"/logs/*.log
for rows in 1 16; do
  python3 -m eval.bench_continuous --target "$out/shapes-continuous" --draft "$out/shapes-continuous-draft" --prompts samples/prompts/shapes_eval.txt --rows $rows --k 2,4,8 --temperatures 1.0,0.7 --out "$out/bench-mixture-b$rows" 2>&1 | grep '^|'
  python3 -m eval.bench_continuous --target "$out/diffusion-target" --draft "$out/diffusion-draft" --prompts samples/prompts/shapes_eval.txt --rows $rows --k 2,4 --temperatures 1.0 --guidance 2.0 --out "$out/bench-diffusion-b$rows" 2>&1 | grep '^|'
done

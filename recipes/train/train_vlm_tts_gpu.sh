#!/usr/bin/env bash
# The bundled vision-language and speech models, trained in one GPU session (one H200):
# five trainings share the GPU. Needs data/speech/speech.npz and samples/models/shapes-codec
# from `python -m recipes.train.speech_data` (a machine with espeak-ng).
# Usage: bash recipes/train/train_vlm_tts_gpu.sh OUT_DIR
set -u
out=${1:-samples/models}
mkdir -p "$out" logs
python3 -m recipes.train.vlm --which target --steps 3600 --time-budget 400 --out "$out/shapes-vlm" > logs/vlm-target.log 2>&1 & p1=$!
python3 -m recipes.train.vlm --which text-draft --steps 3000 --time-budget 400 --out "$out/shapes-vlm-text-draft" > logs/vlm-text.log 2>&1 & p2=$!
python3 -m recipes.train.vlm --which vlm-draft --steps 3000 --time-budget 400 --out "$out/shapes-vlm-draft" > logs/vlm-draft.log 2>&1 & p3=$!
python3 -m recipes.train.tts --size target --steps 5000 --time-budget 400 --out "$out/shapes-tts" > logs/tts-target.log 2>&1 & p4=$!
python3 -m recipes.train.tts --size draft --steps 4000 --time-budget 400 --out "$out/shapes-tts-draft" > logs/tts-draft.log 2>&1 & p5=$!
wait $p1 $p2 $p3 $p4 $p5
grep -h '^{' logs/*.log

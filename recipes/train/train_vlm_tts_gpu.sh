#!/usr/bin/env bash
# The bundled vision-language and speech models, trained in one GPU session (one H200):
# five trainings share the GPU, each with its own time budget. Needs data/speech/speech.npz and
# samples/models/shapes-codec from `python -m recipes.train.speech_data` (espeak-ng machine).
# Usage: bash recipes/train/train_vlm_tts_gpu.sh OUT_DIR
set -u
out=${1:-samples/models}
mkdir -p "$out" logs
python3 -m recipes.train.vlm --which target --time-budget 330 --out "$out/shapes-vlm" > logs/vlm-target.log 2>&1 & p1=$!
python3 -m recipes.train.vlm --which text-draft --time-budget 150 --out "$out/shapes-vlm-text-draft" > logs/vlm-text.log 2>&1 & p2=$!
python3 -m recipes.train.vlm --which vlm-draft --time-budget 200 --out "$out/shapes-vlm-draft" > logs/vlm-draft.log 2>&1 & p3=$!
python3 -m recipes.train.tts --size target --time-budget 330 --out "$out/shapes-tts" > logs/tts-target.log 2>&1 & p4=$!
python3 -m recipes.train.tts --size draft --time-budget 200 --out "$out/shapes-tts-draft" > logs/tts-draft.log 2>&1 & p5=$!
wait $p1 $p2 $p3 $p4 $p5
grep -h '^{' logs/*.log

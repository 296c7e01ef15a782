#!/usr/bin/env bash
# Builds the libFuzzer targets with clang and runs each for SECONDS (default 180).
# Usage: scripts/fuzz.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-180}"
command -v clang++ >/dev/null || { echo "needs clang (apt-get install clang libclang-rt-14-dev)" >&2; exit 1; }
CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFAILSAFE_FUZZ=ON \
  -DFAILSAFE_TESTS=OFF -DFAILSAFE_SANITIZE=address,undefined >/dev/null
cmake --build build-fuzz --target fuzz_safetensors_header fuzz_tokenizer_parse fuzz_tokenizer_roundtrip \
  fuzz_chat_template fuzz_cluster_protocol fuzz_router_chunks
mkdir -p build-fuzz/corpus/{safetensors_header,tokenizer_parse,tokenizer_roundtrip,chat_template,cluster_protocol,router_chunks}
# Seeds: a synthetic model's files and the default model's SentencePiece-style tokenizer.json.
if [[ ! -f build-fuzz/corpus/seeded ]]; then
  cmake --build build --target failsafe >/dev/null 2>&1 || scripts/build.sh
  tmp=$(mktemp -d)
  build/src/cli/failsafe make-model --preset tiny-llama --out "$tmp/m" >/dev/null
  head -c 20000 "$tmp/m/model.safetensors" > build-fuzz/corpus/safetensors_header/seed
  cp "$tmp/m/tokenizer.json" build-fuzz/corpus/tokenizer_parse/seed
  cp data/models/stories260K/tokenizer.json build-fuzz/corpus/tokenizer_parse/seed-spm
  echo "The engine keeps serving. 日本語 🚀" > build-fuzz/corpus/tokenizer_roundtrip/seed
  for f in data/chat_templates/*.jinja; do cp "$f" build-fuzz/corpus/chat_template/; done
  rm -rf "$tmp"
  touch build-fuzz/corpus/seeded
fi
if [[ ! -f build-fuzz/corpus/router_chunks/seed ]]; then
  printf '%s' $'\x40data: {"choices":[{"finish_reason":null,"index":0,"text":"a","token_ids":[5,17]}],"id":"cmpl-1"}\n\n\x10data: [DONE]\n\n' \
    > build-fuzz/corpus/router_chunks/seed
fi
for t in safetensors_header tokenizer_parse tokenizer_roundtrip chat_template cluster_protocol router_chunks; do
  echo "== fuzz_$t for ${secs}s"
  build-fuzz/fuzz/fuzz_$t -max_total_time="$secs" -rss_limit_mb=4096 -print_final_stats=1 \
    build-fuzz/corpus/$t 2>&1 | grep -E "stat::number_of_executed_runs|ERROR|SUMMARY|Done" || true
done

#!/usr/bin/env bash
# The serving set-up on a CPU without AVX512, emulated (issue 25): valgrind's CPU reports AVX2 but
# no AVX512 (CPUID) and cannot execute AVX512 instructions (SIGILL), as on an AMD EPYC with AVX2 only.
#
#   bash scripts/emulate_avx2.sh            # steps 1-3, about 2 minutes on 2 cores
#   bash scripts/emulate_avx2.sh --serve    # and 4: a real server, a completion, `vllm bench serve`
#                                           #   (5 minutes in all, measured 2026-12-02)
#
# Needs valgrind and `bash .ci/serving-setup.sh` done. Exit 0: every step as expected; 1: a step
# failed (named); 2: valgrind or the vLLM venv is missing.
#   1. the emulation holds: torch in the vLLM venv sees no AVX512;
#   2. planted: the build vLLM's generic platform imports (`vllm._C`, AVX512) dies with SIGILL on
#      an AVX512 instruction (valgrind names its EVEX prefix, 0x62), the AVX2 build loads;
#   3. the client as kerneltrial runs it (serving/vllm_platform.py check-client) passes;
#   4. the server, started with the environment kerneltrial's launcher gives it (vllm_platform
#      `choose`), and the client serve and benchmark; every process of the server that mapped a
#      vLLM kernel build mapped `_C_AVX2` and no other.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${KERNELTRIAL_VLLM_VENV:-$ROOT/.vllm-venv}"
MODEL="${KERNELTRIAL_TINY_MODEL:-$ROOT/.cache/tiny-llama}"
PORT="${PORT:-18765}"
VG=(valgrind --tool=none -q --trace-children=yes)
log() { printf '[emulate-avx2] %s\n' "$*"; }
fail() { log "FAILED: $*"; exit 1; }

command -v valgrind >/dev/null || { log "valgrind not found (apt-get install valgrind)"; exit 2; }
[ -x "$VENV/bin/kt-vllm" ] || { log "no vLLM venv at $VENV (run bash .ci/serving-setup.sh)"; exit 2; }
TMPDIR_="$(mktemp -d)"
log "host CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-); flags: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^avx' | sort -u | tr '\n' ' ')"

seen="$("${VG[@]}" "$VENV/bin/python" -c "import torch; print(torch.cpu._is_avx512_supported(), torch.backends.cpu.get_cpu_capability())" 2>/dev/null | tail -1)"
[ "$seen" = "False AVX2" ] || fail "1: under valgrind torch reports '$seen', not 'False AVX2': the emulation does not hide AVX512"
log "1 ok: under valgrind the CPU has AVX2 and no AVX512 (torch: $seen)"

valgrind --tool=none "$VENV/bin/python" -c "import vllm._C" >/dev/null 2>"$TMPDIR_/c.err"  # not -q: it names the instruction
rc=$?
[ "$rc" -eq 132 ] || fail "2: importing vllm._C (the AVX512 build) exited $rc, not 132 (SIGILL): the emulation would not show the failure"
grep -q "unhandled instruction bytes: 0x62" "$TMPDIR_/c.err" || fail "2: vllm._C died, but not on an AVX512 (EVEX, 0x62) instruction: $(grep -m1 unhandled "$TMPDIR_/c.err")"
"${VG[@]}" "$VENV/bin/python" -c "
try:
    import vllm._C_AVX2
except ImportError as e:  # vLLM's own note: the library loads, its module name is _C
    assert 'module export function' in str(e), e
" >/dev/null 2>&1 || fail "2: the AVX2 build vllm._C_AVX2 does not load under the emulation"
log "2 ok: the generic platform's build vllm._C dies with SIGILL on an AVX512 instruction, as on an AVX2-only CPU; _C_AVX2 loads"

env -u VLLM_TARGET_DEVICE "${VG[@]}" "$VENV/bin/python" -m kerneltrial.serving.vllm_platform check-client "$VENV/bin/kt-vllm" 2>&1 | grep -v '^==' | tail -3
[ "${PIPESTATUS[0]}" -eq 0 ] || fail "3: the client check failed under the emulation"
log "3 ok: kt-vllm bench serve --help passes with the environment kerneltrial gives it"

[ "${1:-}" = "--serve" ] || exit 0
out="$TMPDIR_"
# what kerneltrial's launcher adds to a server's environment (serving/launcher.py: process_env);
# a pure decision on the installed distribution, so it is taken here, outside the emulation
added="$(env -u VLLM_TARGET_DEVICE "$VENV/bin/python" -c "import os, sys
from kerneltrial.serving.vllm_platform import choose
print(' '.join(f'{k}={v}' for k, v in choose(sys.argv[1], os.environ).added.items()))" "$VENV/bin/python")"
[ "$added" = "VLLM_TARGET_DEVICE=cpu" ] || fail "4: kerneltrial's launcher would add '$added', not VLLM_TARGET_DEVICE=cpu"
# its own process group, so that every process of the server is found and stopped
setsid env -u VLLM_TARGET_DEVICE $added VLLM_CPU_KVCACHE_SPACE=1 HF_HUB_OFFLINE=1 LD_PRELOAD="$VENV/lib/libiomp5.so" \
  "${VG[@]}" "$VENV/bin/python" -m vllm.entrypoints.openai.api_server --model "$MODEL" --load-format dummy \
  --host 127.0.0.1 --port "$PORT" --served-model-name tiny --max-model-len 1024 --max-num-seqs 8 --enforce-eager \
  >"$out/server.log" 2>&1 &
server=$!
trap 'kill -- -$server 2>/dev/null' EXIT
for _ in $(seq 180); do
  curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break
  kill -0 $server 2>/dev/null || fail "4: the server exited (log: $out/server.log)"
  sleep 5
done
curl -sf "http://127.0.0.1:$PORT/v1/completions" -H 'Content-Type: application/json' \
  -d '{"model":"tiny","prompt":"Hello","max_tokens":8}' >"$out/completion.json" || fail "4: no completion"
log "4: served a completion: $(head -c 120 "$out/completion.json")"
mapped=0
for p in $(pgrep -g $server); do
  builds="$(grep -o 'vllm/_C[A-Za-z0-9_]*\.abi3\.so' "/proc/$p/maps" 2>/dev/null | sort -u | tr '\n' ' ')"
  [ -n "$builds" ] || continue
  mapped=$((mapped + 1))
  log "4: process $p mapped: $builds"
  [ "$builds" = "vllm/_C_AVX2.abi3.so " ] || fail "4: process $p mapped another build than _C_AVX2"
done
[ $mapped -ge 2 ] || fail "4: $mapped server process(es) mapped a vLLM kernel build; expected the API server and its engine"
env -u VLLM_TARGET_DEVICE "${VG[@]}" "$VENV/bin/python" -c "
import os, subprocess, sys
from kerneltrial.serving.vllm_platform import process_env
exe = sys.argv[1]
env, choice = process_env(exe, os.environ)
sys.exit(subprocess.run([exe, 'bench', 'serve', '--backend', 'vllm', '--base-url', 'http://127.0.0.1:$PORT',
    '--model', 'tiny', '--tokenizer', '$MODEL', '--dataset-name', 'random', '--num-prompts', '4',
    '--random-input-len', '16', '--random-output-len', '8', '--seed', '0'], env=env).returncode)
" "$VENV/bin/kt-vllm" >"$out/bench.log" 2>&1 || fail "4: vllm bench serve failed (log: $out/bench.log)"
grep -E 'Successful requests|Mean TTFT' "$out/bench.log"
grep -q 'Successful requests: *4' "$out/bench.log" || fail "4: the benchmark did not complete its 4 requests"
log "4 ok: served and benchmarked under the emulation (logs in $out)"

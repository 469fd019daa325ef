#!/usr/bin/env bash
# ZeRO over a slow network on one machine: each rank in a network namespace
# of its own, the namespaces joined by a bridge (in a namespace too) through
# veth links, each rank's outgoing link shaped with tc's token-bucket filter.
# Every rank runs `pstar launch --nnodes N --node-rank K --nproc-per-node 1
# --master-addr 10.77.0.1` inside its namespace, one PSTAR_STORE_TOKEN for
# all: the multi-node path, on real sockets through a real (if virtual) link.
#
# First the unshaped link is measured (TCP between two of the namespaces);
# only rates at most half of it are used. Then, per world size and rate, one
# run reports per step: the step time, the time inside collectives (the
# communication a synchronous step pays in full), the compute left (step
# less collectives), the all-gather and reduce-scatter payload against
# ZeRO-3's count (2 and 1 times (N-1)/N param bytes a step: every param chunk
# gathered for forward and for backward, every gradient chunk
# reduce-scattered once; the smallest device budget sends more, as a chunk
# used twice in a pass, like the tied embedding's, is gathered, and its
# partial gradient reduce-scattered, once per use), and the bytes on the wire
# (every rank's veth tx bytes) over the payload. The exact count for a plan
# comes with the step-time model.
#
# Usage: bench/zero_netns.sh [--ranks "2 3"] [--rates "unshaped 1gbit 500mbit 250mbit"]
#                            [--steps N] [--shape bench|tiny] [--log-dir DIR]
#   Lines "netns ranks=... rate=... status=ok step_s=... ..." (one per run)
#   and "link unshaped_bits_per_s=..."; a run's logs in DIR.
#   Needs root and network namespaces; without them it says so in one line
#   and exits 3 (the test's skip).
# Environment: PSTAR_BUILD_DIR (build), PYTHON3 (python3).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
pstar="${PSTAR_BUILD_DIR:-$root/build}/bin/pstar"
py="${PYTHON3:-python3}"
ranks_list="2 3" rates="unshaped 1gbit 500mbit 250mbit" steps=6 shape=bench log_dir=""
die() { echo "zero_netns: $*" >&2; exit 2; }
while [ "$#" -gt 0 ]; do
  case "$1" in
    --ranks) ranks_list="$2"; shift ;;
    --rates) rates="$2"; shift ;;
    --steps) steps="$2"; shift ;;
    --shape) shape="$2"; shift ;;
    --log-dir) log_dir="$2"; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument $1 (try --help)" ;;
  esac
  shift
done
[[ "$steps" =~ ^[0-9]+$ ]] && [ "$steps" -ge 2 ] || die "--steps: a whole number of at least 2, got '$steps'"
for n in $ranks_list; do [[ "$n" =~ ^[2-8]$ ]] || die "--ranks: each from 2 to 8, got '$n'"; done
case "$shape" in bench | tiny) ;; *) die "--shape: bench or tiny, got '$shape'" ;; esac
[ -x "$pstar" ] || die "no pstar at $pstar (build first: scripts/build.sh)"
log_dir="${log_dir:-$(mktemp -d)}"
mkdir -p "$log_dir"

# --- the namespaces -----------------------------------------------------------
# Unique per run (ctest --parallel, two harnesses at once); the subnet is the
# same in every world, each world's namespaces seeing only their own bridge.
id="$(printf '%04x%02x' "$(( $$ % 65536 ))" "$(( RANDOM % 256 ))")"
sw="pz${id}s"
made=()
cleanup() {
  local ns
  for ns in "${made[@]}"; do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
  done
  made=()
}
trap cleanup EXIT
trap 'exit 130' INT TERM

rank_ns() { echo "pz${id}r$1"; }
rank_if() { echo "pz${id}r$1a"; }
rank_ip() { echo "10.77.0.$(( $1 + 1 ))"; }

if [ "$(id -u)" != 0 ] || ! ip netns add "$sw" 2>/dev/null; then
  echo "zero_netns: skipped: network namespaces cannot be made here ($( [ "$(id -u)" != 0 ] && echo 'not root' || echo 'ip netns add failed'))"
  exit 3
fi
made+=("$sw")
if ! { ip -n "$sw" link add br0 type bridge && ip -n "$sw" link set br0 up; } 2>/dev/null; then
  echo "zero_netns: skipped: a bridge cannot be made in a network namespace here"
  exit 3
fi

make_world() {  # N: namespaces 0..N-1 on the bridge (kept from an earlier world)
  local k ns
  for ((k = 0; k < $1; ++k)); do
    ns=$(rank_ns "$k")
    ip netns list | grep -qw "$ns" && continue
    ip netns add "$ns" || return 1
    made+=("$ns")
    ip link add "$(rank_if "$k")" type veth peer name "pz${id}r${k}b" || return 1
    ip link set "$(rank_if "$k")" netns "$ns" || return 1
    ip link set "pz${id}r${k}b" netns "$sw" || return 1
    ip -n "$sw" link set "pz${id}r${k}b" master br0 || return 1
    ip -n "$sw" link set "pz${id}r${k}b" up || return 1
    ip -n "$ns" addr add "$(rank_ip "$k")/24" dev "$(rank_if "$k")" || return 1
    ip -n "$ns" link set "$(rank_if "$k")" up || return 1
    ip -n "$ns" link set lo up || return 1
  done
}

shape_links() {  # N rate: every rank's outgoing link at `rate` (unshaped: none)
  local k ns dev bits burst
  for ((k = 0; k < $1; ++k)); do
    ns=$(rank_ns "$k") dev=$(rank_if "$k")
    ip netns exec "$ns" tc qdisc del dev "$dev" root 2>/dev/null || true
    [ "$2" = unshaped ] && continue
    bits=$(rate_bits "$2")
    # A burst of 5 ms of the rate (at least 64 KiB), as tbf needs at least rate / HZ.
    burst=$(( bits / 8 / 200 ))
    [ "$burst" -ge 65536 ] || burst=65536
    ip netns exec "$ns" tc qdisc add dev "$dev" root tbf rate "$2" burst "$burst" latency 200ms || return 1
  done
  return 0
}

rate_bits() {  # "1gbit" | "500mbit" | "250kbit" -> bits per second
  awk -v r="$1" 'BEGIN {
    n = r + 0; u = tolower(substr(r, length(n "") + 1))
    if (u == "gbit") n *= 1e9; else if (u == "mbit") n *= 1e6; else if (u == "kbit") n *= 1e3; else if (u != "bit") n = -1
    printf "%.0f", n }'
}

tx_bytes() {  # rank -> its veth's transmitted bytes
  ip netns exec "$(rank_ns "$1")" cat "/sys/class/net/$(rank_if "$1")/statistics/tx_bytes"
}

# --- the unshaped link ----------------------------------------------------------
measure_link() {  # bits per second from rank 0 to rank 1 over TCP, 3 s or 512 MiB
  ip netns exec "$(rank_ns 1)" "$py" - "$(rank_ip 1)" > "$log_dir/link_receiver.log" 2>&1 <<'PY' &
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 5201)); s.listen(1)
c, _ = s.accept(); n = 0; start = None
while True:
    b = c.recv(1 << 20)
    if not b: break
    if start is None: start = time.monotonic()
    n += len(b)
print(n * 8 / (time.monotonic() - start))
PY
  local receiver=$!
  sleep 0.5
  ip netns exec "$(rank_ns 0)" "$py" - "$(rank_ip 1)" <<'PY'
import socket, sys, time
for _ in range(50):
    try:
        s = socket.create_connection((sys.argv[1], 5201), timeout=2); break
    except OSError:
        time.sleep(0.1)
buf = b"\0" * (1 << 20); end = time.monotonic() + 3; n = 0
while time.monotonic() < end and n < (512 << 20):
    s.sendall(buf); n += len(buf)
s.close()
PY
  wait "$receiver"
  tail -1 "$log_dir/link_receiver.log"
}

# --- the job ----------------------------------------------------------------------
if [ "$shape" = tiny ]; then
  L=2 NH=2 C=64 V=256 T=32 GB=4 CHUNK=16384
else
  # Width 256, 4 layers, vocabulary 2048: 3.7M parameters in 4 MiB chunks,
  # gathered twice and reduce-scattered once a step: at 1 Gbit/s about as
  # long as the compute of 4 x 128 tokens per rank on one core each.
  L=4 NH=4 C=256 V=2048 T=128 GB=8 CHUNK=1048576
fi
job_args() {  # N
  local args=(--set "model={n_layer: $L, n_head: $NH, n_embd: $C, vocab_size: $V, max_seq_len: $T}"
              --set "train={batch_size: $((GB / $1 > 0 ? GB / $1 : 1)), seq_len: $T, steps: $steps, log_every: 1000, threads: 1}"
              --set "data={source: generated, generated_tokens: 262144}" --set "default_chunk_size=$CHUNK"
              --set "dist.timeout_seconds=120")
  printf '%s\n' "${args[@]}"
}

run_world() {  # N rate -> one "netns ..." line
  local n=$1 rate=$2 k pids=() rc=0 token args before=() after=() log
  make_world "$n" || die "cannot add rank namespaces for $n ranks"
  shape_links "$n" "$rate" || die "tc cannot shape the links to $rate"
  mapfile -t args < <(job_args "$n")
  # The smallest device budget: every param chunk gathered for each use.
  local plan min
  plan=$("$pstar" plan "${args[@]}" --world-size "$n" --json 2>&1) || die "pstar plan refused the job: $plan"
  min=$(sed -nE 's/.*"min_device_bytes": ([0-9]+).*/\1/p' <<<"$plan")
  [ -n "$min" ] || die "pstar plan printed no min_device_bytes"
  args+=(--set "runtime.device_memory=$min")
  token=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
  for ((k = 0; k < n; ++k)); do before[k]=$(tx_bytes "$k"); done
  for ((k = 0; k < n; ++k)); do
    log="$log_dir/netns_n${n}_${rate}_rank$k.log"
    ip netns exec "$(rank_ns "$k")" env PSTAR_STORE_TOKEN="$token" OMP_NUM_THREADS=1 \
      timeout 600 "$pstar" launch --nnodes "$n" --node-rank "$k" --nproc-per-node 1 \
        --master-addr "$(rank_ip 0)" --master-port 29500 -- train "${args[@]}" > "$log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || rc=$?; done
  for ((k = 0; k < n; ++k)); do after[k]=$(tx_bytes "$k"); done
  log="$log_dir/netns_n${n}_${rate}_rank0.log"
  if [ "$rc" -ne 0 ]; then
    echo "netns ranks=$n rate=$rate overlap=off status=failed rc=$rc log=$log"
    grep -h -m2 'error\|pstar:' "$log_dir"/netns_n${n}_${rate}_rank*.log | sed 's/^/  /' || true
    return 0
  fi
  local wire=0
  for ((k = 0; k < n; ++k)); do wire=$(( wire + after[k] - before[k] )); done
  local losses
  losses=$(for ((k = 0; k < n; ++k)); do sed -nE 's/^summary:.* final_loss=([0-9.]+).*/\1/p' "$log_dir/netns_n${n}_${rate}_rank$k.log"; done | sort -u | wc -l)
  awk -v n="$n" -v rate="$rate" -v steps="$steps" -v wire="$wire" -v losses="$losses" -v logf="$log" '
    /^summary:/ { for (i = 2; i <= NF; ++i) { split($i, kv, "="); s[kv[1]] = kv[2] } }
    /^collectives:/ { for (i = 2; i <= NF; ++i) { split($i, kv, "="); c[kv[1]] = kv[2] } }
    END {
      step = s["seconds"] / steps; coll = c["seconds_total"] / steps
      gather = c["all_gather_bytes_per_step"]; scatter = c["reduce_scatter_bytes_per_step"]
      payload = gather + scatter + c["all_reduce_bytes_per_step"] + c["broadcast_bytes_per_step"]
      # ZeRO-3 at accum 1: (2 + 1) (N-1)/N param bytes, the gathers 2 parts of the 3.
      plan_gather = c["zero3_bytes_per_step"] * 2 / 3; plan_scatter = plan_gather / 2
      # Every rank sends as much as rank 0 (ring collectives): the wire per rank.
      wire_step = wire / steps / n
      printf "netns ranks=%d rate=%s overlap=off status=ok step_s=%.4f collective_s=%.4f compute_s=%.4f " \
             "gather_bytes=%d zero3_gather_bytes=%d scatter_bytes=%d zero3_scatter_bytes=%d " \
             "payload_bytes=%d wire_bytes=%d wire_over_payload=%.3f " \
             "ranks_agree=%s final_loss=%s log=%s\n",
        n, rate, step, coll, step - coll, gather, plan_gather, scatter, plan_scatter, payload, wire_step,
        (payload > 0 ? wire_step / payload : 0), (losses == 1 ? "yes" : "no"), s["final_loss"], logf }' "$log"
}

echo "shape: $shape (layers $L, heads $NH, width $C, vocab $V, seq $T, global batch $GB, chunk $CHUNK elements); $steps steps; logs in $log_dir"
if ! make_world 2 2>/dev/null || ! shape_links 2 1gbit 2>/dev/null || ! shape_links 2 unshaped; then
  echo "zero_netns: skipped: veth links or tc's tbf cannot be set up in network namespaces here"
  exit 3
fi
link=$(measure_link)
echo "link unshaped_bits_per_s=${link:-0}"
half=$(awk -v l="${link:-0}" 'BEGIN { printf "%.0f", l / 2 }')
for n in $ranks_list; do
  for rate in $rates; do
    if [ "$rate" != unshaped ]; then
      bits=$(rate_bits "$rate")
      [ "$bits" -gt 0 ] || die "--rates: '$rate' is not a rate (like 1gbit, 500mbit)"
      if [ "$bits" -gt "$half" ]; then
        echo "netns ranks=$n rate=$rate status=skipped: above half the unshaped link ($half bits/s)"
        continue
      fi
    fi
    run_world "$n" "$rate"
  done
done

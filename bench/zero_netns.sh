#!/usr/bin/env bash
# ZeRO over a slow network on one machine: each rank in a network namespace
# of its own, the namespaces joined by a bridge (in a namespace too) through
# veth links, each rank's outgoing link shaped with tc's token-bucket filter.
# Every rank runs `pstar launch --nnodes N --node-rank K --nproc-per-node 1
# --master-addr 10.77.0.1` inside its namespace, one PSTAR_STORE_TOKEN for
# all: the multi-node path, on real sockets through a real (if virtual) link.
#
# First the unshaped link is measured (TCP between two of the namespaces);
# only rates at most half of it are used. Then per world size: one unshaped
# run with the collectives waited for as they start (runtime.comm_overlap
# off) gives the compute alone (its step less its time in collectives);
# then per rate and overlap setting one run reports, as medians over the
# steps after the first:
#   step_s          the step time
#   collective_s    time inside collectives (on the communicator's thread)
#   waited_s        the part of it the step waited for
#   compute_alone_s the unshaped run's step less its collectives
#   comm_alone_s    the last step's gathers and reduce-scatters replayed
#                   without compute at this rate (pstar train --comm-alone)
#   hidden          the share of comm_alone hidden: (compute + comm - step) / comm
#   step_over_max   step / max(compute alone, comm alone): 1 is perfect overlap
#   step_over_sum   step / (compute alone + comm alone): 1 is none
# and the all-gather and reduce-scatter payload against ZeRO-3's count (2
# and 1 times (N-1)/N param bytes a step: every param chunk gathered for
# forward and for backward, every gradient chunk reduce-scattered once; the
# smallest device budget sends more, as a chunk used twice in a pass, like
# the tied embedding's, is gathered once per use; a chunk whose backward
# uses read no weight, as the embeddings' backward does where they fill a
# chunk, is gathered only for the forward), the replay's payload (the same calls:
# equal to the step's), and the bytes on the wire (every rank's veth tx
# bytes) over the payload.
#
# Usage: bench/zero_netns.sh [--ranks "2 3"] [--rates "1gbit 500mbit 250mbit"]
#                            [--overlap "off on"] [--extra-chunks K] [--steps N]
#                            [--shape bench|tiny] [--log-dir DIR] [--events]
#                            [--chunk ELEMENTS] [--layers N] [--dry-run]
#   The device budget is the plan's smallest plus K chunks (default 2);
#   --prefetch-depth sets runtime.prefetch_depth (moments of lookahead,
#   default 16: a gather must start a chunk's worth of ops ahead).
#   --chunk sets default_chunk_size (the bench shape's default 1048576;
#   at least 524288, its largest tensor; 0 the planner's choice, the size
#   with the least padding). --layers sets the bench shape's
#   depth (default 4; 12 is GPT-2's, where what a step cannot overlap, its
#   first gather, its last reduce-scatter and the turn from forward to
#   backward, is a smaller share of it). --dry-run: the tiny shape, 2 ranks,
#   1 Gbit/s, 3 steps (what bench/run-gpu-benchmarks.sh --dry-run runs).
#   --events writes each rank's chunk event log (DIR/events_<run>.csv.rank<K>)
#   and prints rank 0's link timeline (bench/collective_timeline.py).
#   Lines "netns ranks=... rate=... overlap=... status=ok step_s=... ..."
#   (one per run; the unshaped reference first in each world) and
#   "link unshaped_bits_per_s=..."; a run's logs in DIR.
#   Needs root and network namespaces; without them it says so in one line
#   and exits 3 (the test's skip).
# Environment: PSTAR_BUILD_DIR (build), PYTHON3 (python3).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
pstar="${PSTAR_BUILD_DIR:-$root/build}/bin/pstar"
py="${PYTHON3:-python3}"
ranks_list="2 3" rates="1gbit 500mbit 250mbit" overlaps="off on" steps=6 shape=bench log_dir="" extra=2 depth=16
events=0 chunk="" dry_run=0 layers=4
die() { echo "zero_netns: $*" >&2; exit 2; }
while [ "$#" -gt 0 ]; do
  case "$1" in
    --ranks) ranks_list="$2"; shift ;;
    --rates) rates="$2"; shift ;;
    --overlap) overlaps="$2"; shift ;;
    --extra-chunks) extra="$2"; shift ;;
    --prefetch-depth) depth="$2"; shift ;;
    --steps) steps="$2"; shift ;;
    --shape) shape="$2"; shift ;;
    --log-dir) log_dir="$2"; shift ;;
    --events) events=1 ;;
    --chunk) chunk="$2"; shift ;;
    --layers) layers="$2"; shift ;;
    --dry-run) dry_run=1 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument $1 (try --help)" ;;
  esac
  shift
done
[[ "$steps" =~ ^[0-9]+$ ]] && [ "$steps" -ge 2 ] || die "--steps: a whole number of at least 2, got '$steps'"
[[ "$extra" =~ ^[0-9]+$ ]] && [ "$extra" -le 64 ] || die "--extra-chunks: a whole number from 0 to 64, got '$extra'"
[ -z "$depth" ] || [[ "$depth" =~ ^[0-9]+$ ]] || die "--prefetch-depth: a whole number, got '$depth'"
[[ "$layers" =~ ^[1-9][0-9]?$ ]] || die "--layers: a whole number from 1 to 99, got '$layers'"
[ -z "$chunk" ] || [[ "$chunk" =~ ^(0|[1-9][0-9]*)$ ]] || die "--chunk: a number of elements (0: the planner's choice), got '$chunk'"
for n in $ranks_list; do [[ "$n" =~ ^[2-8]$ ]] || die "--ranks: each from 2 to 8, got '$n'"; done
[ "$dry_run" = 0 ] || { shape=tiny ranks_list=2 rates=1gbit steps=3; }
case "$shape" in bench | tiny) ;; *) die "--shape: bench or tiny, got '$shape'" ;; esac
for o in $overlaps; do case "$o" in on | off) ;; *) die "--overlap: each on or off, got '$o'" ;; esac; done
for r in $rates; do
  [ "$r" = unshaped ] || [[ "$r" =~ ^[1-9][0-9]*(k|m|g)?bit$ ]] || die "--rates: '$r' is not a rate (like 1gbit, 500mbit)"
done
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
    grep -qw "$ns" <<<"$(ip netns list)" && continue
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
  L=2 NH=2 C=64 V=256 T=32 B=2 CHUNK=16384
else
  # Width 256, 4 layers (--layers), vocabulary 2048: 3.7M parameters in 4
  # MiB chunks (10.0M at 12 layers), gathered twice and reduce-scattered
  # once a step: at 1 Gbit/s about 1.1 to 1.2 times the compute of 5 x 128
  # tokens per rank on one core each (at 4 and 12 layers, 2 and 3 ranks),
  # inside the 0.5-2x an overlap measurement needs.
  L=$layers NH=4 C=256 V=2048 T=128 B=5 CHUNK=1048576
fi
[ -z "$chunk" ] || CHUNK=$chunk
job_args() {  # N
  local args=(--set "model={n_layer: $L, n_head: $NH, n_embd: $C, vocab_size: $V, max_seq_len: $T}"
              --set "train={batch_size: $B, seq_len: $T, steps: $steps, log_every: 1, threads: 1}"
              --set "data={source: generated, generated_tokens: 262144}" --set "default_chunk_size=$CHUNK"
              --set "dist.timeout_seconds=120")
  [ -z "$depth" ] || args+=(--set "runtime.prefetch_depth=$depth")
  printf '%s\n' "${args[@]}"
}

run_world() {  # N rate overlap [compute_alone_s] -> one "netns ..." line
  local n=$1 rate=$2 overlap=$3 compute_alone=${4:-} k pids=() rc=0 token args before=() after=() log
  make_world "$n" || die "cannot add rank namespaces for $n ranks"
  shape_links "$n" "$rate" || die "tc cannot shape the links to $rate"
  mapfile -t args < <(job_args "$n")
  # The smallest device budget and --extra-chunks chunks more: room for the
  # gathers ahead (ZeRO-3's prefetch buffer); 0 gathers each param chunk for
  # each use, with no room to gather any ahead.
  local plan min slot
  plan=$("$pstar" plan "${args[@]}" --world-size "$n" --json 2>&1) || [ $? -eq 1 ] || die "pstar plan refused the job: $plan"
  min=$(sed -nE 's/.*"min_device_bytes": ([0-9]+).*/\1/p' <<<"$plan")
  # A slot's bytes from the plan: the chunk as laid out, padded so that
  # every rank's shard is aligned (larger than CHUNK floats at 3 ranks).
  slot=$(sed -nE 's/.*"chunk_bytes": ([0-9]+).*/\1/p' <<<"$plan")
  [ -n "$min" ] && [ -n "$slot" ] || die "pstar plan printed no min_device_bytes or chunk_bytes"
  local budget=$(( min + extra * slot ))
  args+=(--set "runtime.device_memory=$budget" --set "runtime.comm_overlap=$([ "$overlap" = on ] && echo true || echo false)")
  token=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
  for ((k = 0; k < n; ++k)); do before[k]=$(tx_bytes "$k"); done
  local tag="n${n}_${rate}_${overlap}${compute_alone:+_measured}"
  local events_args=()
  [ "$events" = 0 ] || events_args=(--chunk-events "$log_dir/events_${tag}.csv")
  for ((k = 0; k < n; ++k)); do
    log="$log_dir/netns_${tag}_rank$k.log"
    ip netns exec "$(rank_ns "$k")" env PSTAR_STORE_TOKEN="$token" OMP_NUM_THREADS=1 \
      timeout 600 "$pstar" launch --nnodes "$n" --node-rank "$k" --nproc-per-node 1 \
        --master-addr "$(rank_ip 0)" --master-port 29500 -- train "${args[@]}" "${events_args[@]}" --log-format json --comm-alone \
        > "$log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || rc=$?; done
  for ((k = 0; k < n; ++k)); do after[k]=$(tx_bytes "$k"); done
  log="$log_dir/netns_${tag}_rank0.log"
  if [ "$rc" -ne 0 ]; then
    echo "netns ranks=$n rate=$rate overlap=$overlap status=failed rc=$rc log=$log"
    grep -h -m2 'error\|pstar:' "$log_dir"/netns_${tag}_rank*.log | sed 's/^/  /' || true
    return 0
  fi
  local wire=0
  for ((k = 0; k < n; ++k)); do wire=$(( wire + after[k] - before[k] )); done
  # The step-time model (pstar plan --scale) for this run: N nodes of one
  # device at this rate, this device budget's chunk slots (the model plans a
  # GPU, whose activations and workspaces differ from the CPU's: the same
  # slots above its minimum), fp32 as the CPU trains, the compute rate that
  # gives the compute alone (the model's compute term is linear in it),
  # copies and Adam free (the device tier is host memory).
  local model="" scale=() c1 tflops gpu_min
  if [ "$rate" != unshaped ] && [ -n "$compute_alone" ]; then
    # Exit 1: the CPU's budget does not hold the GPU plan, which is expected.
    gpu_min=$({ "$pstar" plan "${args[@]}" --set train.precision=fp32 --set runtime.device=cuda --world-size "$n" \
                  --json || [ $? -eq 1 ]; } | sed -nE 's/.*"min_device_bytes": ([0-9]+).*/\1/p')
    [ -n "$gpu_min" ] || die "pstar plan printed no min_device_bytes for the GPU plan"
    scale=("${args[@]}" --set train.precision=fp32 --set client.mem_tracer.overall_gpu_mem_ratio=1.0 --scale
           --nodes "$n" --gpus-per-node 1 --inter-bw "$(awk -v b="$(rate_bits "$rate")" 'BEGIN { print b / 1e9 }')"
           --pcie-bw 100000 --adam-rate 1e15 --gpu-memory "$(( budget - min + gpu_min ))")
    c1=$("$pstar" plan "${scale[@]}" --tflops 1 | awk -v n="$n" '$1 == n && $2 == n { print $3 }')
    tflops=$(awk -v c1="$c1" -v s="$compute_alone" 'BEGIN { if (c1 > 0 && s > 0) printf "%.6g", c1 / (s * 1e3) }')
    [ -z "$tflops" ] || model=$("$pstar" plan "${scale[@]}" --tflops "$tflops" |
                                 awk -v n="$n" '$1 == n && $2 == n { print $9 / 1e3, $10 / 1e3 }')
  fi
  # The plan's count of the step's payload (pstar plan --payload: the job's
  # chunk traffic run as rank 0 of N), which the step's must equal.
  local planned
  planned=$("$pstar" plan "${args[@]}" --world-size "$n" --payload 2>&1 |
              sed -nE 's/^payload: all_gather_bytes_per_step=([0-9]+) reduce_scatter_bytes_per_step=([0-9]+).*/\1 \2/p')
  "$py" - "$n" "$rate" "$overlap" "$steps" "$wire" "${compute_alone:-}" "$log_dir/netns_${tag}_rank" "$model" \
    "$planned" <<'PY'
import json, statistics, sys
n, rate, overlap, steps, wire = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
compute_alone, prefix, model = sys.argv[6], sys.argv[7], sys.argv[8].split()
planned = sum(int(x) for x in sys.argv[9].split()) if sys.argv[9].strip() else -1
def fields(line):
    return dict(kv.split("=", 1) for kv in line.split()[1:] if "=" in kv)
# Rank 0 prints the run (the loss it prints is every rank's mean); the
# others print only errors, and every rank exited 0 to get here.
text = open("%s0.log" % prefix).read().splitlines()
steps_json = [json.loads(l) for l in text if l.startswith("{") and '"ms_per_step"' in l]
line = lambda tag: next(fields(l) for l in text if l.startswith(tag))
summary, coll, alone = line("summary:"), line("collectives:"), line("comm_alone:")
later = steps_json[1:] or steps_json
med = lambda key: statistics.median(float(s[key]) for s in later)
step, collective, waited = med("ms_per_step") / 1e3, med("collective_s"), med("collective_wait_s")
comm = float(alone["seconds_per_step"])
compute = float(compute_alone) if compute_alone else step - collective
gather, scatter = int(coll["all_gather_bytes_per_step"]), int(coll["reduce_scatter_bytes_per_step"])
payload = sum(int(v) for key, v in coll.items() if key.endswith("_bytes_per_step") and key != "sent_bytes_per_step"
              and not key.startswith("zero3"))
plan_gather = float(coll["zero3_bytes_per_step"]) * 2 / 3
# Every rank sends as much as rank 0 (ring collectives): the wire per rank,
# per step of the run and of the replay after it (the same calls again).
wire_step = wire / (steps + int(alone["repeats"])) / n
hidden = max(0.0, min(1.0, (compute + comm - step) / comm)) if comm > 0 else 0.0
# The model's step: collectives synchronous (overlap off) or under compute (on).
model_s, model_error = "-", "-"
if len(model) == 2:
    predicted = float(model[1] if overlap == "on" else model[0])
    model_s, model_error = "%.4f" % predicted, "%+.3f" % ((predicted - step) / step)
print("netns ranks=%d rate=%s overlap=%s status=ok step_s=%.4f collective_s=%.4f waited_s=%.4f "
      "compute_alone_s=%.4f comm_alone_s=%.4f hidden=%.3f step_over_max=%.3f step_over_sum=%.3f "
      "gather_bytes=%d zero3_gather_bytes=%d scatter_bytes=%d zero3_scatter_bytes=%d "
      "payload_bytes=%d replay_payload_bytes=%d plan_payload_bytes=%d payload_matches_plan=%s "
      "wire_bytes=%d wire_over_payload=%.3f "
      "model_s=%s model_error=%s ranks_ok=yes final_loss=%s log=%s0.log" % (
          n, rate, overlap, step, collective, waited, compute, comm, hidden,
          step / max(compute, comm, 1e-9), step / max(compute + comm, 1e-9),
          gather, plan_gather, scatter, plan_gather / 2, payload, int(alone["payload_bytes_per_step"]), planned,
          "yes" if planned == int(alone["payload_bytes_per_step"]) == gather + scatter else "no", wire_step,
          wire_step / payload if payload > 0 else 0.0, model_s, model_error, summary["final_loss"], prefix))
PY
  if [ "$events" = 1 ]; then
    "$py" "$root/bench/collective_timeline.py" "$log_dir/events_${tag}.csv.rank0" --gaps 3 | sed 's/^/  timeline /'
  fi
}

echo "shape: $shape (layers $L, heads $NH, width $C, vocab $V, seq $T, batch $B per rank, chunk $CHUNK elements); $steps steps; logs in $log_dir"
if ! make_world 2 2>/dev/null || ! shape_links 2 1gbit 2>/dev/null || ! shape_links 2 unshaped; then
  echo "zero_netns: skipped: veth links or tc's tbf cannot be set up in network namespaces here"
  exit 3
fi
link=$(measure_link)
echo "link unshaped_bits_per_s=${link:-0}"
half=$(awk -v l="${link:-0}" 'BEGIN { printf "%.0f", l / 2 }')
for n in $ranks_list; do
  # The reference: unshaped, each collective waited for as it starts. (Its
  # namespaces are made here, not in the subshell, so that cleanup knows them.)
  make_world "$n" || die "cannot add rank namespaces for $n ranks"
  ref=$(run_world "$n" unshaped off)
  echo "$ref"
  compute_alone=$(sed -nE 's/.* compute_alone_s=([0-9.]+) .*/\1/p' <<<"$ref")
  [ -n "$compute_alone" ] || continue
  for rate in $rates; do
    [ "$rate" = unshaped ] && continue
    bits=$(rate_bits "$rate")
    if [ "$bits" -gt "$half" ]; then
      echo "netns ranks=$n rate=$rate status=skipped: above half the unshaped link ($half bits/s)"
      continue
    fi
    for overlap in $overlaps; do run_world "$n" "$rate" "$overlap" "$compute_alone"; done
  done
done

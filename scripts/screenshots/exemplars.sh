#!/usr/bin/env bash
# The book's picture of the way from a dashboard spike to the pause's record,
# taken headless on loopback with real parts:
#   docs/pause-exemplars.png  the pause p99 by reason from a real Prometheus,
#                             exemplars shown: each dot is a slow pause whose
#                             pause_id names its record
# and, for the page's text, target/screenshots/exemplars/record.txt: `gostw
# pauses` on that agent, the records the dots name (laggard, caller, breakdown).
# The workload is the kernel tests' spinner (a goroutine that cannot be
# preempted, GODEBUG=asyncpreemptoff=1, a GC every 40 ms) traced by
# `gostw agent` with its defaults; Prometheus (Debian's) keeps exemplars.
#   sudo -E scripts/screenshots/exemplars.sh [GO_VERSION]   # default 1.27.3
# Needs root (the agent), cargo xtask setup (Go, the release gostw is built
# here), Debian's prometheus and chromium.
set -euo pipefail
cd "$(dirname "$0")/../.."
version=${1:-1.27.3}
go=${GO:-${GOSTW_CACHE:-$HOME/.cache/gostw}/go/$version/go/bin/go}
work=target/screenshots/exemplars
agent_port=18441
prom_port=18443

[ "$(id -u)" = 0 ] || { echo "the agent loads eBPF programs: run as root" >&2; exit 1; }
[ -x "$go" ] || { echo "$go is missing: run \`cargo xtask setup\` or set GO" >&2; exit 1; }
for c in prometheus chromium; do
  command -v $c >/dev/null || { echo "$c is missing: apt-get install $c" >&2; exit 1; }
done
rm -rf "$work"; mkdir -p "$work" docs
cargo build --release --quiet --package tracer --bin gostw
(cd scripts/workloads/stw && "$go" build -o "$(pwd)/../../../$work/stw" .)
gostw=target/release/gostw
stw=$(realpath "$work/stw")

pids=()
cleanup() { for p in "${pids[@]}"; do kill -- "-$p" 2>/dev/null || true; done; }
trap cleanup EXIT
wait_http() {
  for _ in $(seq 150); do curl -sf -o /dev/null "$1" && return 0; sleep 0.2; done
  echo "nothing answered at $1" >&2; return 1
}

setsid "$gostw" agent --listen "127.0.0.1:$agent_port" --match "^$stw\$" \
  --pause-log "$work/pauses.jsonl" >"$work/agent.log" 2>&1 &
pids+=($!)
wait_http "http://127.0.0.1:$agent_port/healthz"

cat >"$work/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: gostw
    static_configs:
      - targets: ['127.0.0.1:$agent_port']
EOF
setsid prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/tsdb" \
  --web.listen-address="127.0.0.1:$prom_port" --enable-feature=exemplar-storage \
  >"$work/prometheus.log" 2>&1 &
pids+=($!)
wait_http "http://127.0.0.1:$prom_port/-/ready"

# Two minutes of pauses, each GC waiting for the spinner's 20 ms chunks.
setsid env GODEBUG=asyncpreemptoff=1 GOMAXPROCS=2 "$stw" -spinners 1 -spin-chunk 20ms \
  -gc 1 -readmemstats 1 -gomaxprocs 0 -alloc-mb 0 -duration 120s -interval 40ms \
  >"$work/stw.log" 2>&1 &
pids+=($!)
sleep 120

# Debian's Prometheus has only its classic UI (no exemplars drawn) and these
# hosts have no Grafana: the panel's lines and dots are drawn from the same
# API by exemplars_chart.py, with the record behind the highest dot.
end=$(date +%s)
python3 scripts/screenshots/exemplars_chart.py "http://127.0.0.1:$prom_port" "$((end - 130))" "$end" \
  "$work/pauses.jsonl" "$work/chart.html"
chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --disable-background-networking \
  --disable-component-update --no-first-run --user-data-dir="$(mktemp -d)" \
  --window-size=1400,620 --screenshot=docs/pause-exemplars.png "file://$(realpath "$work/chart.html")" \
  2>/dev/null

# The records the exemplars name: Prometheus's own list of them, then gostw's.
curl -sf "http://127.0.0.1:$prom_port/api/v1/query_exemplars?query=gostw_pause_duration_seconds_bucket&start=$(($(date +%s) - 300))&end=$(date +%s)" \
  >"$work/exemplars.json"
ids=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1]))["data"]; print(len({e["labels"]["pause_id"] for s in d for e in s["exemplars"]}))' "$work/exemplars.json")
{
  echo "\$ gostw pauses --agent 127.0.0.1:$agent_port --slow-pause 10ms --limit 3"
  "$gostw" pauses --agent "127.0.0.1:$agent_port" --slow-pause 10ms --limit 3
} >"$work/record.txt"
echo "exemplars kept by Prometheus: $ids distinct pause ids"
ls -l docs/pause-exemplars.png "$work/record.txt"

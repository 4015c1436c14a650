#!/usr/bin/env bash
# The book's pictures (docs/*.png) of gostw's output formats, taken headless, on loopback:
#   docs/pprof-faults-in-pauses.png  `go tool pprof -http` (flame graph) on the
#                                    page-out scenario's fault profile, focused
#                                    on the faults inside pauses
#   docs/timeline-pause.png          the page-out scenario's timeline in
#                                    Chromium's trace viewer (DevTools
#                                    Performance panel), one GC
# Their inputs are what the page-out scenario's kernel test writes
# (target/formats-test/pageout-GO.{faults.pb.gz,timeline.json}):
#   sudo -E cargo xtask scenario pageout
#   scripts/screenshots/take.sh [GO_VERSION]     # default 1.27.3
# Needs Debian's chromium and node/npm (puppeteer-core goes to target/screenshots).
set -euo pipefail
cd "$(dirname "$0")/../.."
version=${1:-1.27.3}
go=${GO:-${GOSTW_CACHE:-$HOME/.cache/gostw}/go/$version/go/bin/go}
profile=target/formats-test/pageout-$version.faults.pb.gz
timeline=target/formats-test/pageout-$version.timeline.json
work=target/screenshots
pprof_port=18431
devtools_port=18433

for f in "$profile" "$timeline"; do
  [ -f "$f" ] || { echo "$f is missing: run \`sudo -E cargo xtask scenario pageout\` first" >&2; exit 1; }
done
[ -x "$go" ] || { echo "$go is missing: run \`cargo xtask setup\` or set GO" >&2; exit 1; }
command -v chromium >/dev/null || { echo "chromium is missing: apt-get install chromium" >&2; exit 1; }
mkdir -p "$work" docs
if [ ! -d "$work/node_modules/puppeteer-core" ]; then
  npm install --prefix "$work" --no-save --no-audit --no-fund puppeteer-core@25 >/dev/null
fi
cp scripts/screenshots/devtools-trace.mjs "$work/"

pids=()
cleanup() { for p in "${pids[@]}"; do kill -- "-$p" 2>/dev/null || true; done; }
trap cleanup EXIT
wait_http() {
  for _ in $(seq 100); do curl -sf -o /dev/null "$1" && return 0; sleep 0.2; done
  echo "nothing answered at $1" >&2; return 1
}
shot() { chromium --headless --no-sandbox --disable-gpu --hide-scrollbars "$@" 2>/dev/null; }

# pprof's web UI, in its own process group so that it ends with the script.
setsid env PPROF_TMPDIR="$work" "$go" tool pprof -http="127.0.0.1:$pprof_port" -no_browser "$profile" \
  >"$work/pprof.log" 2>&1 &
pids+=($!)
wait_http "http://127.0.0.1:$pprof_port/ui/"
shot --window-size=1400,620 --screenshot=docs/pprof-faults-in-pauses.png \
  "http://127.0.0.1:$pprof_port/ui/flamegraph?si=major_faults&tf=in_pause%3Dtrue"

# Chromium's DevTools front end, as its remote-debugging server serves it.
setsid chromium --headless --no-sandbox --disable-gpu --remote-debugging-address=127.0.0.1 \
  --remote-debugging-port=$devtools_port --user-data-dir="$(mktemp -d)" about:blank \
  >"$work/chromium.log" 2>&1 &
pids+=($!)
wait_http "http://127.0.0.1:$devtools_port/json/version"
node "$work/devtools-trace.mjs" "http://127.0.0.1:$devtools_port/devtools/devtools_app.html" \
  "$timeline" docs/timeline-pause.png
ls -l docs/pprof-faults-in-pauses.png docs/timeline-pause.png

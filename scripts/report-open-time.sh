#!/usr/bin/env bash
# How long headless Chromium takes to open a report.html (or a compare page) from disk: the
# page is framed by a wrapper that times it from its start to the frame's load event (parse,
# images decoded from data: URIs, inline scripts run), so the browser's own start-up is not
# counted. Also prints the wall time of the whole `chromium --dump-dom` for reference.
# Three tries each; docs/report.md has the figures.
#
#     scripts/report-open-time.sh lockstep-runs/<run>/report.html
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: $0 FILE.html" >&2; exit 2; }
command -v chromium >/dev/null || { echo "chromium is not installed: run scripts/setup.sh" >&2; exit 2; }
page=$(readlink -f "$1")
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cat > "$dir/frame.html" <<HTML
<html><head><title>not loaded</title></head><body><script>var t0 = performance.now();</script>
<iframe src="file://$page" width="1200" height="3000"
 onload="document.title = 'loaded in ' + (performance.now() - t0).toFixed(0) + ' ms'"></iframe>
</body></html>
HTML
echo "$page: $(stat -c %s "$page") bytes"
for _ in 1 2 3; do
  start=$(date +%s.%N)
  title=$(chromium --headless --no-sandbox --disable-gpu --allow-file-access-from-files \
    --user-data-dir="$dir/profile" --dump-dom "file://$dir/frame.html" 2>/dev/null \
    | grep -o '<title>[^<]*' | sed 's/<title>//')
  end=$(date +%s.%N)
  printf '%s (chromium start to exit %.2f s)\n' "$title" "$(echo "$end - $start" | bc)"
done

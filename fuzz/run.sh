#!/usr/bin/env bash
# Runs every fuzz target (or those named) for SECONDS each with libFuzzer on the stable toolchain
# (cargo-fuzz with `-s none`: coverage instrumentation through `-C passes=sancov-module`, no
# sanitizer, so no nightly), and prints executions, corpus size and coverage per target.
#   fuzz/run.sh SECONDS [TARGET...]
# New inputs go to fuzz/work/<target>/ (git-ignored), the committed seeds in fuzz/corpus/<target>/
# are read only; a crash leaves its input in fuzz/artifacts/<target>/ and fails the run.
set -uo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=${1:?usage: fuzz/run.sh SECONDS [TARGET...]}
shift
CARGO_FUZZ=${CARGO_FUZZ:-cargo-fuzz}
TARGETS=("$@")
if [ ${#TARGETS[@]} -eq 0 ]; then
  mapfile -t TARGETS < <(sed -n 's/^name = "\(.*\)"/\1/p' fuzz/Cargo.toml | tail -n +2)
fi
"$CARGO_FUZZ" fuzz build -s none --fuzz-dir fuzz >/dev/null || { echo "fuzz build failed"; exit 1; }
dict_for() {
  case "$1" in
    prom) echo "-dict=fuzz/dict/prom.dict" ;;
    request_body|body_differential|config|load_table|admin_clusters|inline_prefill|usage) echo "-dict=fuzz/dict/json.dict" ;;
  esac
}
failed=0
printf '%-16s %12s %10s %8s %6s %s\n' target executions exec/s corpus cov result
for t in "${TARGETS[@]}"; do
  mkdir -p "fuzz/work/$t" "fuzz/artifacts/$t"
  log=fuzz/work/$t.log
  # shellcheck disable=SC2046
  "$CARGO_FUZZ" fuzz run -s none --fuzz-dir fuzz "$t" "fuzz/work/$t" "fuzz/corpus/$t" -- \
    -max_total_time="$SECONDS_EACH" -max_len=65536 -rss_limit_mb=2048 -timeout=10 \
    -print_final_stats=1 $(dict_for "$t") >"$log" 2>&1
  rc=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n1)
  speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n1)
  last=$(grep -E '^#[0-9]+' "$log" | tail -n1)
  corp=$(echo "$last" | sed -n 's/.*corp: \([0-9]*\).*/\1/p')
  cov=$(echo "$last" | sed -n 's/.*cov: \([0-9]*\).*/\1/p')
  result=ok
  if [ $rc -ne 0 ]; then
    result="CRASH (rc $rc): $(ls -t fuzz/artifacts/$t | head -n1) — see $log"
    failed=1
  fi
  printf '%-16s %12s %10s %8s %6s %s\n' "$t" "${runs:-?}" "${speed:-?}" "${corp:-?}" "${cov:-?}" "$result"
done
exit $failed

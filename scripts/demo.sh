#!/usr/bin/env bash
# make demo: the product end to end on temp data dirs, in two parts.
#   part 1: `openclaw demo` — a worker session on the built-in local box with the scripted model:
#           git workspace, dispatch, a turn that edits and commits, pull-back, branch and diff, teardown.
#   part 2: leasing through a lease CLI (examples/lease-dir): a second gateway refused, a lease watched to
#           ready, kill -9 of the gateway mid-provision (the lease is adopted), the orphan sweep, destroy.
# Each stage prints what happened and how long it took, both parts in the same style ("== N. title
# [+elapsed]", "-- ok: what happened (time)") and each ends with a summary table of the same columns;
# the script exits 0 only if every stage happened. Both parts make their temp dirs under one $TMPDIR of
# the demo's own, which must be empty at the end (nothing left behind).
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=$PWD/bin/openclaw
DEMO_TMP=$(mktemp -d -t openclaw-demo-tmp.XXXXXX)
export TMPDIR=$DEMO_TMP
echo "######## part 1: a worker session end to end (openclaw demo)"
"$BIN" demo --script examples/demo/script.json
echo
echo "######## part 2: leasing through a lease CLI — adoption after kill -9, orphan sweep, destroy"
LEASE=$PWD/examples/lease-dir/lease-dir
WORK=$(mktemp -d -p "$DEMO_TMP" openclaw-demo.XXXXXX)
DATA=$WORK/data
export LEASE_DIR=$WORK/leases
export OPENCLAW_DATA_DIR=$DATA
PORT=$(( 20000 + RANDOM % 20000 ))
export OPENCLAW_GATEWAY=127.0.0.1:$PORT
GW_PID=

cleanup() {
  local rc=$?
  if [ -n "$GW_PID" ] && kill -0 "$GW_PID" 2>/dev/null; then kill "$GW_PID"; wait "$GW_PID" 2>/dev/null || true; fi
  # local boxes and their workers are detached processes (they outlive a gateway like a real machine): stop ours
  for pid in $(box_pids) $(worker_pids); do kill "$pid" 2>/dev/null || true; done
  if [ $rc -ne 0 ]; then echo; echo "demo FAILED (exit $rc); kept $DEMO_TMP; gateway log: $WORK/gateway.log"; tail -20 "$WORK/gateway.log" 2>/dev/null || true
  else rm -rf "$WORK"; rmdir "$DEMO_TMP" 2>/dev/null || true; fi
}
trap cleanup EXIT

# pids of the boxes (built-in profile and lease-dir) and workers of this demo still running
box_pids() {
  for st in "$DATA"/boxes/*/.localbox/state.json "$LEASE_DIR"/*.box/.localbox/state.json; do
    [ -f "$st" ] || continue
    pid=$(sed -n 's/.*"pid": *\([0-9]*\).*/\1/p' "$st")
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && echo "$pid"
  done
  true
}
worker_pids() {
  for pf in "$DATA"/boxes/*/.openclaw-worker/state/*/worker.pid "$LEASE_DIR"/*.box/.openclaw-worker/state/*/worker.pid; do
    [ -f "$pf" ] || continue
    pid=$(cat "$pf")
    [ -n "$pid" ] && grep -qa worker "/proc/$pid/cmdline" 2>/dev/null && echo "$pid"
  done
  true
}

# Stage times are printed as openclaw demo prints them (Go's time.Duration: 450ms, 1.23s, 1m5.4s).
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
fmt_dur() {
  awk -v ms="$1" 'BEGIN { if (ms < 1000) { printf "%dms", ms; exit }
    cs = int((ms + 5) / 10); s = cs / 100; out = ""
    if (s >= 60) { m = int(s / 60); s -= m * 60; out = m "m" }
    str = sprintf("%.2f", s); sub(/0+$/, "", str); sub(/\.$/, "", str); printf "%s%ss", out, str }'
}
T0=$(now_ms)
N=0; STAGE_T=; TITLE=; SUMMARY=$WORK/summary.tsv
# stage TITLE starts a stage; done_stage WHAT ends it with what happened.
stage() { N=$((N + 1)); TITLE=$*; STAGE_T=$(now_ms); echo; echo "== $N. $TITLE  [+$(fmt_dur $((STAGE_T - T0)))]"; }
done_stage() {
  local d w; d=$(fmt_dur $(($(now_ms) - STAGE_T))); w=$*
  echo "-- ok: $w ($d)"
  [ ${#w} -le 90 ] || w="${w:0:89}…" # cut as openclaw demo cuts its column
  printf '%s\t%s\t%s\t%s\t%s\n' "$N" "$TITLE" ok "$d" "$w" >>"$SUMMARY"
}
# summary prints the table openclaw demo ends with: #, STAGE, RESULT, TIME, WHAT HAPPENED and the total.
summary() {
  echo; echo "== summary"
  { printf '#\tSTAGE\tRESULT\tTIME\tWHAT HAPPENED\n'; cat "$SUMMARY"; printf '\ttotal\t\t%s\t\n' "$(fmt_dur $(($(now_ms) - T0)))"; } |
    awk -F'\t' '{ for (i = 1; i <= NF; i++) { c[NR, i] = $i; if (i < NF && length($i) > w[i]) w[i] = length($i) } n[NR] = NF }
      END { for (r = 1; r <= NR; r++) { line = ""; for (i = 1; i <= n[r]; i++) line = line (i < n[r] ? sprintf("%-" (w[i] + 2) "s", c[r, i]) : c[r, i]); sub(/ +$/, "", line); print line } }'
}
fail() {
  local d; d=$(fmt_dur $(($(now_ms) - STAGE_T)))
  echo "-- FAILED: $* ($d)" >&2
  printf '%s\t%s\t%s\t%s\t%s\n' "$N" "$TITLE" FAILED "$d" "$*" >>"$SUMMARY"
  summary
  exit 1
}

stage "start a gateway on a temp data dir ($DATA)"
cat > "$WORK/gateway.yaml" <<YAML
profiles:
  - id: demo
    provider: command
    hygiene: {metadataRoute: warn, dockerSocket: warn}   # the demo's boxes share this machine's network
    settings:
      provision: [$LEASE, warmup, --lease-id, "{leaseId}", --label, "openclaw.gateway={gatewayId}", --label, "openclaw.environment={envId}", --delay, 300ms]
      inspect: [$LEASE, inspect, --id, "{leaseId}", --json]
      destroy: [$LEASE, stop, "{leaseId}"]
      renew: [$LEASE, heartbeat, --id, "{leaseId}"]
      list: [$LEASE, list, --json]
      timeout: 30s
      pollInterval: 100ms
      env: {LEASE_DIR: $LEASE_DIR, LEASE_DIR_LOCALBOX: $BIN, LEASE_DIR_STOP_FAILS: "2"}
    lifetime: {idleTimeout: 30m, ttl: 24h}
    maxEnvironments: 4
YAML
"$BIN" gateway --config "$WORK/gateway.yaml" --listen "$OPENCLAW_GATEWAY" >"$WORK/gateway.log" 2>&1 &
GW_PID=$!
for _ in $(seq 100); do curl -fsS "http://$OPENCLAW_GATEWAY/readyz" >/dev/null 2>&1 && break; sleep 0.1; done
curl -fsS "http://$OPENCLAW_GATEWAY/readyz" >/dev/null || fail "gateway not ready"
echo "gateway ready at $OPENCLAW_GATEWAY (token in $DATA/gateway.token, mode $(stat -c %a "$DATA/gateway.token"))"
"$BIN" profile list

done_stage "gateway ready at $OPENCLAW_GATEWAY, token mode $(stat -c %a "$DATA/gateway.token")"

stage "a second gateway on the same data dir refuses to start"
if "$BIN" gateway --listen 127.0.0.1:0 2>"$WORK/second.err"; then fail "second gateway started"; fi
cat "$WORK/second.err"

done_stage "refused: $(head -1 "$WORK/second.err")"

stage "lease a machine through a lease CLI (examples/lease-dir, backed by a local box), watch it become ready"
echo "(provision → pinned SSH → bundle upload → hygiene checks → reverse tunnel → worker launch → admission)"
ENV=$("$BIN" env create --profile demo --wait)
STATE=$("$BIN" env show "$ENV" -o json | sed -n 's/^  "state": "\(.*\)",$/\1/p')
[ "$STATE" = ready ] || fail "environment $ENV is $STATE, expected ready"
"$BIN" env show "$ENV"

done_stage "environment $ENV ready"

stage "kill -9 the gateway mid-provision, restart it: the lease is adopted, not leased twice"
"$BIN" profile add slow --provider command --hygiene metadataRoute=warn --hygiene dockerSocket=warn --settings "$(cat <<JSON
{"provision":["$LEASE","warmup","--lease-id","{leaseId}","--label","openclaw.gateway={gatewayId}","--label","openclaw.environment={envId}","--delay","1500ms"],
 "inspect":["$LEASE","inspect","--id","{leaseId}","--json"],"destroy":["$LEASE","stop","{leaseId}"],"list":["$LEASE","list","--json"],
 "pollInterval":"100ms","env":{"LEASE_DIR":"$LEASE_DIR","LEASE_DIR_LOCALBOX":"$BIN"}}
JSON
)"
SLOW=$("$BIN" env create --profile slow -o json | sed -n 's/^  "id": "\(.*\)",$/\1/p')
for _ in $(seq 100); do grep -q warmup "$LEASE_DIR/calls.log" 2>/dev/null && [ "$(grep -c warmup "$LEASE_DIR/calls.log")" -ge 2 ] && break; sleep 0.05; done
kill -9 "$GW_PID"; wait "$GW_PID" 2>/dev/null || true
echo "gateway killed while $SLOW was provisioning"
"$BIN" gateway --config "$WORK/gateway.yaml" --listen "$OPENCLAW_GATEWAY" >>"$WORK/gateway.log" 2>&1 &
GW_PID=$!
for _ in $(seq 100); do curl -fsS "http://$OPENCLAW_GATEWAY/readyz" >/dev/null 2>&1 && break; sleep 0.1; done
for _ in $(seq 300); do "$BIN" env show "$SLOW" -o json | grep -q '"state": "ready"' && break; sleep 0.1; done
"$BIN" env show "$SLOW" -o json | grep -q '"state": "ready"' || fail "$SLOW did not become ready after the restart"
"$BIN" env events "$SLOW"
SLOW_LEASE=$("$BIN" env show "$SLOW" -o json | sed -n 's/^  "leaseId": "\(.*\)",$/\1/p')
CALLS=$(grep -c "\"$SLOW_LEASE\"" "$LEASE_DIR/calls.log")
echo "warmup was called $CALLS times, every time with lease id $SLOW_LEASE"
[ "$CALLS" -ge 2 ] || fail "restarted gateway did not resume provisioning"

done_stage "$SLOW adopted after kill -9: warmup called $CALLS times with lease id $SLOW_LEASE"

stage "an orphan lease labelled with our gateway id is found and destroyed by the sweep"
GWID=$(curl -fsS -H "Authorization: Bearer $(cat "$DATA/gateway.token")" "http://$OPENCLAW_GATEWAY/api/v1/gateway" | sed 's/.*"id":"\([^"]*\)".*/\1/')
LEASE_DIR=$LEASE_DIR LEASE_DIR_LOCALBOX=$BIN "$LEASE" warmup --lease-id ocl_leaked --label "openclaw.gateway=$GWID" >/dev/null
# the lease CLI's stop fails twice (LEASE_DIR_STOP_FAILS=2): a failure is reported and retried, never taken as done
for i in 1 2 3 4; do
  "$BIN" env sweep | tee "$WORK/sweep.txt"
  grep -q "destroyed ocl_leaked" "$WORK/sweep.txt" && break
done
grep -q "destroyed ocl_leaked" "$WORK/sweep.txt" || fail "sweep did not destroy the orphan"

done_stage "orphan lease ocl_leaked destroyed by the sweep (after $i sweep(s); the lease CLI's stop failed twice)"

stage "destroy returns only on proof of teardown"
"$BIN" env destroy "$ENV"
"$BIN" env destroy "$SLOW"
"$BIN" env list --all
LEFT=$("$LEASE" list --json | { grep -o '"state":"ready"' || true; } | wc -l)
[ "$LEFT" = 0 ] || fail "$LEFT leases left behind"
LEFT=$(box_pids; worker_pids)
[ -z "$LEFT" ] || fail "box or worker processes left behind: $LEFT"
echo "no lease, box or worker process left"

done_stage "$ENV and $SLOW destroyed; no lease, box or worker process left"

stage "audit trail"
curl -fsS -H "Authorization: Bearer $(cat "$DATA/gateway.token")" "http://$OPENCLAW_GATEWAY/api/v1/audit" | tr '{' '\n' | { grep -o '"kind":"[^"]*"' || true; } | sort | uniq -c

done_stage "$(curl -fsS -H "Authorization: Bearer $(cat "$DATA/gateway.token")" "http://$OPENCLAW_GATEWAY/api/v1/audit" | grep -o '"kind":' | wc -l) audit rows"

stage "stop the gateway; no temp dir left behind"
kill "$GW_PID"; wait "$GW_PID" 2>/dev/null || true
GW_PID=
cp "$SUMMARY" "$DEMO_TMP.summary"
rm -rf "$WORK"
SUMMARY=$DEMO_TMP.summary
LEFT=$(find "$DEMO_TMP" -mindepth 1 -maxdepth 1)
[ -z "$LEFT" ] || fail "temp dirs left behind in $DEMO_TMP (both parts' \$TMPDIR): $LEFT"
rmdir "$DEMO_TMP"
done_stage "gateway stopped; $DEMO_TMP (both parts' \$TMPDIR) empty and removed"
summary
rm -f "$SUMMARY"
echo
echo "demo passed: every stage happened; no machine, box, gateway or temp dir left behind"

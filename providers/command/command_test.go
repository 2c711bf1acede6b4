package command

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/tunnel/tunneltest"
	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
	"github.com/openclaw/cloudworkers/providers"
)

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// profile builds a profile whose settings are s with the helper wired in through settings.env.
func profile(t *testing.T, s map[string]any, env map[string]string) providers.Profile {
	t.Helper()
	// GORACE: a race-enabled helper otherwise sleeps a second at exit.
	e := map[string]string{"LEASE_CLI_HELPER": "1", "GORACE": "atexit_sleep_ms=0"}
	for k, v := range env {
		e[k] = v
	}
	s["env"] = e
	if _, ok := s["pollInterval"]; !ok {
		s["pollInterval"] = "10ms"
	}
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	p := providers.Profile{ID: "p1", Provider: "command", Settings: b}
	p.SetDefaults()
	return p
}

func TestProvisionWaitsForReady(t *testing.T) {
	ctx := testCtx(t)
	exe, dir := helperExe(t), t.TempDir()
	log := filepath.Join(dir, "argv.log")
	pwned := filepath.Join(dir, "pwned")
	hk := tunneltest.HostKey(t)
	prof := profile(t, map[string]any{
		"provision": []string{exe, "record", log, "warmup", "--lease-id", "{leaseId}",
			"--label", "openclaw.gateway={gatewayId}", "env={envId}", "{opId}", "{class}", "{ttl}/{idleTimeout}",
			"$(touch " + pwned + ")", "; touch " + pwned, "`touch " + pwned + "`"},
		"inspect":       []string{exe, "inspect", dir, "{leaseId}"},
		"destroy":       []string{exe, "record", log, "stop", "{leaseId}"},
		"class":         "cx22",
		"leaseIdPrefix": "tst_",
	}, map[string]string{"HELPER_READY_AFTER": "3", "HELPER_HOSTKEY": hk})
	prof.Lifetime = providers.Lifetime{TTL: providers.Duration(24 * time.Hour), IdleTimeout: providers.Duration(90 * time.Minute)}

	cfg := testConfig(t)
	p := New(cfg)
	req := providers.ProvisionRequest{EnvironmentID: "env1", GatewayID: "gw1"}
	lease, err := p.Provision(ctx, prof, "op-1", req)
	if err != nil {
		t.Fatal(err)
	}
	wantID := LeaseIDFor("tst_", "op-1")
	if got := p.LeaseID(prof, "op-1"); got != wantID {
		t.Fatalf("LeaseID = %q, want %q", got, wantID)
	}
	if lease.ID != wantID || lease.SSHHost != "127.0.0.1" || lease.SSHPort != 2222 || lease.SSHUser != "box" {
		t.Fatalf("lease = %+v", lease)
	}
	if want := filepath.Join(cfg.WorkRoot, prof.ID, "keys/id_ed25519"); lease.SSHKeyPath != want {
		t.Fatalf("SSHKeyPath = %q, want %q (relative to the CLI's working dir)", lease.SSHKeyPath, want)
	}
	if !slices.Equal(lease.HostKeys, []string{hk}) {
		t.Fatalf("HostKeys = %q", lease.HostKeys)
	}
	if !lease.ExpiresAt.Equal(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)) || lease.Labels["openclaw.gateway"] != "gw1" {
		t.Fatalf("lease = %+v", lease)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, wantID+".count")); string(b) != "3" {
		t.Fatalf("inspect ran %s times, want 3 (poll until ready)", b)
	}

	// The same operation again re-sends the same lease id.
	if _, err := p.Provision(ctx, prof, "op-1", req); err != nil {
		t.Fatal(err)
	}
	calls := readLines[[]string](t, log)
	want := []string{"warmup", "--lease-id", wantID, "--label", "openclaw.gateway=gw1", "env=env1", "op-1", "cx22", "24h/1h30m",
		"$(touch " + pwned + ")", "; touch " + pwned, "`touch " + pwned + "`"}
	if len(calls) != 2 || !slices.Equal(calls[0], want) || !slices.Equal(calls[1], want) {
		t.Fatalf("argv = %q\nwant twice %q", calls, want)
	}
	if _, err := os.Stat(pwned); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("an argument was evaluated by a shell: %v", err)
	}

	// The gateway's lease id wins when given.
	req.LeaseID = "tst_given"
	lease, err = p.Provision(ctx, prof, "op-2", req)
	if err != nil || lease.ID != "tst_given" {
		t.Fatalf("lease %q, err %v", lease.ID, err)
	}
}

func TestProvisionErrors(t *testing.T) {
	exe, dir := helperExe(t), t.TempDir()
	hk := tunneltest.HostKey(t)
	ok := []string{exe, "print", ""}
	for _, tc := range []struct {
		name      string
		provision []string
		inspect   []string
		env       map[string]string
		extra     map[string]any
		want      string
	}{
		{
			name:      "non-zero exit carries the CLI's message",
			provision: []string{exe, "fail", "3", "capacity\x1b[0m exhausted\n"},
			want:      "lease CLI provision exited 3: capacity[0m exhausted",
		},
		{
			name:      "malformed inspect JSON",
			provision: ok,
			inspect:   []string{exe, "print", `{"id": "x", "state": `},
			want:      `lease CLI inspect printed malformed JSON`,
		},
		{
			name:      "ready lease without host key",
			provision: ok,
			inspect:   []string{exe, "inspect", dir, "{leaseId}"},
			want:      "refusing to connect unpinned",
		},
		{
			name:      "unparseable host key",
			provision: ok,
			inspect:   []string{exe, "inspect", dir, "{leaseId}"},
			env:       map[string]string{"HELPER_HOSTKEY": "ssh-ed25519 notbase64!"},
			want:      "unparseable host key",
		},
		{
			name:      "never ready",
			provision: ok,
			inspect:   []string{exe, "inspect", dir, "{leaseId}"},
			env:       map[string]string{"HELPER_READY_AFTER": "1000000", "HELPER_HOSTKEY": hk},
			extra:     map[string]any{"readyTimeout": "50ms"},
			want:      `not ready after 50ms (last state "starting")`,
		},
		{
			name:      "gone while waiting",
			provision: ok,
			inspect:   []string{exe, "fail", "1", "Error: no such lease {leaseId}"},
			want:      "lease gone",
		},
		{
			name:      "inspect reports another lease",
			provision: ok,
			inspect:   []string{exe, "print", `{"id":"someone-else","ready":true}`},
			want:      `reported lease "someone-else"`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inspect := tc.inspect
			if inspect == nil {
				inspect = ok
			}
			s := map[string]any{"provision": tc.provision, "inspect": inspect, "destroy": ok}
			for k, v := range tc.extra {
				s[k] = v
			}
			_, err := New(testConfig(t)).Provision(testCtx(t), profile(t, s, tc.env), "op-"+tc.name, providers.ProvisionRequest{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestErrorMessageIsBounded(t *testing.T) {
	exe := helperExe(t)
	ok := []string{exe, "print", ""}
	prof := profile(t, map[string]any{"provision": []string{exe, "fail", "1", strings.Repeat("x", 10000)}, "inspect": ok, "destroy": ok}, nil)
	_, err := New(testConfig(t)).Provision(testCtx(t), prof, "op", providers.ProvisionRequest{})
	var ce *CLIError
	if !errors.As(err, &ce) || ce.ExitCode != 1 || ce.Command != "provision" {
		t.Fatalf("err = %#v", err)
	}
	if len(ce.Message) > maxMessage+len("…") || !strings.HasSuffix(ce.Message, "…") {
		t.Fatalf("message is %d bytes, want at most %d and marked truncated", len(ce.Message), maxMessage)
	}
}

func TestTimeoutKillsProcessGroup(t *testing.T) {
	exe, dir := helperExe(t), t.TempDir()
	pidFile := filepath.Join(dir, "child.pid")
	ok := []string{exe, "print", ""}
	prof := profile(t, map[string]any{
		"provision": []string{exe, "hang", pidFile}, "inspect": ok, "destroy": ok, "timeout": "500ms",
	}, nil)
	_, err := New(testConfig(t)).Provision(testCtx(t), prof, "op", providers.ProvisionRequest{})
	if err == nil || !strings.Contains(err.Error(), "lease CLI provision timed out after 500ms") {
		t.Fatalf("err = %v", err)
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(string(b))
	deadline := time.Now().Add(10 * time.Second)
	for testenv.Alive(pid) {
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("grandchild %d survived the timeout", pid)
		}
		time.Sleep(10 * time.Millisecond) // polling a condition with a deadline
	}
}

// TestExitedCommandLeavesNoProcess: a lease CLI that exits 0 but left a helper running in its
// process group does not leave it behind: the group is killed after Wait too.
func TestExitedCommandLeavesNoProcess(t *testing.T) {
	exe, dir := helperExe(t), t.TempDir()
	pidFile := filepath.Join(dir, "child.pid")
	ok := []string{exe, "print", ""}
	prof := profile(t, map[string]any{"provision": ok, "inspect": ok, "destroy": []string{exe, "detach", pidFile}}, nil)
	if err := New(testConfig(t)).Destroy(testCtx(t), prof, providers.Lease{ID: "l1"}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(string(b))
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	deadline := time.Now().Add(10 * time.Second)
	for testenv.Alive(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("helper %d of a lease CLI that exited survived it", pid)
		}
		time.Sleep(10 * time.Millisecond) // polling a condition with a deadline
	}
}

func TestInspectGoneNeedsProof(t *testing.T) {
	exe := helperExe(t)
	ok := []string{exe, "print", ""}
	for _, tc := range []struct {
		name     string
		inspect  []string
		extra    map[string]any
		wantGone bool
		wantErr  string
	}{
		{name: "gone state", inspect: []string{exe, "print", `{"id":"l1","state":"released"}`}, wantGone: true},
		{name: "custom gone state", inspect: []string{exe, "print", `{"id":"l1","state":"reaped"}`},
			extra: map[string]any{"goneStates": []string{"reaped"}}, wantGone: true},
		{name: "not found output", inspect: []string{exe, "fail", "1", "error: lease l1 not found"}, wantGone: true},
		{name: "custom not found pattern", inspect: []string{exe, "fail", "4", "E404 l1"},
			extra: map[string]any{"notFoundPattern": "^E404 "}, wantGone: true},
		{name: "generic failure is not proof", inspect: []string{exe, "fail", "1", "connection refused"},
			wantErr: "lease CLI inspect exited 1: connection refused"},
		{name: "not found text on success is not proof", inspect: []string{exe, "print", `{"id":"l1","state":"not found"}`}},
		{name: "garbage is not proof", inspect: []string{exe, "print", "lease not found<html>"}, wantErr: "malformed JSON"},
		{name: "timeout is not proof", inspect: []string{exe, "hang", filepath.Join(t.TempDir(), "pid")},
			extra: map[string]any{"timeout": "200ms"}, wantErr: "timed out"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := map[string]any{"provision": ok, "inspect": tc.inspect, "destroy": ok}
			for k, v := range tc.extra {
				s[k] = v
			}
			st, err := New(testConfig(t)).Inspect(testCtx(t), profile(t, s, nil), providers.Lease{ID: "l1"})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || st.Gone {
					t.Fatalf("status %+v, err = %v, want error %q", st, err, tc.wantErr)
				}
				return
			}
			if err != nil || st.Gone != tc.wantGone || st.LeaseID != "l1" {
				t.Fatalf("status %+v, err %v, want gone=%v", st, err, tc.wantGone)
			}
		})
	}
}

func TestDestroyRenewList(t *testing.T) {
	exe := helperExe(t)
	ok := []string{exe, "print", ""}
	base := func(extra map[string]any) providers.Profile {
		s := map[string]any{"provision": ok, "inspect": ok, "destroy": ok}
		for k, v := range extra {
			s[k] = v
		}
		return profile(t, s, nil)
	}
	ctx, lease := testCtx(t), providers.Lease{ID: "l1"}
	p := New(testConfig(t))

	if err := p.Destroy(ctx, base(nil), lease); err != nil {
		t.Fatalf("destroy: %v", err)
	}
	if err := p.Destroy(ctx, base(map[string]any{"destroy": []string{exe, "fail", "1", "unknown lease l1"}}), lease); err != nil {
		t.Fatalf("destroy of a lease that is already gone: %v", err)
	}
	err := p.Destroy(ctx, base(map[string]any{"destroy": []string{exe, "fail", "1", "temporary error"}}), lease)
	if err == nil || err.Error() != "lease CLI destroy exited 1: temporary error" {
		t.Fatalf("destroy err = %v", err)
	}

	if err := p.Renew(ctx, base(nil), lease); !errors.Is(err, providers.ErrUnsupported) {
		t.Fatalf("renew without template: %v", err)
	}
	if err := p.Renew(ctx, base(map[string]any{"renew": ok}), lease); err != nil {
		t.Fatalf("renew: %v", err)
	}
	if err := p.Renew(ctx, base(map[string]any{"renew": []string{exe, "fail", "1", "no such lease"}}), lease); !errors.Is(err, providers.ErrLeaseGone) {
		t.Fatalf("renew of a gone lease: %v", err)
	}

	if _, err := p.List(ctx, base(nil)); !errors.Is(err, providers.ErrUnsupported) {
		t.Fatalf("list without template: %v", err)
	}
	list := `[{"id":"a","state":"ready","ready":true,"sshHost":"h","labels":{"openclaw.gateway":"gw1"}},{"id":"b","state":"deleted"}]`
	got, err := p.List(ctx, base(map[string]any{"list": []string{exe, "print", list}}))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].LeaseID != "a" || !got[0].Ready || got[0].Gone || got[0].Labels["openclaw.gateway"] != "gw1" ||
		got[0].Lease.SSHPort != 22 || got[1].LeaseID != "b" || !got[1].Gone {
		t.Fatalf("list = %+v", got)
	}
	if _, err := p.List(ctx, base(map[string]any{"list": []string{exe, "print", `{"id":"a"}`}})); err == nil || !strings.Contains(err.Error(), "malformed JSON") {
		t.Fatalf("list of an object: %v", err)
	}
}

func TestCommandsGetACleanEnvironment(t *testing.T) {
	t.Setenv("OPENCLAW_TEST_SECRET", "hunter2")
	exe, dir := helperExe(t), t.TempDir()
	envFile := filepath.Join(dir, "env")
	ok := []string{exe, "print", ""}
	prof := profile(t, map[string]any{"provision": ok, "inspect": ok, "destroy": []string{exe, "env", envFile}},
		map[string]string{"CRABBOX_TOKEN_FILE": "/etc/crabbox/token"})
	if err := New(testConfig(t)).Destroy(testCtx(t), prof, providers.Lease{ID: "l1"}); err != nil {
		t.Fatal(err)
	}
	env := readLines[[]string](t, envFile)[0]
	names := map[string]bool{}
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		names[k] = true
	}
	if names["OPENCLAW_TEST_SECRET"] || strings.Contains(strings.Join(env, "\n"), "hunter2") {
		t.Fatalf("the gateway's environment leaked into the command: %q", env)
	}
	if !names["PATH"] || !names["LANG"] || !slices.Contains(env, "CRABBOX_TOKEN_FILE=/etc/crabbox/token") {
		t.Fatalf("env = %q", env)
	}
	for k := range names {
		if !slices.Contains([]string{"PATH", "HOME", "LANG", "CRABBOX_TOKEN_FILE", "LEASE_CLI_HELPER", "GORACE"}, k) {
			t.Fatalf("unexpected variable %s in %q", k, env)
		}
	}
}

func TestCrabboxPreset(t *testing.T) {
	ctx, dir, hk := testCtx(t), t.TempDir(), tunneltest.HostKey(t)
	settings, _ := json.Marshal(map[string]any{
		"binary": helperExe(t), "provider": "hetzner", "class": "cx22", "idleTimeout": "45m", "pollInterval": "10ms",
		"env": map[string]string{"LEASE_CLI_HELPER": "crabbox", "HELPER_DIR": dir, "HELPER_HOSTKEY": hk, "GORACE": "atexit_sleep_ms=0", "HELPER_VERSION": "0.46.0"},
	})
	prof := providers.Profile{ID: "cb", Provider: "crabbox", Settings: settings,
		Lifetime: providers.Lifetime{TTL: providers.Duration(48 * time.Hour)}}
	p := NewCrabbox(testConfig(t))
	if err := p.ValidateSettings(settings); err != nil {
		t.Fatal(err)
	}
	lease, err := p.Provision(ctx, prof, "op-9", providers.ProvisionRequest{EnvironmentID: "env_1", GatewayID: "gw_1"})
	if err != nil {
		t.Fatal(err)
	}
	id := LeaseIDFor("cbx_", "op-9")
	if lease.ID != id || p.LeaseID(prof, "op-9") != id || lease.SSHPort != 22 || lease.HostKeys[0] != hk {
		t.Fatalf("lease = %+v", lease)
	}
	if err := p.Renew(ctx, prof, lease); err != nil {
		t.Fatal(err)
	}
	if err := p.Destroy(ctx, prof, lease); err != nil {
		t.Fatal(err)
	}
	list, err := p.List(ctx, prof)
	if err != nil || len(list) != 2 || !list[1].Gone {
		t.Fatalf("list = %+v, %v", list, err)
	}
	got := readLines[[]string](t, filepath.Join(dir, "argv.log"))
	want := [][]string{
		{"--version"},
		{"warmup", "--provider", "hetzner", "--class", "cx22", "--ttl", "48h", "--idle-timeout", "45m", "--lease-id", id},
		{"inspect", "--provider", "hetzner", "--id", id, "--json"},
		{"heartbeat", "--provider", "hetzner", "--id", id},
		{"stop", "--provider", "hetzner", id},
		{"list", "--provider", "hetzner", "--json"},
	}
	if len(got) != len(want) {
		t.Fatalf("argv = %q\nwant %q", got, want)
	}
	for i := range want {
		if !slices.Equal(got[i], want[i]) {
			t.Fatalf("call %d argv = %q\nwant %q", i, got[i], want[i])
		}
	}
}

func TestValidateSettingsNamesTheField(t *testing.T) {
	ok := []string{"lease", "x"}
	for _, tc := range []struct {
		name     string
		crabbox  bool
		settings string
		field    string
	}{
		{name: "provision required", settings: `{"inspect":["a"],"destroy":["a"]}`, field: "settings.provision"},
		{name: "inspect required", settings: `{"provision":["a"],"destroy":["a"]}`, field: "settings.inspect"},
		{name: "empty program", settings: `{"provision":[""],"inspect":["a"],"destroy":["a"]}`, field: "settings.provision[0]"},
		{name: "unknown placeholder", settings: `{"provision":["a","b","c","{lease}"],"inspect":["a"],"destroy":["a"]}`, field: "settings.provision[3]"},
		{name: "placeholder not available", settings: `{"provision":["a"],"inspect":["a","{opId}"],"destroy":["a"]}`, field: "settings.inspect[1]"},
		{name: "list knows no lease", settings: `{"provision":["a"],"inspect":["a"],"destroy":["a"],"list":["a","{leaseId}"]}`, field: "settings.list[1]"},
		{name: "bad timeout", settings: `{"provision":["a"],"inspect":["a"],"destroy":["a"],"timeout":"soon"}`, field: "settings.timeout"},
		{name: "negative poll", settings: `{"provision":["a"],"inspect":["a"],"destroy":["a"],"pollInterval":"-1s"}`, field: "settings.pollInterval"},
		{name: "bad pattern", settings: `{"provision":["a"],"inspect":["a"],"destroy":["a"],"notFoundPattern":"("}`, field: "settings.notFoundPattern"},
		{name: "pattern matching everything", settings: `{"provision":["a"],"inspect":["a"],"destroy":["a"],"notFoundPattern":".*"}`, field: "settings.notFoundPattern"},
		{name: "bad prefix", settings: `{"provision":["a"],"inspect":["a"],"destroy":["a"],"leaseIdPrefix":"a/b"}`, field: "settings.leaseIdPrefix"},
		{name: "bad env name", settings: `{"provision":["a"],"inspect":["a"],"destroy":["a"],"env":{"A=B":"c"}}`, field: "settings.env.A=B"},
		{name: "unknown field", settings: `{"provision":["a"],"inspect":["a"],"destroy":["a"],"inspct":["a"]}`, field: "settings.inspct"},
		{name: "wrong type", settings: `{"provision":"a b","inspect":["a"],"destroy":["a"]}`, field: "settings.provision"},
		{name: "crabbox ttl", crabbox: true, settings: `{"ttl":"forever"}`, field: "settings.ttl"},
		{name: "crabbox flag injection", crabbox: true, settings: `{"class":"--rm"}`, field: "settings.class"},
		{name: "crabbox unknown field", crabbox: true, settings: `{"provision":["x"]}`, field: "settings.provision"},
		{name: "crabbox static class", crabbox: true, settings: `{"provider":"ssh","class":"cx22"}`, field: "settings.class"},
		{name: "crabbox host key", crabbox: true, settings: `{"hostKeys":["ssh-ed25519 nope"]}`, field: "settings.hostKeys[0]"},
		{name: "crabbox missing", crabbox: true, settings: `{"binary":"/nonexistent/crabbox"}`, field: "settings.binary"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := New(testConfig(t))
			if tc.crabbox {
				p = NewCrabbox(testConfig(t))
			}
			err := p.ValidateSettings(json.RawMessage(tc.settings))
			var fe *providers.FieldError
			if !errors.As(err, &fe) || fe.Field != tc.field {
				t.Fatalf("err = %v, want a field error for %s", err, tc.field)
			}
		})
	}
	good, _ := json.Marshal(map[string]any{"provision": ok, "inspect": ok, "destroy": ok})
	if err := New(testConfig(t)).ValidateSettings(good); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{`{}`, `{"provider":"hetzner","class":"cx22","ttl":"24h"}`, `{"provider":"ssh","idempotentLeaseId":false}`} {
		var m map[string]any
		_ = json.Unmarshal([]byte(s), &m)
		m["binary"] = helperExe(t)
		m["env"] = map[string]string{"LEASE_CLI_HELPER": "crabbox", "HELPER_DIR": t.TempDir(), "HELPER_VERSION": "0.41.1", "GORACE": "atexit_sleep_ms=0"}
		b, _ := json.Marshal(m)
		if err := NewCrabbox(testConfig(t)).ValidateSettings(b); err != nil {
			t.Fatalf("crabbox %s: %v", s, err)
		}
	}
}

func TestFormatDurationAndLeaseID(t *testing.T) {
	for d, want := range map[time.Duration]string{
		24 * time.Hour: "24h", 30 * time.Minute: "30m", 90 * time.Minute: "1h30m",
		90 * time.Second: "1m30s", time.Hour + 30*time.Second: "1h0m30s", 0: "0s",
	} {
		if got := FormatDuration(d); got != want {
			t.Errorf("FormatDuration(%v) = %q, want %q", d, got, want)
		}
	}
	a, b := LeaseIDFor("cbx_", "op-1"), LeaseIDFor("cbx_", "op-2")
	if a == b || len(a) != len("cbx_")+12 || a != LeaseIDFor("cbx_", "op-1") {
		t.Fatalf("lease ids %q %q", a, b)
	}
}

// A Crabbox binary that never answers --version is cut when the caller's context ends (a
// config.patch's deadline), not only at the profile's own timeout.
func TestValidateSettingsEndsWithTheCallersContext(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "crabbox")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\nexec sleep 600\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	settings, _ := json.Marshal(map[string]any{"binary": bin, "timeout": "10m"})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- NewCrabbox(testConfig(t)).ValidateSettingsContext(ctx, settings) }()
	cancel()
	select {
	case err := <-done:
		var fe *providers.FieldError
		if !errors.As(err, &fe) || fe.Field != "settings.binary" {
			t.Fatalf("validation cut by its context: %v, want a settings.binary error", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("validation went on after its context ended")
	}
}

package command

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The test binary doubles as the lease CLI under test: with LEASE_CLI_HELPER set it runs
// helperMain instead of the tests. Settings pass that variable through settings.env, which also
// proves that env reaches the command.
func TestMain(m *testing.M) {
	switch os.Getenv("LEASE_CLI_HELPER") {
	case "":
		os.Exit(m.Run())
	case "crabbox":
		os.Exit(crabboxMain(os.Args[1:]))
	default:
		os.Exit(helperMain(os.Args[1:]))
	}
}

func helperExe(t *testing.T) string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return exe
}

func appendJSONLine(path string, v any) {
	b, _ := json.Marshal(v)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		panic(err)
	}
	defer f.Close()
	fmt.Fprintf(f, "%s\n", b)
}

// helperMain is a scriptable lease CLI: the first argument picks the behaviour.
func helperMain(args []string) int {
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "helper: no mode")
		return 2
	}
	switch args[0] {
	case "record": // record FILE ARGS...: remember argv, succeed
		appendJSONLine(args[1], args[2:])
		return 0
	case "fail": // fail CODE MESSAGE
		code, _ := strconv.Atoi(args[1])
		fmt.Fprint(os.Stderr, args[2])
		return code
	case "print": // print TEXT
		fmt.Fprint(os.Stdout, args[1])
		return 0
	case "env": // env FILE: write the environment
		appendJSONLine(args[1], os.Environ())
		return 0
	case "inspect": // inspect DIR ID: ready after $HELPER_READY_AFTER calls
		dir, id := args[1], args[2]
		countFile := filepath.Join(dir, id+".count")
		b, _ := os.ReadFile(countFile)
		n, _ := strconv.Atoi(string(b))
		n++
		_ = os.WriteFile(countFile, []byte(strconv.Itoa(n)), 0o600)
		after, _ := strconv.Atoi(os.Getenv("HELPER_READY_AFTER"))
		if n < after {
			fmt.Printf(`{"id":%q,"state":"starting","ready":false}`, id)
			return 0
		}
		obj := map[string]any{
			"id": id, "state": "ready", "ready": true,
			"sshHost": "127.0.0.1", "sshPort": 2222, "sshUser": "box", "sshKey": "keys/id_ed25519",
			"expiresAt": "2030-01-02T03:04:05Z",
			"labels":    map[string]string{"openclaw.gateway": "gw1", "openclaw.environment": "env1"},
		}
		if hk := os.Getenv("HELPER_HOSTKEY"); hk != "" {
			obj["sshHostKey"] = hk
		}
		b, _ = json.Marshal(obj)
		os.Stdout.Write(b)
		return 0
	case "hang": // hang PIDFILE: start a grandchild, record its pid, never finish
		child := exec.Command(os.Args[0], "hang-child")
		child.Env = os.Environ()
		if err := child.Start(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		_ = os.WriteFile(args[1]+".tmp", []byte(strconv.Itoa(child.Process.Pid)), 0o600)
		_ = os.Rename(args[1]+".tmp", args[1])
		time.Sleep(time.Hour)
		return 0
	case "detach": // detach PIDFILE: start a grandchild that keeps running, record its pid, succeed
		child := exec.Command(os.Args[0], "hang-child")
		child.Env = os.Environ() // stdout and stderr not inherited: the answer is not held open
		if err := child.Start(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		_ = os.WriteFile(args[1]+".tmp", []byte(strconv.Itoa(child.Process.Pid)), 0o600)
		_ = os.Rename(args[1]+".tmp", args[1])
		return 0
	case "hang-child":
		time.Sleep(time.Hour)
		return 0
	}
	fmt.Fprintln(os.Stderr, "helper: unknown mode", args[0])
	return 2
}

// crabboxMain records its argv and answers like Crabbox would.
func crabboxMain(args []string) int {
	appendJSONLine(filepath.Join(os.Getenv("HELPER_DIR"), "argv.log"), args)
	ready := func(id string) map[string]any {
		return map[string]any{
			"id": id, "state": "ready", "ready": true, "sshHost": "127.0.0.1", "sshUser": "crab",
			"sshKey": "/keys/k", "sshHostKey": os.Getenv("HELPER_HOSTKEY"),
			"labels": map[string]string{"openclaw.gateway": "gw1"},
		}
	}
	switch args[0] {
	case "--version":
		fmt.Println(os.Getenv("HELPER_VERSION"))
	case "warmup":
		i := slices.Index(args, "--lease-id")
		fmt.Printf("leased %s slug=swift-crab provider=hetzner server=1 type=cx22 ip=127.0.0.1 idle_timeout=45m0s expires=-\n", args[i+1])
	case "inspect":
		i := slices.Index(args, "--id")
		b, _ := json.Marshal(ready(args[i+1]))
		os.Stdout.Write(b)
	case "list":
		b, _ := json.Marshal([]any{ready("cbx_a"), map[string]any{"id": "cbx_b", "state": "released"}})
		os.Stdout.Write(b)
	}
	return 0
}

// readLines reads a file of JSON lines written by the helper.
func readLines[T any](t *testing.T, path string) []T {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []T
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var v T
		if err := json.Unmarshal([]byte(line), &v); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		out = append(out, v)
	}
	return out
}

// testConfig gives each test its own provider working root.
func testConfig(t *testing.T) Config {
	t.Helper()
	return Config{WorkRoot: filepath.Join(t.TempDir(), "providers")}
}

package capacitybench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/inference"
	"github.com/openclaw/cloudworkers/gateway/inference/builtin"
	"github.com/openclaw/cloudworkers/gateway/openclaw"
	"github.com/openclaw/cloudworkers/gateway/sessions"
	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/gateway/turns"
)

// The what-if door of TestOpenClawDoor: this test binary re-run with envDoorChild=<dir> and
// -test.run '^TestOpenClawDoorWhatIfGateway$' serves the OpenClaw door (gateway/openclaw as it is,
// with Config.MaxConnections = doorClients) over the real session store (SQLite in dir) and turn
// service (turns on the gateway against the model server at envDoorModel), on loopback, until its
// stdin closes. It prints one line "door {addr, token, ids}" (ids: doorSessions new sessions).
const (
	envDoorChild = "OPENCLAW_BENCH_DOOR_GATEWAY"
	envDoorModel = "OPENCLAW_BENCH_DOOR_MODEL"
)

type whatIfDoor struct {
	Addr, Token string
	IDs         []string
	pid         int
}

// TestOpenClawDoorWhatIfGateway is the what-if door's process; it skips unless TestOpenClawDoor
// started it.
func TestOpenClawDoorWhatIfGateway(t *testing.T) {
	dir := os.Getenv(envDoorChild)
	if dir == "" {
		t.Skip("the what-if door process of TestOpenClawDoor")
	}
	ctx := context.Background()
	db, err := store.Open(ctx, filepath.Join(dir, "gateway.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ss, err := sessions.New(sessions.Config{DB: db})
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Close(ctx)
	cat, err := inference.NewCatalog(inference.CatalogConfig{Default: "bench/tokens", Providers: map[string]inference.ProviderConfig{
		"bench": {API: inference.APIOpenAICompletions, BaseURL: os.Getenv(envDoorModel), Models: []inference.ModelConfig{{ID: "tokens"}}}}},
		nil, builtin.Adapters())
	if err != nil {
		t.Fatal(err)
	}
	ts, err := turns.New(ctx, turns.Config{DB: db, Sessions: ss, Catalog: cat, DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer ts.Close(ctx)
	token := "oct_bench-" + fmt.Sprint(time.Now().UnixNano())
	door, err := openclaw.New(openclaw.Config{Token: func() string { return token }, Sessions: ss, Turns: ts, MaxConnections: doorClients})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: door, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = hs.Serve(ln) }()
	w := whatIfDoor{Addr: ln.Addr().String(), Token: token}
	for i := range doorSessions {
		s, err := ss.Create(ctx, sessions.CreateParams{Title: fmt.Sprintf("door-load-%02d", i)})
		if err != nil {
			t.Fatal(err)
		}
		w.IDs = append(w.IDs, s.ID)
	}
	b, _ := json.Marshal(w)
	fmt.Printf("door %s\n", b)
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
	}
	_ = door.Close(ctx)
	_ = hs.Close()
}

// startWhatIfDoor starts the what-if door process against the model server at modelBase.
func startWhatIfDoor(ctx context.Context, t *testing.T, modelBase string) whatIfDoor {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run", "^TestOpenClawDoorWhatIfGateway$", "-test.count", "1")
	cmd.Env = append(os.Environ(), envDoorChild+"="+t.TempDir(), envDoorModel+"="+modelBase)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if l, ok := strings.CutPrefix(sc.Text(), "door "); ok {
				lines <- l
			}
		}
		close(lines)
	}()
	var w whatIfDoor
	select {
	case l, ok := <-lines:
		if !ok {
			t.Fatal("the what-if door process ended before it was ready")
		}
		if err := json.Unmarshal([]byte(l), &w); err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the what-if door process is not ready after 30s")
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	w.pid = cmd.Process.Pid
	return w
}

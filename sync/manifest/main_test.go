package manifest

import (
	"os"
	"testing"

	"github.com/openclaw/cloudworkers/sync/internal/synctest"
)

func TestMain(m *testing.M) {
	cleanup := synctest.IsolateGit()
	code := m.Run()
	cleanup()
	os.Exit(code)
}

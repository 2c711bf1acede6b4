package manifest

import (
	"testing"

	"github.com/openclaw/cloudworkers/sync/internal/synctest"
)

func TestMain(m *testing.M) {
	synctest.Main(m)
}

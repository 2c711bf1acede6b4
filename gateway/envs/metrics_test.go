package envs_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/openclaw/cloudworkers/gateway/envs"
	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
	"github.com/openclaw/cloudworkers/providers"
	"github.com/openclaw/cloudworkers/providers/fake"
)

// provisionCount is the sample count of openclaw_environment_provision_seconds{provider,result}.
func provisionCount(t *testing.T, reg *prometheus.Registry, provider, result string) uint64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != "openclaw_environment_provision_seconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["provider"] == provider && labels["result"] == result {
				return m.GetHistogram().GetSampleCount()
			}
		}
	}
	return 0
}

// TestFailedProvisionIsObserved: a provision that fails is counted in the provisioning histogram
// with result failed (and none as ready).
func TestFailedProvisionIsObserved(t *testing.T) {
	prov := fake.New()
	prov.ProvisionFunc = func(ctx context.Context, p providers.Profile, opID string, req providers.ProvisionRequest) (providers.Lease, error) {
		return providers.Lease{}, errors.New("capacity exhausted")
	}
	h := newHarness(t, prov)
	reg := prometheus.NewRegistry()
	reg.MustRegister(h.mgr.Collectors()...)
	e, _, err := h.mgr.Create(testenv.Context(t, 20*time.Second), "p1", "")
	if err != nil {
		t.Fatal(err)
	}
	h.waitState(t, e.ID, envs.Failed)
	testenv.Eventually(t, "a failed provision in the histogram", func() bool { return provisionCount(t, reg, "fake", "failed") == 1 })
	if n := provisionCount(t, reg, "fake", "ready"); n != 0 {
		t.Errorf("a failed provision counted %d time(s) as ready", n)
	}
}

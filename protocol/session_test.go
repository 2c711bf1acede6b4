package protocol

import "testing"

// A request is refused through another environment, at another owner epoch or at another lifecycle
// revision; "" and revision 0 are not checked.
func TestBindingRefusesAnotherEnvironmentEpochOrRevision(t *testing.T) {
	b := Binding{EnvironmentID: "env_a", OwnerEpoch: 3, LifecycleRevision: 7}
	for _, c := range []struct {
		env        string
		epoch, rev uint64
		want       Code
	}{
		{"env_a", 3, 7, ""},
		{"env_a", 3, 0, ""},
		{"", 3, 7, ""},
		{"env_b", 3, 7, CodeSessionNotAttached},
		{"env_a", 2, 7, CodeEpochMismatch},
		{"env_a", 3, 8, CodeEpochMismatch},
	} {
		var got Code
		if e := b.Refuse("ses_1", c.env, c.epoch, c.rev); e != nil {
			got = e.Code
		}
		if got != c.want {
			t.Errorf("Refuse(%q, %d, %d) = %q, want %q", c.env, c.epoch, c.rev, got, c.want)
		}
	}
}

package tunnel

import "testing"

func TestStatusMoves(t *testing.T) {
	for _, tt := range []struct {
		from, to Status
		ok       bool
	}{
		{StatusConnecting, StatusConnected, true},
		{StatusConnected, StatusReconnecting, true},
		{StatusReconnecting, StatusConnected, true},
		{StatusConnected, StatusStopped, true},
		{StatusStopped, StatusConnecting, false},
		{StatusStopped, StatusConnected, false},
		{StatusConnecting, StatusReconnecting, false},
	} {
		if got := tt.from.canMoveTo(tt.to); got != tt.ok {
			t.Errorf("%s -> %s allowed = %v, want %v", tt.from, tt.to, got, tt.ok)
		}
	}
}

package main

import (
	"reflect"
	"testing"
	"time"
)

func TestParseFlags(t *testing.T) {
	specs := commandFlags["warmup"]
	tests := []struct {
		name    string
		args    []string
		unknown bool
		want    map[string][]string
		extra   map[string][]string
		pos     []string
		wantErr bool
	}{
		{name: "forms", args: []string{"--lease-id", "a", "--label=k=v", "-label", "x=y", "--json"},
			want: map[string][]string{"lease-id": {"a"}, "label": {"k=v", "x=y"}, "json": {"true"}}, extra: map[string][]string{}},
		{name: "unknown recorded", args: []string{"--zone", "eu", "--spot", "--lease-id=b"}, unknown: true,
			want: map[string][]string{"lease-id": {"b"}}, extra: map[string][]string{"zone": {"eu"}, "spot": {""}}},
		{name: "unknown refused", args: []string{"--zone", "eu"}, wantErr: true},
		{name: "missing value", args: []string{"--ttl"}, wantErr: true},
		{name: "positional", args: []string{"id1", "--json"},
			want: map[string][]string{"json": {"true"}}, extra: map[string][]string{}, pos: []string{"id1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, pos, err := parseFlags(tt.args, specs, tt.unknown, false)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %t", err, tt.wantErr)
			}
			if tt.wantErr {
				return
			}
			if !reflect.DeepEqual(f.vals, tt.want) || !reflect.DeepEqual(f.unknown, tt.extra) || !reflect.DeepEqual(pos, tt.pos) {
				t.Fatalf("got vals=%v unknown=%v pos=%v", f.vals, f.unknown, pos)
			}
		})
	}
}

func TestParseDuration(t *testing.T) {
	for in, want := range map[string]time.Duration{"": defaultTTL, "0": defaultTTL, "90m": 90 * time.Minute, "30": 30 * time.Second, "0s": defaultTTL} {
		got, err := parseDuration("ttl", in, defaultTTL)
		if err != nil || got != want {
			t.Errorf("parseDuration(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"soon", "-5m", "{ttl}"} {
		if _, err := parseDuration("ttl", bad, defaultTTL); err == nil {
			t.Errorf("parseDuration(%q) accepted", bad)
		}
	}
}

func TestSlotAddrs(t *testing.T) {
	for slot, want := range map[int][2]string{
		0:         {"198.18.0.1", "198.18.0.2"},
		1:         {"198.18.0.5", "198.18.0.6"},
		slots - 1: {"198.19.255.253", "198.19.255.254"},
	} {
		h, b := slotAddrs(slot)
		if h.String() != want[0] || b.String() != want[1] || !testNet.Contains(h) || !testNet.Contains(b) {
			t.Errorf("slot %d: host %s box %s, want %v", slot, h, b, want)
		}
	}
	if s, _ := names("x"); len("ocwh-"+s) > 15 {
		t.Errorf("interface name ocwh-%s exceeds IFNAMSIZ", s)
	}
}

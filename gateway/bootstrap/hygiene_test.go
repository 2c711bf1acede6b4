package bootstrap

import (
	"net"
	"testing"
)

func TestRouteTo(t *testing.T) {
	hdr := "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
	// default via 192.0.2.1 on eth0; 198.18.0.0/30 on veth
	withDefault := hdr + "eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n" +
		"veth0\t000012C6\t00000000\t0001\t0\t0\t0\tFCFFFFFF\t0\t0\t0\n"
	noDefault := hdr + "veth0\t000012C6\t00000000\t0001\t0\t0\t0\tFCFFFFFF\t0\t0\t0\n"
	linkLocal := hdr + "eth0\t0000FEA9\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0\n"
	down := hdr + "eth0\t00000000\t010200C0\t0002\t0\t0\t0\t00000000\t0\t0\t0\n"
	md := net.ParseIP("169.254.169.254")
	cases := []struct {
		name, table string
		want        bool
		iface       string
	}{
		{"default route reaches metadata", withDefault, true, "eth0"},
		{"no default route", noDefault, false, ""},
		{"link-local route", linkLocal, true, "eth0"},
		{"route not up", down, false, ""},
		{"empty", hdr, false, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, ok := RouteTo(c.table, md)
			if ok != c.want || r.Iface != c.iface {
				t.Fatalf("RouteTo = %v %v, want %v %s", r, ok, c.want, c.iface)
			}
		})
	}
	if r, ok := RouteTo(withDefault, net.ParseIP("198.18.0.2")); !ok || r.Iface != "veth0" {
		t.Fatalf("most specific route not chosen: %v", r)
	}
}

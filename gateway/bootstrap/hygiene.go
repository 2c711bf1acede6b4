package bootstrap

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net"
	"slices"
	"strings"

	"golang.org/x/crypto/ssh"

	"github.com/openclaw/cloudworkers/providers"
)

// Check is the result of one named box hygiene check.
type Check struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Policy string `json:"policy"`
	Detail string `json:"detail"`
}

// Result is "pass", "warn" or "fail".
func (c Check) Result() string {
	switch {
	case c.OK:
		return "pass"
	case c.Policy == providers.HygieneWarn:
		return "warn"
	}
	return "fail"
}

// MetadataAddress is the cloud metadata service address; the box must have no route to it.
const MetadataAddress = "169.254.169.254"

// WorkerPath is the PATH the worker runs with.
const WorkerPath = "/usr/local/bin:/usr/bin:/bin"

// HygieneError reports enforced checks that failed.
type HygieneError struct{ Failed []Check }

func (e *HygieneError) Error() string {
	var parts []string
	for _, c := range e.Failed {
		parts = append(parts, c.Name+": "+c.Detail)
	}
	return "box hygiene: " + strings.Join(parts, "; ")
}

// CheckHygiene runs every hygiene check on the box. It never sends a packet anywhere: the metadata
// check reads the box's routing table. The error is a *HygieneError when an enforced check fails.
func CheckHygiene(ctx context.Context, c *ssh.Client, prof providers.Profile) ([]Check, error) {
	script := `printf 'agent=%s\n' "${SSH_AUTH_SOCK:-}"
for s in /var/run/docker.sock /run/docker.sock; do [ -S "$s" ] && printf 'docker=%s\n' "$s"; done
env -i PATH=` + WorkerPath + ` HOME="$HOME" LANG=C.UTF-8 /usr/bin/env | sed 's/^/cleanenv=/'
echo routes-begin; cat /proc/net/route 2>/dev/null; echo routes-end`
	out, err := RunOK(ctx, c, "hygiene checks", script)
	if err != nil {
		return nil, err
	}
	var agent string
	var docker, envNames []string
	var routes strings.Builder
	inRoutes := false
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "routes-begin":
			inRoutes = true
		case line == "routes-end":
			inRoutes = false
		case inRoutes:
			routes.WriteString(line + "\n")
		case strings.HasPrefix(line, "agent="):
			agent = strings.TrimPrefix(line, "agent=")
		case strings.HasPrefix(line, "docker="):
			docker = append(docker, strings.TrimPrefix(line, "docker="))
		case strings.HasPrefix(line, "cleanenv="):
			name, _, _ := strings.Cut(strings.TrimPrefix(line, "cleanenv="), "=")
			envNames = append(envNames, name)
		}
	}
	checks := []Check{
		{Name: providers.HygieneSSHAgent, OK: agent == "", Detail: "no forwarded SSH agent"},
		{Name: providers.HygieneDockerSocket, OK: len(docker) == 0, Detail: "no Docker socket"},
		{Name: providers.HygieneCleanEnv, Detail: "worker environment is exactly HOME, LANG, PATH"},
	}
	if agent != "" {
		checks[0].Detail = "SSH_AUTH_SOCK is set (" + agent + "): an agent is forwarded"
	}
	if len(docker) > 0 {
		checks[1].Detail = "Docker socket present: " + strings.Join(docker, ", ")
	}
	slices.Sort(envNames)
	if strings.Join(envNames, ",") == "HOME,LANG,PATH" {
		checks[2].OK = true
	} else {
		checks[2].Detail = "env -i left " + strings.Join(envNames, ",")
	}
	mc := Check{Name: providers.HygieneMetadataRoute}
	if routes.Len() == 0 {
		mc.Detail = "cannot read /proc/net/route"
	} else if r, ok := RouteTo(routes.String(), net.ParseIP(MetadataAddress)); ok {
		mc.Detail = fmt.Sprintf("%s is routable via %s (%s)", MetadataAddress, r.Iface, r.String())
	} else {
		mc.OK = true
		mc.Detail = "no route to " + MetadataAddress
	}
	checks = append(checks, mc)
	var failed []Check
	for i := range checks {
		checks[i].Policy = prof.HygienePolicy(checks[i].Name)
		if checks[i].Result() == "fail" {
			failed = append(failed, checks[i])
		}
	}
	if len(failed) > 0 {
		return checks, &HygieneError{Failed: failed}
	}
	return checks, nil
}

// Route is one IPv4 route of /proc/net/route.
type Route struct {
	Iface         string
	Dest, Gateway net.IP
	Mask          net.IPMask
}

func (r Route) String() string {
	ones, _ := r.Mask.Size()
	s := fmt.Sprintf("%s/%d", r.Dest, ones)
	if ones == 0 {
		s = "default"
	}
	if !r.Gateway.Equal(net.IPv4zero) {
		s += " via " + r.Gateway.String()
	}
	return s
}

// RouteTo returns the most specific usable route in a /proc/net/route table that covers ip.
func RouteTo(table string, ip net.IP) (Route, bool) {
	ip4 := ip.To4()
	if ip4 == nil {
		return Route{}, false
	}
	var best Route
	bestLen := -1
	sc := bufio.NewScanner(strings.NewReader(table))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 8 || f[0] == "Iface" {
			continue
		}
		dest, err1 := hexIP(f[1])
		gw, err2 := hexIP(f[2])
		mask, err3 := hexIP(f[7])
		var flags uint64
		_, err4 := fmt.Sscanf(f[3], "%x", &flags)
		if err1 != nil || err2 != nil || err3 != nil || err4 != nil {
			continue
		}
		const rtfUp, rtfReject = 0x1, 0x200
		if flags&rtfUp == 0 || flags&rtfReject != 0 {
			continue
		}
		m := net.IPMask(mask.To4())
		if !ip4.Mask(m).Equal(dest.To4().Mask(m)) {
			continue
		}
		if ones, _ := m.Size(); ones > bestLen {
			bestLen = ones
			best = Route{Iface: f[0], Dest: dest, Gateway: gw, Mask: m}
		}
	}
	return best, bestLen >= 0
}

// hexIP decodes the little-endian hex address format of /proc/net/route.
func hexIP(s string) (net.IP, error) {
	b, err := hex.DecodeString(s)
	if err != nil || len(b) != 4 {
		return nil, fmt.Errorf("bad address %q", s)
	}
	v := binary.LittleEndian.Uint32(b)
	out := make(net.IP, 4)
	binary.BigEndian.PutUint32(out, v)
	return out, nil
}

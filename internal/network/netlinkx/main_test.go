package netlinkx_test

import (
	"fmt"
	"os"
	"os/exec"
	"testing"
)

// TestMain checks that the tests leave the machine's own network (the
// links, addresses and IPv4 routes of the namespace the tests start in)
// as they found it: everything they change must be in namespaces of
// their own.
func TestMain(m *testing.M) {
	before := hostNetwork()
	code := m.Run()
	if after := hostNetwork(); after != before {
		fmt.Fprintf(os.Stderr, "the tests changed the host's network:\nbefore:\n%s\nafter:\n%s\n", before, after)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

// hostNetwork is a read-only summary of the current namespace's network
// ("" without iproute2).
func hostNetwork() string {
	out := ""
	for _, args := range [][]string{{"-br", "link"}, {"-br", "addr"}, {"route"}} {
		b, err := exec.Command("ip", args...).Output() // #nosec G204 -- fixed arguments
		if err != nil {
			return ""
		}
		out += string(b)
	}
	return out
}

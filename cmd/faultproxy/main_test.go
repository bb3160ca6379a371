package main

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"toolstackd/internal/testkit/faultproxy"
)

func TestCommands(t *testing.T) {
	p, err := faultproxy.New(faultproxy.Config{Listen: "127.0.0.1:0", Target: "127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	src := netip.MustParseAddr("127.0.0.3")
	in := strings.Join([]string{
		"set 127.0.0.3 delay=75ms±50ms drop=0.1",
		"show 127.0.0.3",
		"set nonsense blackhole",
		"set 127.0.0.3 sideways",
		"frobnicate",
		"reset",
		"",
	}, "\n")
	var out strings.Builder
	interpret(p, strings.NewReader(in), &out)
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	want := []string{"ok", "delay=75ms±50ms drop=0.1", "error:", "error:", "error: unknown command", "reset 0"}
	if len(lines) != len(want) {
		t.Fatalf("answers:\n%s", out.String())
	}
	for i := range want {
		if !strings.HasPrefix(lines[i], want[i]) {
			t.Errorf("answer %d = %q, want %q...", i, lines[i], want[i])
		}
	}
	if f := p.FaultFor(src); f.Delay != 75*time.Millisecond || f.Drop != 0.1 {
		t.Errorf("fault %v", f)
	}
	if got := command(p, "set * blackhole"); got != "ok" || !p.FaultFor(src).Blackhole {
		t.Errorf("set *: %q, %v", got, p.FaultFor(src))
	}
	if got := command(p, "heal"); got != "ok" || p.FaultFor(src) != faultproxy.Pass {
		t.Errorf("heal: %q", got)
	}
	if got := command(p, "default drop=1"); got != "ok" || p.FaultFor(src).Drop != 1 {
		t.Errorf("default: %q", got)
	}
	if got := command(p, "stats"); !strings.Contains(got, "accepted=0") {
		t.Errorf("stats: %q", got)
	}
}

package qemu

import (
	"context"
	"testing"

	"toolstackd/internal/xerr"
)

// Keys and triggers the manager would never pass are refused before any
// domain is looked at; a domain that is not there is an error, not a
// crash.
func TestTriggersRefuse(t *testing.T) {
	q := &QEMU{doms: map[string]*qemuDomain{}}
	ctx := context.Background()
	for _, k := range []byte{'A', '/', 0, 0xff, ' '} {
		if err := q.SendSysrq(ctx, "x", k); !xerr.HasCode(err, xerr.InvalidValue) {
			t.Errorf("SendSysrq(%q): %v", k, err)
		}
	}
	for _, tr := range []string{"", "reset", "sleep", "init", "nmi "} {
		if err := q.SendTrigger(ctx, "x", tr); !xerr.HasCode(err, xerr.InvalidValue) {
			t.Errorf("SendTrigger(%q): %v", tr, err)
		}
	}
	if err := q.SendSysrq(ctx, "no-such-domain", 'h'); err == nil {
		t.Error("SendSysrq to no domain succeeded")
	}
	if err := q.SendTrigger(ctx, "no-such-domain", "nmi"); err == nil {
		t.Error("SendTrigger to no domain succeeded")
	}
	if err := q.ResizeDisk(ctx, "no-such-domain", "0", 1<<20); err == nil {
		t.Error("ResizeDisk on no domain succeeded")
	}
	if err := q.MoveNIC(ctx, "no-such-domain", "0", "br0"); err == nil {
		t.Error("MoveNIC on no domain succeeded")
	}
}

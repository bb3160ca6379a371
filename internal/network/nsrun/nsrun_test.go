package nsrun_test

import (
	"os"
	"strings"
	"testing"

	"toolstackd/internal/network/nsrun"
	"toolstackd/internal/testkit/netnstest"
)

// netnsOfThread is the namespace the calling thread is in, as the kernel
// names it ("net:[inode]").
func netnsOfThread(t *testing.T) string {
	t.Helper()
	s, err := os.Readlink("/proc/thread-self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Run runs f in the namespace at the path, on a thread of its
// own: the caller's thread never leaves its namespace.
func TestRun(t *testing.T) {
	ns := netnstest.New(t)
	before := netnsOfThread(t)
	var inside string
	if err := nsrun.Run(ns.Path(), func() error {
		inside = netnsOfThread(t)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if inside == before {
		t.Fatalf("f ran in the caller's namespace %s", inside)
	}
	if after := netnsOfThread(t); after != before {
		t.Fatalf("the caller moved from %s to %s", before, after)
	}

	// "" is the caller's own namespace, on the caller's goroutine.
	if err := nsrun.Run("", func() error {
		inside = netnsOfThread(t)
		return nil
	}); err != nil || inside != before {
		t.Fatalf(`Run(""): %v, ran in %s, want %s`, err, inside, before)
	}

	// A path that is no namespace: f does not run.
	ran := false
	err := nsrun.Run(t.TempDir()+"/nosuch", func() error { ran = true; return nil })
	if err == nil || ran || !strings.Contains(err.Error(), "network namespace") {
		t.Fatalf("bad path: err %v, ran %v", err, ran)
	}
}

package main

import (
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"toolstackd/internal/cli"
)

// The manual pages come from the command definitions: every visible flag
// is in toolstackd(8), every listed xe command in xe(1).
func TestManPages(t *testing.T) {
	root := rootCmd()
	page := daemonManPage(root)
	root.Flags().VisitAll(func(f *pflag.Flag) {
		if !f.Hidden && !strings.Contains(page, `.B \-\-`+roff(f.Name)) {
			t.Errorf("toolstackd.8 lacks --%s", f.Name)
		}
	})
	if strings.Contains(page, "debug\\-hooks") {
		t.Error("toolstackd.8 shows the hidden --debug-hooks")
	}
	cmds := cli.Commands()
	if len(cmds) < 100 {
		t.Fatalf("only %d xe commands", len(cmds))
	}
	xe := xeManPage(cmds)
	for _, name := range []string{"vm-list", "vm-start", "sr-create", "pool-join"} {
		if !strings.Contains(xe, ".B "+roff(name)+"\n") {
			t.Errorf("xe.1 lacks %s", name)
		}
	}
	for _, p := range []string{page, xe} {
		for i, line := range strings.Split(p, "\n") {
			if strings.HasPrefix(line, "'") {
				t.Errorf("line %d starts with a quote, a roff control character: %q", i+1, line)
			}
		}
	}
}

package cli

import (
	"fmt"
	"net/http"
	"os"
	"sort"
	"strings"
	"testing"
)

// coverageFloor is the least number of commands that must not answer
// NOT_IMPLEMENTED; raise it as commands are wired.
const coverageFloor = 500

// genSuffixes are the commands generated for every class (table.go).
var genSuffixes = []string{"-list", "-param-list", "-param-get", "-param-set", "-param-add", "-param-remove", "-param-clear"}

// usesByName indexes cmdUses.
func usesByName(t *testing.T) map[string]cmdUse {
	t.Helper()
	m := map[string]cmdUse{}
	for _, u := range cmdUses {
		if _, dup := m[u.name]; dup {
			t.Errorf("cmdUses lists %s twice", u.name)
		}
		m[u.name] = u
	}
	return m
}

// TestCommandUsesComplete checks that every command of the table is
// accounted for: xapi's have an entry in cmdUses naming messages of the
// datamodel (or, for the few the published API lacks, nothing else), the
// others are the per-class generated ones or help.
func TestCommandUsesComplete(t *testing.T) {
	h := newHarness(t, goldenFixture)
	uses := usesByName(t)
	xapi := map[string]bool{}
	for _, e := range append(xapiCommands[:len(xapiCommands):len(xapiCommands)], unpublishedCommands...) {
		xapi[e.name] = true
		if _, ok := uses[e.name]; !ok {
			t.Errorf("%s: no entry in cmdUses", e.name)
		}
	}
	for _, u := range cmdUses {
		if !xapi[u.name] {
			t.Errorf("cmdUses lists %s, which is not in xapi's table", u.name)
		}
		for _, m := range strings.Fields(u.msgs) {
			m = strings.TrimSuffix(m, "?")
			if h.api.Model.Message(m) == nil && !unpublished[m] {
				t.Errorf("%s: message %s is not in the datamodel", u.name, m)
			}
		}
		if u.http != "" && !strings.HasPrefix(u.http, "/") {
			t.Errorf("%s: endpoint %q", u.name, u.http)
		}
	}
	for m := range unpublished {
		if h.api.Model.Message(m) != nil {
			t.Errorf("%s is in the datamodel: take it out of unpublished", m)
		}
	}
	gen := map[string]bool{}
	for _, v := range h.cli.views {
		for _, s := range genSuffixes {
			gen[v.cli+s] = true
		}
	}
	for name := range h.cli.cmds {
		if !xapi[name] && !gen[name] && name != "help" {
			t.Errorf("%s: neither xapi's, generated, nor help", name)
		}
	}
}

// unpublished are messages xapi's commands call that the published API
// does not have: internal to xapi, never served by toolstackd.
var unpublished = map[string]bool{
	"Diagnostics.gc_compact": true, "Diagnostics.gc_stats": true, "Diagnostics.db_stats": true,
	"Diagnostics.network_stats": true, "host.get_diagnostic_timing_stats": true,
	"host.get_sm_diagnostics": true, "host.get_thread_diagnostics": true, "host.ha_xapi_healthcheck": true,
	"host.is_in_emergency_mode": true, "host.notify": true, "host.prepare_for_poweroff": true,
	"host.signal_networking_change": true, "host.sm_dp_destroy": true, "host.update_firewalld_service_status": true,
	"network.attach": true, "pool.disable_binary_storage": true, "pool.enable_binary_storage": true,
	"pool_update.resync_host": true, "VBD.pause": true, "VBD.unpause": true, "VDI.generate_config": true,
	"VDI.force_unlock": true,
}

// missing says what a command lacks in the daemon: the messages it calls
// that nobody serves and an endpoint that is not routed ("" if nothing).
// optional includes the messages only some forms of the command call.
func (h *harness) missing(u cmdUse, optional bool) string {
	var out []string
	for _, m := range strings.Fields(u.msgs) {
		name, opt := strings.CutSuffix(m, "?")
		if (optional || !opt) && !h.api.Implemented(name) {
			out = append(out, m)
		}
	}
	if u.http != "" && !h.routed(u.http) {
		out = append(out, u.http)
	}
	return strings.Join(out, " ")
}

// routed reports whether the daemon's router serves a path with any
// method a transfer uses.
func (h *harness) routed(path string) bool {
	for _, m := range []string{http.MethodGet, http.MethodPut, http.MethodPost, http.MethodConnect} {
		if h.cli.hasRoute(m, path) {
			return true
		}
	}
	return false
}

// TestCommandWalk fails for every command that still answers
// NOT_IMPLEMENTED although the daemon serves everything it needs.
// TOOLSTACKD_COVERAGE=1 prints the figure and what remains, with why.
func TestCommandWalk(t *testing.T) {
	h := newFullHarness(t)
	uses := usesByName(t)
	total, wired, working := 0, 0, 0
	var remain, ahead, partial []string
	for _, name := range h.cli.sortedNames() {
		cmd := h.cli.cmds[name]
		total++
		u, isXapi := uses[name]
		if cmd.Run != nil {
			wired++
			switch {
			case !isXapi:
				working++
			case h.missing(u, false) != "":
				ahead = append(ahead, fmt.Sprintf("%s (waits for %s)", name, h.missing(u, false)))
			default:
				working++
				if miss := h.missing(u, true); miss != "" {
					partial = append(partial, fmt.Sprintf("%s (%s)", name, miss))
				}
			}
			continue
		}
		if !isXapi {
			t.Errorf("%s: a generated command without Run", name)
			continue
		}
		miss := h.missing(u, false)
		if miss == "" {
			t.Errorf("%s answers NOT_IMPLEMENTED, but the daemon serves what it needs (%s)", name, orNothing(u))
			continue
		}
		remain = append(remain, fmt.Sprintf("%s: %s", name, miss))
	}
	sort.Strings(remain)
	if os.Getenv("TOOLSTACKD_COVERAGE") != "" {
		t.Logf("xe commands not answering NOT_IMPLEMENTED: %d of %d (%d more are wired to messages not served yet)",
			working, total, wired-working)
		t.Logf("wired ahead of their messages (%d): %s", len(ahead), strings.Join(ahead, "; "))
		t.Logf("working, some forms waiting for a message (%d): %s", len(partial), strings.Join(partial, "; "))
		t.Logf("remaining (%d), with what the daemon lacks:\n%s", len(remain), strings.Join(remain, "\n"))
	}
	if working < coverageFloor {
		t.Errorf("only %d of %d commands work; the floor is %d", working, total, coverageFloor)
	}
}

func orNothing(u cmdUse) string {
	s := strings.TrimSpace(u.msgs + " " + u.http)
	if s == "" {
		return "it reads the database only"
	}
	return s
}

// TestImplementedQuery checks api.Server.Implemented, which the walk
// relies on: database messages always, explicit ones once a module binds
// them, unknown names never.
func TestImplementedQuery(t *testing.T) {
	bare, full := newHarness(t, goldenFixture), newFullHarness(t)
	for _, c := range []struct {
		msg        string
		bare, full bool
	}{
		{"VM.get_record", true, true}, {"VM.set_name_label", true, true}, {"VBD.create", true, true},
		{"VM.start", false, true}, {"VDI.clone", false, true}, {"pool.join", false, true},
		{"LVHD.enable_thin_provisioning", false, false}, {"VM.frobnicate", false, false}, {"", false, false},
	} {
		if got := bare.api.Implemented(c.msg); got != c.bare {
			t.Errorf("bare server: Implemented(%q) = %v", c.msg, got)
		}
		if got := full.api.Implemented(c.msg); got != c.full {
			t.Errorf("full host: Implemented(%q) = %v", c.msg, got)
		}
	}
}

package clients

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/schema"
	"toolstackd/internal/testkit/netnstest"
	"toolstackd/internal/testkit/testdaemon"
)

// The figure of how much of the published XenAPI toolstackd serves: each
// explicit message of the published datamodel (those not generated for
// every class: not a getter, setter, create, destroy or lookup) is called
// once against a real daemon with placeholder arguments (null refs, empty
// strings, zeros, the first value of each enum). A message answered with
// NOT_IMPLEMENTED (or MESSAGE_METHOD_UNKNOWN) has no handler; any other
// answer, a success or an error about the arguments, means one ran.
// Messages the datamodel marks Removed are left out of the count.
//
// The test always holds the number implemented to a floor, so that it can
// only go up; with TOOLSTACKD_COVERAGE=1 it prints the figure and the
// missing messages by class:
//
//	TOOLSTACKD_COVERAGE=1 go test -v -run TestMessageCoverage ./tests/clients

// coverageFloor is the number of explicit messages implemented when the
// floor was last raised, with a network backend (root) and without one.
// Raise it when more are.
const (
	coverageFloor          = 297
	coverageFloorNoNetwork = 272
)

// lastMessages are called after all the others: each leaves the daemon
// unreachable over HTTP when it succeeds.
var lastMessages = []string{"host.management_disable"}

type publishedModel struct {
	Classes []struct {
		Name     string `json:"name"`
		Messages []struct {
			Name      string `json:"name"`
			Implicit  bool   `json:"implicit"`
			Lifecycle string `json:"lifecycle"`
		} `json:"messages"`
	} `json:"classes"`
}

// placeholder is a harmless value of type t.
func placeholder(t *schema.Type, session string) any {
	switch t.Kind {
	case schema.KString:
		return ""
	case schema.KInt:
		return 0
	case schema.KFloat:
		return 0.0
	case schema.KBool:
		return false
	case schema.KDateTime:
		return "19700101T00:00:00Z"
	case schema.KEnum:
		if t.Enum != nil && len(t.Enum.Values) > 0 {
			return t.Enum.Values[0]
		}
		return ""
	case schema.KRef:
		if t.Name == "session" {
			return session
		}
		return "OpaqueRef:NULL"
	case schema.KSet:
		return []any{}
	case schema.KMap, schema.KRecord:
		return map[string]any{}
	}
	return ""
}

type outcome struct {
	wire, class string
	code        string // "" for success
	unimpl      bool
}

func TestMessageCoverage(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(testdaemon.SourceRoot(), "internal", "datamodel", "datamodel.json"))
	if err != nil {
		t.Fatal(err)
	}
	var pub publishedModel
	if err := json.Unmarshal(b, &pub); err != nil {
		t.Fatal(err)
	}
	// The network messages are served only with a network backend: where
	// this test may make a network namespace (root), the daemon runs the
	// Linux bridge backend inside one of its own, so they count too.
	opts := testdaemon.Options{Backend: "simulator"}
	floor := coverageFloor
	if why := netnstest.Available(); why == "" {
		opts.ExtraArgs = []string{"--network-backend", "linux", "--network-namespace", netnstest.New(t).Path()}
	} else {
		t.Logf("network messages not served (no network backend): %s", why)
		floor = coverageFloorNoNetwork
	}
	d := testdaemon.Start(t, opts)
	login := func() string { return d.Login(t) }
	sess := login()
	var results []outcome
	removed := 0
	start := time.Now()
	var wires []string
	for _, cls := range pub.Classes {
		for _, pm := range cls.Messages {
			if pm.Implicit {
				continue
			}
			if pm.Lifecycle == "Removed_s" {
				removed++
				continue
			}
			wires = append(wires, cls.Name+"."+pm.Name)
		}
	}
	// A message that takes the API off the network (it needs no argument
	// to do so) goes last, so that the others still reach the daemon.
	for _, w := range lastMessages {
		if i := slices.Index(wires, w); i >= 0 {
			wires = append(slices.Delete(wires, i, i+1), w)
		}
	}
	for _, wire := range wires {
		cls, _, _ := strings.Cut(wire, ".")
		{
			msg := dm.Model.Message(wire)
			o := outcome{wire: wire, class: cls}
			if msg == nil {
				o.code, o.unimpl = "MESSAGE_METHOD_UNKNOWN", true
				results = append(results, o)
				continue
			}
			call := func() (string, error) {
				args := make([]any, 0, len(msg.Params))
				for _, p := range msg.Params {
					args = append(args, placeholder(p.Type, sess))
				}
				c := &testdaemon.Client{URL: d.URL, Timeout: 10 * time.Second}
				_, err := c.Call(wire, args...)
				if x, ok := testdaemon.AsError(err); ok {
					return x.Code, nil
				}
				return "", err
			}
			code, err := call()
			if code == "SESSION_INVALID" && msg.TakesSession {
				// An earlier message (session.logout) ended the session.
				sess = login()
				code, err = call()
			}
			var ne net.Error
			switch {
			case err != nil && errors.As(err, &ne) && ne.Timeout():
				code = "(no answer in 10 s)"
			case err != nil && !d.Alive():
				// The message stopped the daemon (host.shutdown_agent):
				// it was served. Start it again for the rest.
				code = "(stopped the daemon)"
				d = d.Restart()
				sess = login()
			case err != nil:
				code = "(" + err.Error() + ")"
			}
			o.code = code
			o.unimpl = code == "NOT_IMPLEMENTED" || code == "MESSAGE_METHOD_UNKNOWN"
			results = append(results, o)
		}
	}
	total, missing := len(results), map[string][]string{}
	for _, r := range results {
		if r.unimpl {
			missing[r.class] = append(missing[r.class], strings.TrimPrefix(r.wire, r.class+"."))
		}
	}
	nMissing := 0
	for _, ms := range missing {
		nMissing += len(ms)
	}
	implemented := total - nMissing
	t.Logf("%d of %d explicit messages implemented (%d removed ones left out; %d calls in %v)",
		implemented, total, removed, total, time.Since(start).Round(time.Millisecond))
	if os.Getenv("TOOLSTACKD_COVERAGE") == "1" {
		classes := make([]string, 0, len(missing))
		for c := range missing {
			classes = append(classes, c)
		}
		sort.Strings(classes)
		var sb strings.Builder
		fmt.Fprintf(&sb, "%d of %d explicit messages implemented\nunimplemented, by class:\n", implemented, total)
		for _, c := range classes {
			fmt.Fprintf(&sb, "  %s (%d): %s\n", c, len(missing[c]), strings.Join(missing[c], ", "))
		}
		fmt.Print(sb.String())
	}
	if implemented < floor {
		t.Errorf("%d explicit messages implemented, below the floor of %d", implemented, floor)
	}
}

package cli

import (
	"reflect"
	"strings"
	"testing"
)

func TestSplitBody(t *testing.T) {
	for _, c := range []struct {
		body    string
		session string
		args    []string
	}{
		{"vm-list\nusername=root\npassword=x", "", []string{"vm-list", "username=root", "password=x"}},
		{"vm-list\r\n--minimal\r\n", "", []string{"vm-list", "--minimal"}},
		{"session_id=OpaqueRef:abc\r\nvm-list\r\nparams=uuid", "OpaqueRef:abc", []string{"vm-list", "params=uuid"}},
		{"", "", nil},
		{"a\n\nb", "", []string{"a", "", "b"}},
	} {
		s, a := splitBody(c.body)
		if s != c.session || !reflect.DeepEqual(a, c.args) && !(len(a) == 0 && len(c.args) == 0) {
			t.Errorf("%q: got %q %q", c.body, s, a)
		}
	}
}

func TestParseArgs(t *testing.T) {
	name, ps, bare, err := parseArgs([]string{"vm-param-set", "uuid=u", "other-config:k=a=b", "--force", "-u", "bob", "word", "empty="})
	if err != nil || name != "vm-param-set" {
		t.Fatal(name, err)
	}
	want := []param{{"uuid", "u"}, {"other-config:k", "a=b"}, {"force", "true"}, {"username", "bob"}, {"empty", ""}}
	if !reflect.DeepEqual(ps, want) || !reflect.DeepEqual(bare, []string{"word"}) {
		t.Fatalf("params %q bare %q", ps, bare)
	}
	for _, bad := range [][]string{{}, {"uuid=x"}, {"vm-list", "-x", "1"}, {"vm-list", "-u"}, {"vm-list", "=v"}, {"vm-list", "--"}} {
		if _, _, _, err := parseArgs(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

func TestParseBytes(t *testing.T) {
	for in, want := range map[string]int64{"512": 512, "1KiB": 1024, "10 GiB": 10 << 30, "2M": 2 << 20, "1T": 1 << 40} {
		if got, err := parseBytes("s", in); err != nil || got != want {
			t.Errorf("%s: %d %v", in, got, err)
		}
	}
	for _, in := range []string{"", "x", "-1", "1QiB", "GiB"} {
		if _, err := parseBytes("s", in); err == nil {
			t.Errorf("%q accepted", in)
		}
	}
}

// FuzzArgs feeds the server's argument handling arbitrary request
// bodies: splitting, parsing, and the checks made before a command runs
// (lookup, required and unknown parameters, filters). None may panic.
func FuzzArgs(f *testing.F) {
	for _, s := range []string{
		"vm-list\nusername=root\npassword=x",
		"vm-list\nname-label=a\nother-config:k=v\ntags:contains=t\nparams=uuid,name-label\n--minimal",
		"session_id=OpaqueRef:x\r\nvm-param-set\r\nuuid=u\r\nother-config:a=b",
		"vm-start\nvm=web\n--multiple\npower-state=halted",
		"help\nvm-list\n--minimal",
		"-u\nroot\n-pw",
		"vm-list\nother-config-key=v\nallowed-operations-contains=x",
		"network-param-add\nuuid=x\nparam-name=other-config\na=b",
		"event-wait\nclass=vm\npower-state=/=running",
	} {
		f.Add(s)
	}
	srv := newHarness(f, goldenFixture).cli
	f.Fuzz(func(t *testing.T, body string) {
		session, args := splitBody(body)
		if strings.Contains(session, "\n") {
			t.Fatalf("session %q spans lines", session)
		}
		name, params, bare, err := parseArgs(args)
		if err != nil {
			return
		}
		for _, p := range params {
			if p.k == "" {
				t.Fatalf("empty parameter name from %q", body)
			}
		}
		c := &Ctx{s: srv, name: name, params: params, bare: bare}
		c.prepare()
	})
}

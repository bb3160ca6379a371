package nbd

import (
	"strings"
	"testing"
)

func TestParseURI(t *testing.T) {
	for in, want := range map[string]URI{
		"nbd+unix:///vdi?socket=/run/x.sock":   {Network: "unix", Socket: "/run/x.sock", Export: "vdi"},
		"nbd+unix:///?socket=rel.sock":         {Network: "unix", Socket: "rel.sock"},
		"nbd+unix:///a%20b?socket=/r/s%26t":    {Network: "unix", Socket: "/r/s&t", Export: "a b"},
		"nbd://10.0.0.1/exp":                   {Network: "tcp", Host: "10.0.0.1", Port: 10809, Export: "exp"},
		"nbd://h:1234/":                        {Network: "tcp", Host: "h", Port: 1234},
		"nbd://h":                              {Network: "tcp", Host: "h", Port: 10809},
		"nbd://[::1]:99/a/b":                   {Network: "tcp", Host: "::1", Port: 99, Export: "a/b"},
		"NBD://Host.example/x":                 {Network: "tcp", Host: "Host.example", Port: 10809, Export: "x"},
		"nbd://[fe80::1%25eth0]/e":             {Network: "tcp", Host: "fe80::1%eth0", Port: 10809, Export: "e"},
		"nbd+unix:///d%3Fe?socket=/x%3Fy%2523": {Network: "unix", Socket: "/x?y%23", Export: "d?e"},
	} {
		got, err := ParseURI(in)
		if err != nil || got != want {
			t.Errorf("%s: got %+v, %v; want %+v", in, got, err, want)
			continue
		}
		if again, err := ParseURI(got.String()); err != nil || again != got {
			t.Errorf("%s: String %q reads back as %+v, %v", in, got.String(), again, err)
		}
	}
}

func TestParseURIRejects(t *testing.T) {
	for bad, why := range map[string]string{
		"file:///x":                            "scheme must be nbd or nbd+unix",
		"/srv/disk.qcow2":                      "scheme must be nbd or nbd+unix",
		"nbd+tls://h/x":                        "scheme must be nbd or nbd+unix",
		"nbd+unix:///x":                        "socket",
		"nbd+unix:///x?socket=":                "socket",
		"nbd+unix:///x?socket=a&socket=b":      "socket",
		"nbd+unix:///x?socket=a&tls=on":        "no query parameter but socket",
		"nbd+unix://h/x?socket=/s":             "no host",
		"nbd:///x":                             "needs a host",
		"nbd://h/x?socket=/s":                  "no query",
		"nbd://h:0/x":                          "bad port",
		"nbd://h:65536/x":                      "bad port",
		"nbd://h:/x":                           "empty port",
		"nbd://[::%25%20]/x":                   "bad IPv6 address",
		"nbd://u@h/x":                          "user information",
		"nbd://h/x#frag":                       "fragment",
		"nbd:h/x":                              "scheme://",
		"nbd://h%21/x":                         "",
		"nbd://h/%00":                          "control character",
		"nbd://h/%ff":                          "UTF-8",
		"nbd+unix:///x?socket=/a%0Ab":          "control character",
		"nbd://h/" + strings.Repeat("e", 5000): "longer than 4096",
		"::":                                   "scheme",
	} {
		_, err := ParseURI(bad)
		if err == nil {
			t.Errorf("%q parsed", bad)
			continue
		}
		if !strings.Contains(err.Error(), why) || !strings.HasPrefix(err.Error(), "NBD URI ") {
			t.Errorf("%q: error %q does not say %q", bad, err, why)
		}
	}
}

func TestAddressAndString(t *testing.T) {
	u := URI{Network: "tcp", Host: "::1", Port: 10810, Export: "e x"}
	if u.Address() != "[::1]:10810" || u.String() != "nbd://[::1]:10810/e%20x" {
		t.Errorf("%s %s", u.Address(), u.String())
	}
	u = URI{Network: "unix", Socket: "/run/s.sock", Export: "vdi"}
	if u.Address() != "/run/s.sock" || u.String() != "nbd+unix:///vdi?socket=/run/s.sock" {
		t.Errorf("%s %s", u.Address(), u.String())
	}
	if !IsURI("nbd+unix:///x") || !IsURI("NBD://h") || IsURI("/srv/nbd:x") || IsURI("nbdx://h") {
		t.Error("IsURI")
	}
}

// FuzzParseURI: parsing never panics; whatever parses writes back to a
// URI that parses to the same value; a parsed URI is complete.
func FuzzParseURI(f *testing.F) {
	for _, s := range []string{"nbd+unix:///vdi?socket=/run/x.sock", "nbd://h:1/e", "nbd://[::1]/a/b",
		"nbd://[fe80::1%25eth0]:7/x", "nbd+unix:////x?socket=%2F%3F", "nbd://h/%25%3A@:"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		u, err := ParseURI(s)
		if err != nil {
			return
		}
		if u.Address() == "" || (u.Network != "tcp" && u.Network != "unix") || (u.Network == "tcp" && (u.Port < 1 || u.Port > 65535)) {
			t.Fatalf("%q gave %+v", s, u)
		}
		again, err := ParseURI(u.String())
		if err != nil || again != u {
			t.Fatalf("%q gave %+v; its String %q gave %+v, %v", s, u, u.String(), again, err)
		}
	})
}

package xe

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

func TestSplitExtraArgs(t *testing.T) {
	got := splitExtraArgs(`server=h,name-label=a\,b,,--minimal`)
	want := []string{"server=h", "name-label=a,b", "--minimal"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%q", got)
	}
}

func TestSplitMinimal(t *testing.T) {
	got := splitMinimal(`a,b\,c,d\\e`)
	want := []string{"a", "b,c", `d\e`}
	if !reflect.DeepEqual(got, want) || splitMinimal("") != nil {
		t.Fatalf("%q", got)
	}
}

func TestClassOfCommand(t *testing.T) {
	for cmd, want := range map[string]string{
		"vm-param-list": "vm", "host-cpu-param-get": "host-cpu", "vm-start": "vm", "host-crashdump-destroy": "host-crashdump",
		"gpu-group-destroy": "gpu-group", "network-list": "network", "vdi-import": "vdi", "diagnostic-vm-status": "vm",
	} {
		if got := classOfCommand(cmd); got != want {
			t.Errorf("%s: %s, want %s", cmd, got, want)
		}
	}
}

func TestOptionsPriority(t *testing.T) {
	home := t.TempDir()
	os.WriteFile(filepath.Join(home, ".xe"), []byte("server=rc-host\nport=1\nusername=rc-user\nfoo=bar\n"), 0o600)
	env := map[string]string{"XE_EXTRA_ARGS": "port=2,-u,env-user,--nossl"}
	cl := &Client{Home: home, Getenv: func(k string) string { return env[k] }, Cwd: "/"}
	o, rest, err := cl.parseCommandLine([]string{"vm-list", "-u", "cli-user", "params=uuid"})
	if err != nil {
		t.Fatal(err)
	}
	if o.Server != "rc-host" || !o.ServerSet || o.Port != 2 || o.User != "cli-user" || !o.NoSSL || o.Password != "null" {
		t.Fatalf("%+v", o)
	}
	if !reflect.DeepEqual(rest, []string{"vm-list", "params=uuid", "foo=bar"}) {
		t.Fatalf("rest %q", rest)
	}
}

func TestPermittedFiles(t *testing.T) {
	cl := &Client{Cwd: "/home/u"}
	p := cl.permittedFiles([]string{"vdi-import", "filename=disk.raw", "uuid=x", "empty= "})
	for _, want := range []string{"/home/u/disk.raw", "/home/u/x"} {
		if !p[want] {
			t.Errorf("%s not permitted: %v", want, p)
		}
	}
	s := &conversation{cl: cl, permitted: p}
	if s.permit("../u/disk.raw", false) != nil || s.permit("/etc/passwd", false) == nil || s.permit(".", true) != nil {
		t.Fatal("permit")
	}
}

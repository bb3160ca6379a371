package journal

import (
	"os"
	"path/filepath"
	"testing"
)

func ev(kind, vm, host string, at int64) Event { return Event{kind, vm, host, at} }

func TestCheck(t *testing.T) {
	ok := []Event{
		ev(Start, "v", "a", 10), ev(Stop, "v", "a", 20), ev(Start, "v", "b", 25),
		ev(Dead, "-", "b", 30), ev(Start, "v", "c", 31), // b's reset ended its instance
		ev(Start, "w", "a", 5), // still running
	}
	if o := Check(ok); len(o) != 0 {
		t.Fatalf("overlaps in a clean history: %v", o)
	}
	bad := append(ok, ev(Start, "w", "b", 40)) // w still runs on a
	o := Check(bad)
	if len(o) != 1 || o[0].A.VM != "w" {
		t.Fatalf("want one overlap of w, got %v", o)
	}
	// A stop recorded after the next start (the kill took a while): an
	// overlap, as it should be.
	late := []Event{ev(Start, "v", "a", 10), ev(Start, "v", "b", 20), ev(Stop, "v", "a", 21)}
	if len(Check(late)) != 1 {
		t.Fatal("a late stop is an overlap")
	}
}

func TestAppendRead(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal")
	if err := Append(path, Start, "vm1", "h1"); err != nil {
		t.Fatal(err)
	}
	if err := Append(path, Stop, "vm1", "h1"); err != nil {
		t.Fatal(err)
	}
	f, _ := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	_, _ = f.WriteString("start vm2 h") // torn
	_ = f.Close()
	evs, err := Read(path)
	if err != nil || len(evs) != 2 || evs[0].At > evs[1].At || evs[0].At <= 0 {
		t.Fatalf("%v %v", evs, err)
	}
}

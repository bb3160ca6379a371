package xenops

import (
	"path/filepath"
	"testing"

	"toolstackd/internal/xenops/backend"
)

// A suspend image's hot-plugged VCPUs are rebuilt from checked parts
// only; anything SetVCPUs would not have made is refused.
func TestCheckHotCPUs(t *testing.T) {
	spec := &backend.Spec{VCPUs: 1, MaxCPU: 4}
	good := backend.CPUDevice{ID: "cpu-hot-1-0-0", Args: map[string]any{"driver": "max-x86_64-cpu", "id": "cpu-hot-1-0-0",
		"socket-id": 1.0, "core-id": 0.0, "thread-id": 0.0}}
	got, err := backend.CheckHotCPUs([]backend.CPUDevice{good}, spec)
	if err != nil || len(got) != 1 || got[0].Args["socket-id"] != int64(1) || got[0].Args["driver"] != "max-x86_64-cpu" {
		t.Fatalf("a VCPU SetVCPUs makes was refused: %+v %v", got, err)
	}
	with := func(k string, v any) backend.CPUDevice {
		c := backend.CPUDevice{ID: good.ID, Args: map[string]any{}}
		for a, b := range good.Args {
			c.Args[a] = b
		}
		if v == nil {
			delete(c.Args, k)
		} else {
			c.Args[k] = v
		}
		return c
	}
	for name, hot := range map[string][]backend.CPUDevice{
		"loader device":    {with("driver", "loader")},
		"file property":    {with("file", "/etc/shadow")},
		"chardev":          {with("chardev", "serial0")},
		"nested object":    {with("socket-id", map[string]any{"x": 1})},
		"negative id":      {with("socket-id", -1.0)},
		"fractional":       {with("socket-id", 1.5)},
		"id mismatch":      {with("socket-id", 2.0)},
		"other id arg":     {with("id", "vbd0")},
		"no driver":        {with("driver", nil)},
		"bad id":           {{ID: "../../etc", Args: good.Args}},
		"twice":            {good, good},
		"beyond VCPUs_max": {good, {ID: "cpu-hot-2-0-0", Args: map[string]any{"driver": "max-x86_64-cpu", "socket-id": 2.0, "core-id": 0.0, "thread-id": 0.0}}, {ID: "cpu-hot-3-0-0", Args: map[string]any{"driver": "max-x86_64-cpu", "socket-id": 3.0, "core-id": 0.0, "thread-id": 0.0}}, {ID: "cpu-hot-4-0-0", Args: map[string]any{"driver": "max-x86_64-cpu", "socket-id": 4.0, "core-id": 0.0, "thread-id": 0.0}}},
	} {
		if got, err := backend.CheckHotCPUs(hot, spec); err == nil {
			t.Errorf("%s: accepted as %+v", name, got)
		}
	}
}

// A suspend image's path is built from the VM's uuid, which must be one
// plain file name.
func TestSuspendPathRefusesBadUUID(t *testing.T) {
	root := t.TempDir()
	m := &Manager{cfg: Config{DataDir: root}}
	if _, err := m.suspendPath("../../etc/shadow"); err == nil {
		t.Error("suspendPath accepted a uuid with a separator")
	}
	if p, err := m.suspendPath("0b7c"); err != nil || p != filepath.Join(root, "xenops", "suspend", "0b7c.img") {
		t.Errorf("suspendPath = %q, %v", p, err)
	}
}

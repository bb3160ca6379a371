package backend

import (
	"fmt"
	"regexp"
)

var (
	// hotCPUID is the id SetVCPUs gives a VCPU it plugs.
	hotCPUID = regexp.MustCompile(`^cpu-hot-[0-9]{1,3}-[0-9]{1,3}-[0-9]{1,3}$`)
	// cpuDriver is a QEMU x86 CPU type ("max-x86_64-cpu").
	cpuDriver = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}-x86_64-cpu$`)
)

// hotCPUProps are the topology properties a hot-plugged VCPU may carry.
var hotCPUProps = map[string]bool{"socket-id": true, "die-id": true, "cluster-id": true, "module-id": true, "core-id": true, "thread-id": true}

// CheckHotCPUs rebuilds the VCPUs a suspend image says were hot-plugged,
// refusing anything SetVCPUs would not have made: an id of the strict
// form cpu-hot-S-C-T whose numbers are the device's own topology, a CPU
// driver, small integer topology properties and nothing else, no more
// than VCPUs_max allows beyond VCPUs_at_startup, no id twice.
func CheckHotCPUs(hot []CPUDevice, spec *Spec) ([]CPUDevice, error) {
	if len(hot) == 0 {
		return nil, nil
	}
	if len(hot) > spec.MaxCPU-spec.VCPUs {
		return nil, fmt.Errorf("%d hot-plugged VCPUs, at most %d allowed", len(hot), max(0, spec.MaxCPU-spec.VCPUs))
	}
	seen := map[string]bool{}
	out := make([]CPUDevice, 0, len(hot))
	for _, c := range hot {
		if !hotCPUID.MatchString(c.ID) || seen[c.ID] {
			return nil, fmt.Errorf("bad hot-plugged VCPU id %q", c.ID)
		}
		seen[c.ID] = true
		args := map[string]any{"id": c.ID}
		for k, v := range c.Args {
			switch {
			case k == "id":
				if v != c.ID {
					return nil, fmt.Errorf("VCPU %s: id %v", c.ID, v)
				}
			case k == "driver":
				s, ok := v.(string)
				if !ok || !cpuDriver.MatchString(s) {
					return nil, fmt.Errorf("VCPU %s: driver %v", c.ID, v)
				}
				args[k] = s
			case hotCPUProps[k]:
				n, ok := smallInt(v)
				if !ok || n >= MaxVCPUs {
					return nil, fmt.Errorf("VCPU %s: %s %v", c.ID, k, v)
				}
				args[k] = n
			default:
				return nil, fmt.Errorf("VCPU %s: property %q", c.ID, k)
			}
		}
		if _, ok := args["driver"]; !ok {
			return nil, fmt.Errorf("VCPU %s: no driver", c.ID)
		}
		socket, ok1 := args["socket-id"].(int64)
		core, ok2 := args["core-id"].(int64)
		thread, ok3 := args["thread-id"].(int64)
		if !ok1 || !ok2 || !ok3 || fmt.Sprintf("cpu-hot-%d-%d-%d", socket, core, thread) != c.ID {
			return nil, fmt.Errorf("VCPU %s: topology does not match its id", c.ID)
		}
		out = append(out, CPUDevice{ID: c.ID, Args: args})
	}
	return out, nil
}

// smallInt is a non-negative integer as JSON decoding or Go code holds it.
func smallInt(v any) (int64, bool) {
	switch n := v.(type) {
	case float64:
		if n >= 0 && n <= 1<<20 && n == float64(int64(n)) {
			return int64(n), true
		}
	case int64:
		return n, n >= 0
	case int:
		return int64(n), n >= 0
	}
	return 0, false
}

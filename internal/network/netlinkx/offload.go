package netlinkx

import (
	"unsafe"

	"toolstackd/internal/network"
)

var _ network.Offloads = (*NS)(nil)

// ethtool commands of linux/ethtool.h for generic receive offload.
const (
	ethtoolGGRO = 0x2b
	ethtoolSGRO = 0x2c
)

// ethtoolValue is struct ethtool_value.
type ethtoolValue struct {
	Cmd  uint32
	Data uint32
}

// GRO reports whether generic receive offload is on for a link.
func (n *NS) GRO(name string) (bool, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.h == nil {
		return false, errClosed
	}
	if _, err := n.lookup(name); err != nil {
		return false, err
	}
	v := &ethtoolValue{Cmd: ethtoolGGRO}
	if err := n.worker.ethtoolIoctl(name, unsafe.Pointer(v)); err != nil { // #nosec G103 -- ethtool ABI
		return false, n.translate(err, "read gro", name)
	}
	return v.Data != 0, nil
}

// SetGRO turns generic receive offload on or off on a link of ours.
func (n *NS) SetGRO(name string, on bool) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.h == nil {
		return errClosed
	}
	if _, err := n.ours(name); err != nil {
		return err
	}
	v := &ethtoolValue{Cmd: ethtoolSGRO}
	if on {
		v.Data = 1
	}
	return n.translate(n.worker.ethtoolIoctl(name, unsafe.Pointer(v)), "set gro", name) // #nosec G103 -- ethtool ABI
}

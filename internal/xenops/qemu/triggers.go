package qemu

import (
	"context"
	"fmt"

	"toolstackd/internal/xenops/qemu/qmp"
	"toolstackd/internal/xerr"
)

// Signals to a running guest (VM.send_sysrq, VM.send_trigger), growing a
// disk it has open (VDI.resize_online) and moving a NIC to another bridge
// (VIF.move), each over QMP or on the host's links.

// SendSysrq presses Alt+SysRq+key on the guest's keyboard (QMP send-key):
// Linux guests act on it as on a magic SysRq key. key is a lower-case
// letter or a digit, as the manager checked.
func (q *QEMU) SendSysrq(ctx context.Context, uuid string, key byte) error {
	if !(key >= 'a' && key <= 'z') && !(key >= '0' && key <= '9') {
		return xerr.New(xerr.InvalidValue, "key", string(rune(key)))
	}
	keys := []qmp.KeyValue{
		{Type: "qcode", Data: "alt"},
		{Type: "qcode", Data: "sysrq"},
		{Type: "qcode", Data: string(rune(key))},
	}
	_, err := q.command(ctx, uuid, qmp.SendKey{Keys: keys})
	return err
}

// triggerCommands are the QMP commands of the triggers QEMU can send.
var triggerCommands = map[string]qmp.Command[qmp.Empty]{
	"nmi":      qmp.InjectNMI{},       // an NMI to every VCPU
	"power":    qmp.SystemPowerdown{}, // the ACPI power button
	"s3resume": qmp.SystemWakeup{},    // wake a guest in S3
}

// SendTrigger sends a named trigger (nmi, power, s3resume).
func (q *QEMU) SendTrigger(ctx context.Context, uuid, trigger string) error {
	cmd, ok := triggerCommands[trigger]
	if !ok {
		return xerr.New(xerr.InvalidValue, "trigger", trigger)
	}
	_, err := q.command(ctx, uuid, cmd)
	return err
}

// ResizeDisk grows the disk at device to size bytes with QMP
// block_resize on its active image (the newest live-snapshot overlay, or
// the disk's own format node), which the guest sees at once.
func (q *QEMU) ResizeDisk(ctx context.Context, uuid, device string, size int64) error {
	d, mon, err := q.live(uuid)
	if err != nil {
		return err
	}
	disk, ok := d.disk(device)
	if !ok || disk.Path == "" {
		return fmt.Errorf("qemu: VM %s has no disk %s", uuid, device)
	}
	if disk.ReadOnly || disk.CD {
		return xerr.New(xerr.OperationNotAllowed, "a read-only disk cannot be resized")
	}
	node := nodeName(device)
	if n := len(disk.Overlays); n > 0 {
		node = disk.Overlays[n-1]
	}
	return qmp.Do(ctx, mon, qmp.BlockResize{NodeName: node, Size: size})
}

// MoveNIC moves the NIC at device onto bridge. A NIC on a tap is moved
// to the bridge's ports (the guest sees no change of device); one
// without a tap (user networking, or none) only records the bridge, as
// it reaches no bridge anyway.
func (q *QEMU) MoveNIC(ctx context.Context, uuid, device, bridge string) error {
	d, err := q.dom(uuid)
	if err != nil {
		return err
	}
	nic, ok := d.nic(device)
	if !ok {
		return fmt.Errorf("qemu: VM %s has no NIC %s", uuid, device)
	}
	if nic.Mode == "tap" && nic.Tap != "" {
		if !tapNamePattern.MatchString(nic.Tap) {
			return fmt.Errorf("qemu: not a tap of ours: %q", nic.Tap)
		}
		if !validBridgeName(bridge) || !q.taps().HasBridge(bridge) {
			return xerr.New(xerr.OperationNotAllowed, "bridge "+bridge+" does not exist on this host")
		}
		if err := q.taps().MoveTap(ctx, nic.Tap, bridge); err != nil {
			return err
		}
	}
	return q.record(d, func(j *qemuJournal) {
		for i := range j.NICs {
			if j.NICs[i].Device == device {
				j.NICs[i].Bridge = bridge
			}
		}
	})
}

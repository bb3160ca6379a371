package qemu

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"toolstackd/internal/nbd"
	"toolstackd/internal/xenops/backend"
	"toolstackd/internal/xerr"
)

// optEscape escapes a value for QEMU's key=value,key=value option syntax,
// in which a literal comma is written twice.
func optEscape(s string) string { return strings.ReplaceAll(s, ",", ",,") }

func jsonArg(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// IDESlot maps a userdevice 0-3 to the PC's IDE bus and unit, as xapi
// maps devices 0-3 of an HVM guest to hda-hdd.
func IDESlot(device string) (bus string, unit int, ok bool) {
	n, err := strconv.Atoi(device)
	if err != nil || n < 0 || n > 3 {
		return "", 0, false
	}
	return "ide." + strconv.Itoa(n/2), n % 2, true
}

// nodeName and devID name a VBD's QEMU objects after its userdevice.
func nodeName(device string) string { return "vbd" + device + "-fmt" }
func devID(device string) string    { return "vbd" + device }
func nicID(device string) string    { return "vif" + device }
func netID(device string) string    { return "net" + device }

// blockdevArg is the JSON -blockdev / blockdev-add object for a disk.
func blockdevArg(d backend.Disk) map[string]any {
	format := d.Format
	if format == "" {
		format = "raw"
	}
	if format == "vhd" {
		format = "vpc"
	}
	return map[string]any{"driver": format, "node-name": nodeName(d.Device), "read-only": d.ReadOnly, "file": protocolNode(d.Path, d.ReadOnly)}
}

// protocolNode is how QEMU reaches an image: a file, a block device, or
// an NBD export given as a URI (nbd://host:port/export or
// nbd+unix:///export?socket=PATH), read by nbd.ParseURI as storage reads
// it. A path in an NBD scheme that does not parse (storage never hands
// one over) goes to QEMU's nbd driver as its filename, for QEMU to refuse
// with its own message.
func protocolNode(path string, ro bool) map[string]any {
	if nbd.IsURI(path) {
		u, err := nbd.ParseURI(path)
		if err != nil {
			return map[string]any{"driver": "nbd", "filename": path, "read-only": ro}
		}
		return map[string]any{"driver": "nbd", "export": u.Export, "read-only": ro, "server": u.QEMUServer()}
	}
	driver := "file"
	if st, err := os.Stat(path); err == nil && st.Mode()&os.ModeDevice != 0 {
		driver = "host_device"
	}
	return map[string]any{"driver": driver, "filename": path, "read-only": ro}
}

// diskDevice is the JSON -device / device_add object for a disk or CD.
func diskDevice(d backend.Disk, diskBus string, bootindex int) (map[string]any, error) {
	dev := map[string]any{"id": devID(d.Device)}
	if d.Path != "" {
		dev["drive"] = nodeName(d.Device)
	}
	if bootindex > 0 {
		dev["bootindex"] = bootindex
	}
	switch {
	case d.CD:
		bus, unit, ok := IDESlot(d.Device)
		if !ok {
			return nil, xerr.New(xerr.InvalidDevice, d.Device)
		}
		dev["driver"], dev["bus"], dev["unit"] = "ide-cd", bus, unit
	case diskBus == "ide":
		bus, unit, ok := IDESlot(d.Device)
		if !ok {
			return nil, xerr.New(xerr.InvalidDevice, d.Device)
		}
		dev["driver"], dev["bus"], dev["unit"] = "ide-hd", bus, unit
	default:
		dev["driver"] = "virtio-blk-pci"
		dev["addr"] = pciAddr(diskSlot0, d.Device)
	}
	return dev, nil
}

// Every PCI device has a fixed slot, so that a domain rebuilt for a
// resume has its devices where the saved state says, whatever order they
// were plugged in: VGA 2, balloon 3, VIFs 4-10, disks 11-26.
const (
	nicSlot0  = 4
	diskSlot0 = 11
)

func pciAddr(base int, device string) string {
	n, _ := strconv.Atoi(device)
	return fmt.Sprintf("0x%x", base+n)
}

// nicModel is the emulated NIC: platform:nic_type, default virtio.
func nicModel(platform map[string]string) string {
	switch m := platform["nic_type"]; m {
	case "e1000", "rtl8139", "virtio-net-pci", "e1000e":
		return m
	}
	return "virtio-net-pci"
}

func nicDevice(n backend.NIC, model string, bootindex int) map[string]any {
	dev := map[string]any{"driver": model, "id": nicID(n.Device), "netdev": netID(n.Device), "mac": n.MAC,
		"addr": pciAddr(nicSlot0, n.Device)}
	if bootindex > 0 {
		dev["bootindex"] = bootindex
	}
	return dev
}

// netdevArg is the JSON -netdev / netdev_add object for a NIC, or nil
// when the NIC has no backend on this host.
func netdevArg(n backend.NIC) map[string]any {
	switch n.Mode {
	case "tap":
		return map[string]any{"type": "tap", "id": netID(n.Device), "ifname": n.Tap, "script": "no", "downscript": "no"}
	case "user":
		return map[string]any{"type": "user", "id": netID(n.Device)}
	}
	return nil
}

// qemuArgv is the emulator's command line for a domain: the machine and
// its fixed devices, what the platform keys choose, firmware and direct
// kernel boot, then the domain's disks, NICs and hot-added VCPUs. For a
// jailed domain (jail.go), h hands over what lies outside its directory.
func (q *QEMU) qemuArgv(j *qemuJournal, h handoff) ([]string, error) {
	s := &j.Spec
	a := q.machineArgs(j)
	a = append(a, platformArgs(s)...)
	boot, err := q.bootArgs(j, h)
	if err != nil {
		return nil, err
	}
	a = append(a, boot...)
	devs, err := deviceArgs(j, h)
	if err != nil {
		return nil, err
	}
	a = append(a, devs...)
	if !s.AutoStart || s.Incoming {
		a = append(a, "-S") // created paused: Unpause starts it
	}
	switch {
	case s.Incoming:
		// Waits for migrate-incoming (ReceiveLive, migrate.go).
		a = append(a, "-incoming", "defer")
	case s.RestoreFrom != "":
		a = append(a, "-incoming", "fd:3")
	}
	return a, nil
}

// machineArgs are the machine, its CPUs and memory, the sockets the
// daemon talks to it through and the devices every domain has.
func (q *QEMU) machineArgs(j *qemuJournal) []string {
	s := &j.Spec
	machine := q.cfg.Machine
	if machine == "" {
		machine = "pc"
	}
	mopts := machine + ",accel=" + j.Accel
	if !backend.PlatformTrue(s.Platform, "acpi", true) {
		mopts += ",acpi=off"
	}
	cpu := q.cpuModel(j.Accel)
	if j.Accel == "kvm" && backend.PlatformTrue(s.Platform, "viridian", false) {
		cpu += ",hv_relaxed,hv_vapic,hv_spinlocks=0x1fff,hv_time"
	}
	maxcpus := max(s.MaxCPU, s.VCPUs)
	smp := fmt.Sprintf("%d,maxcpus=%d", s.VCPUs, maxcpus)
	if cps, err := strconv.Atoi(s.Platform["cores-per-socket"]); err == nil && cps > 0 && maxcpus%cps == 0 {
		smp += fmt.Sprintf(",sockets=%d,cores=%d,threads=1", maxcpus/cps, cps)
	}
	a := []string{
		"-name", "guest=" + optEscape(s.Name) + ",debug-threads=on",
		"-uuid", s.UUID,
		"-machine", mopts,
		"-cpu", cpu,
		"-m", strconv.FormatInt(s.Memory>>20, 10),
		"-smp", smp,
		"-nodefaults", "-no-user-config",
		"-no-shutdown", "-no-reboot",
		"-msg", "timestamp=on",
		"-display", "none",
		"-qmp", "unix:" + optEscape(jailPath(j, j.QMPPath)) + ",server=on,wait=off",
		"-vnc", "unix:" + optEscape(jailPath(j, j.VNCPath)),
		"-chardev", "socket,id=serial0,path=" + optEscape(jailPath(j, j.SerialPath)) + ",server=on,wait=off",
		"-serial", "chardev:serial0",
		"-smbios", "type=1,uuid=" + s.UUID,
		"-device", "virtio-balloon-pci,id=balloon0,addr=0x3",
		"-device", "pvpanic",
	}
	if j.Jail != nil {
		// QEMU resolves a pid file's directory by its full path, which a
		// jailed emulator may not search: the daemon knows the pid anyway.
		return append(a, sandboxArgs...)
	}
	return append(a, "-pidfile", j.Dir+"/qemu.pid")
}

// platformArgs are what the platform keys timeoffset, vga and usb choose.
func platformArgs(s *backend.Spec) []string {
	// platform:timeoffset is the guest clock's offset from UTC in seconds.
	base := "utc"
	if off, err := strconv.ParseInt(s.Platform["timeoffset"], 10, 64); err == nil && off != 0 {
		base = time.Now().UTC().Add(time.Duration(off) * time.Second).Format("2006-01-02T15:04:05")
	}
	a := []string{"-rtc", "base=" + base}
	switch v := s.Platform["vga"]; v {
	case "none":
	case "cirrus":
		a = append(a, "-device", "cirrus-vga,id=video0,addr=0x2")
	default:
		a = append(a, "-device", "VGA,id=video0,addr=0x2")
	}
	if backend.PlatformTrue(s.Platform, "usb", true) {
		a = append(a, "-usb", "-device", "usb-tablet,id=tablet0")
	}
	return a
}

// bootArgs are the UEFI firmware and its variable store, and a direct
// kernel boot's kernel, initrd and command line.
func (q *QEMU) bootArgs(j *qemuJournal, h handoff) ([]string, error) {
	s := &j.Spec
	var a []string
	if s.Firmware == "uefi" {
		code, vars := q.cfg.OVMFCode, j.Dir+"/OVMF_VARS.fd"
		if h != nil {
			for _, f := range []struct {
				path *string
				ro   bool
			}{{&code, true}, {&vars, false}} {
				fs, err := openImage(*f.path, f.ro)
				if err != nil {
					return nil, xerr.New(xerr.FailedToStartEmulator, s.VMRef, "qemu", "UEFI firmware: "+err.Error())
				}
				if *f.path, err = h.fdset(fs, "firmware"); err != nil {
					return nil, err
				}
			}
		}
		a = append(a,
			"-drive", "if=pflash,format=raw,unit=0,readonly=on,file="+optEscape(code),
			"-drive", "if=pflash,format=raw,unit=1,file="+optEscape(vars))
	}
	if s.Kernel != "" {
		kernel, initrd := s.Kernel, s.Ramdisk
		if j.Jail != nil { // copied by Build
			kernel, initrd = jailPath(j, j.Dir+"/kernel"), jailPath(j, j.Dir+"/initrd")
		}
		a = append(a, "-kernel", kernel)
		if s.Ramdisk != "" {
			a = append(a, "-initrd", initrd)
		}
		if s.Cmdline != "" {
			a = append(a, "-append", s.Cmdline)
		}
	}
	return a, nil
}

// deviceArgs are the domain's disks, NICs and hot-added VCPUs, the disks
// and NICs with their boot order.
func deviceArgs(j *qemuJournal, h handoff) ([]string, error) {
	s := &j.Spec
	var a []string
	// Boot order by bootindex: BIOS order letters c (disk), d (CD), n
	// (network), then whatever is left.
	boot := bootIndexes(s.BootOrder, j.Disks, j.NICs, s.Kernel != "")
	diskBus := s.Platform["disk-bus"]
	for _, d := range j.Disks {
		if d.Path != "" {
			bd, err := blockdevFor(h, d)
			if err != nil {
				return nil, err
			}
			a = append(a, "-blockdev", jsonArg(bd))
		}
		dev, err := diskDevice(d, diskBus, boot["vbd"+d.Device])
		if err != nil {
			return nil, err
		}
		a = append(a, "-device", jsonArg(dev))
	}
	model := nicModel(s.Platform)
	for _, n := range j.NICs {
		nd, err := netdevFor(h, n)
		if err != nil {
			return nil, err
		}
		if nd == nil {
			continue
		}
		a = append(a, "-netdev", jsonArg(nd), "-device", jsonArg(nicDevice(n, model, boot["vif"+n.Device])))
	}
	for _, c := range j.HotCPUs {
		a = append(a, "-device", jsonArg(c.Args))
	}
	return a, nil
}

// bootIndexes gives each bootable device its bootindex from the BIOS
// order string.
func bootIndexes(order string, disks []backend.Disk, nics []backend.NIC, direct bool) map[string]int {
	out := map[string]int{}
	if direct {
		return out
	}
	if order == "" {
		order = "cd"
	}
	next := 1
	add := func(key string) {
		if _, done := out[key]; !done {
			out[key] = next
			next++
		}
	}
	for _, c := range strings.ToLower(order) {
		switch c {
		case 'c':
			for _, d := range disks {
				if !d.CD && d.Path != "" && d.Bootable {
					add("vbd" + d.Device)
				}
			}
			for _, d := range disks {
				if !d.CD && d.Path != "" {
					add("vbd" + d.Device)
				}
			}
		case 'd':
			for _, d := range disks {
				if d.CD {
					add("vbd" + d.Device)
				}
			}
		case 'n':
			for _, n := range nics {
				if n.Mode != "none" {
					add("vif" + n.Device)
				}
			}
		}
	}
	return out
}

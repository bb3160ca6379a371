package api

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/schema"
	"toolstackd/internal/version"
)

// Version facts toolstackd reports as host.software_version and
// API_version.
const (
	ProductVersion  = "0.1.0"
	PlatformVersion = "0.1.0"
	// XapiVersion is the xapi version we answer as; the Go SDK refuses a
	// host without software_version["xapi"].
	XapiVersion     = "25.6.0"
	APIVersionMajor = 2
	APIVersionMinor = 21
)

// BootOptions describe the host a first boot creates.
type BootOptions struct {
	RootPasswordHash string
	Hostname         string // default: the machine's
	Iterations       int
}

// HostFacts are what first boot learns about the machine.
type HostFacts struct {
	Hostname  string
	Address   string
	Device    string // management interface
	MAC       string
	CPUs      int
	CPUModel  string
	CPUVendor string
	CPUFlags  string
	MemTotal  int64
	MemFree   int64
}

// ProbeHost reads the facts of this machine (best effort: missing facts
// get neutral values).
func ProbeHost() HostFacts {
	f := HostFacts{Hostname: "localhost", Address: "127.0.0.1", Device: "lo", MAC: "00:00:00:00:00:00", CPUs: runtime.NumCPU()}
	if h, err := os.Hostname(); err == nil && h != "" {
		f.Hostname = h
	}
	if ifs, err := net.Interfaces(); err == nil {
	search:
		for _, ifc := range ifs {
			if ifc.Flags&net.FlagLoopback != 0 || ifc.Flags&net.FlagUp == 0 {
				continue
			}
			addrs, _ := ifc.Addrs()
			for _, a := range addrs {
				if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil {
					f.Address, f.Device, f.MAC = ipn.IP.String(), ifc.Name, ifc.HardwareAddr.String()
					break search
				}
			}
		}
	}
	if fh, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(fh)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			k, v, ok := strings.Cut(sc.Text(), ":")
			if !ok {
				continue
			}
			k, v = strings.TrimSpace(k), strings.TrimSpace(v)
			switch {
			case k == "model name" && f.CPUModel == "":
				f.CPUModel = v
			case k == "vendor_id" && f.CPUVendor == "":
				f.CPUVendor = v
			case k == "flags" && f.CPUFlags == "":
				f.CPUFlags = v
			}
		}
		_ = fh.Close()
	}
	if fh, err := os.Open("/proc/meminfo"); err == nil {
		sc := bufio.NewScanner(fh)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 2 {
				continue
			}
			n, _ := strconv.ParseInt(fields[1], 10, 64)
			switch fields[0] {
			case "MemTotal:":
				f.MemTotal = n << 10
			case "MemAvailable:":
				f.MemFree = n << 10
			}
		}
		_ = fh.Close()
	}
	return f
}

// FirstBoot fills an empty database with a usable single-host pool: the
// pool, this host with its metrics and CPUs, the control domain, the
// management network and PIF, the built-in templates, the seven roles and
// the root account. It returns the host's ref.
func FirstBoot(d *db.DB, facts HostFacts, opts BootOptions) (string, error) {
	if opts.Hostname != "" {
		facts.Hostname = opts.Hostname
	}
	var hostRef string
	_, err := d.Update(func(tx *db.Tx) error {
		if err := insertAccounts(tx, opts); err != nil {
			return err
		}
		now := time.Now().UTC()
		cpuInfo := map[string]string{
			"cpu_count": strconv.Itoa(facts.CPUs), "socket_count": "1", "vendor": facts.CPUVendor,
			"modelname": facts.CPUModel, "flags": facts.CPUFlags, "speed": "0", "family": "0", "model": "0", "stepping": "0",
		}
		var err error
		if hostRef, err = insertHost(tx, facts, now, cpuInfo); err != nil {
			return err
		}
		if err := insertHostCPUs(tx, facts, hostRef); err != nil {
			return err
		}
		if err := insertControlDomain(tx, facts, now, hostRef); err != nil {
			return err
		}
		if err := insertManagementNetwork(tx, facts, now, hostRef); err != nil {
			return err
		}
		for _, t := range builtinTemplates() {
			if _, err := tx.Insert(dm.VM.Class, "", t.Row()); err != nil {
				return err
			}
		}
		if _, err := tx.Insert(dm.Pool.Class, "", (&dm.PoolRecord{Master: dm.HostRef(hostRef), OtherConfig: map[string]string{},
			CPUInfo: cpuInfo, Restrictions: map[string]string{}, GuiConfig: map[string]string{}, HealthCheckConfig: map[string]string{},
			GuestAgentConfig: map[string]string{}, HAConfiguration: map[string]string{}}).Row()); err != nil {
			return err
		}
		return nil
	})
	return hostRef, err
}

// insertAccounts records the roles and the root account, with the
// password hash of opts.
func insertAccounts(tx *db.Tx, opts BootOptions) error {
	for _, r := range roleNames() {
		if _, err := tx.Insert(dm.Role.Class, "", (&dm.RoleRecord{NameLabel: r[0], NameDescription: r[1]}).Row()); err != nil {
			return err
		}
	}
	_, err := tx.Insert(dm.User.Class, "", (&dm.UserRecord{ShortName: "root", Fullname: "root", OtherConfig: map[string]string{},
		PasswordHash: opts.RootPasswordHash}).Row())
	return err
}

// insertHost records this host, as facts describe it, booted at now,
// and its metrics; it returns the host's ref.
func insertHost(tx *db.Tx, facts HostFacts, now time.Time, cpuInfo map[string]string) (string, error) {
	metrics, err := tx.Insert(dm.HostMetrics.Class, "", (&dm.HostMetricsRecord{MemoryTotal: facts.MemTotal, MemoryFree: facts.MemFree,
		Live: true, LastUpdated: now, OtherConfig: map[string]string{}}).Row())
	if err != nil {
		return "", err
	}
	host := &dm.HostRecord{
		NameLabel: facts.Hostname, NameDescription: "Default install",
		APIVersionMajor: APIVersionMajor, APIVersionMinor: APIVersionMinor, APIVersionVendor: "toolstackd",
		APIVersionVendorImplementation: map[string]string{}, Enabled: true,
		SoftwareVersion: map[string]string{
			"product_version": ProductVersion, "product_version_text": ProductVersion, "product_version_text_short": ProductVersion,
			"platform_name": "toolstackd", "platform_version": PlatformVersion, "product_brand": "toolstackd",
			"xapi": XapiVersion, "xapi_build": XapiVersion, "xen": "kvm", "hostname": facts.Hostname,
			"date": now.Format("2006-01-02"), "build_number": version.Version, "linux": kernelRelease(),
		},
		OtherConfig:  map[string]string{"agent_start_time": fmt.Sprint(now.Unix())},
		Capabilities: []string{"hvm-3.0-x86_64"}, CPUConfiguration: map[string]string{}, SchedPolicy: "credit",
		SupportedBootloaders: []string{"pygrub", "eliloader"}, Logging: map[string]string{},
		Hostname: facts.Hostname, Address: facts.Address, Metrics: dm.HostMetricsRef(metrics),
		LicenseParams: map[string]string{}, CPUInfo: cpuInfo, Edition: "free", Editions: []string{"free"},
		MemoryOverhead: 0, BIOSStrings: map[string]string{}, ChipsetInfo: map[string]string{"iommu": "false"},
		Display: dm.HostDisplayEnabled, NTPMode: dm.HostNTPModeDHCP, Timezone: "UTC",
	}
	return tx.Insert(dm.Host.Class, "", host.Row())
}

// insertHostCPUs records the CPUs of the host hostRef.
func insertHostCPUs(tx *db.Tx, facts HostFacts, hostRef string) error {
	for i := 0; i < facts.CPUs; i++ {
		if _, err := tx.Insert(dm.HostCPU.Class, "", (&dm.HostCPURecord{Host: dm.HostRef(hostRef), Number: int64(i), Vendor: facts.CPUVendor,
			Modelname: facts.CPUModel, Flags: facts.CPUFlags, Features: "", OtherConfig: map[string]string{}}).Row()); err != nil {
			return err
		}
	}
	return nil
}

// insertControlDomain records the control domain of the host hostRef,
// the host OS itself, started at now, with its metrics.
func insertControlDomain(tx *db.Tx, facts HostFacts, now time.Time, hostRef string) error {
	dom0Metrics, err := tx.Insert(dm.VMMetrics.Class, "", (&dm.VMMetricsRecord{MemoryActual: facts.MemTotal, VCPUsNumber: int64(facts.CPUs),
		StartTime: now, InstallTime: now, LastUpdated: now, OtherConfig: map[string]string{}}).Row())
	if err != nil {
		return err
	}
	dom0 := &dm.VMRecord{
		NameLabel: "Control domain on host: " + facts.Hostname, NameDescription: "The domain which manages physical devices and manages other domains",
		PowerState: dm.VMPowerStateRunning, IsControlDomain: true, ResidentOn: dm.HostRef(hostRef), Domid: 0,
		MemoryStaticMax: facts.MemTotal, MemoryDynamicMax: facts.MemTotal, MemoryDynamicMin: facts.MemTotal, MemoryStaticMin: facts.MemTotal,
		MemoryTarget: facts.MemTotal, VCPUsMax: int64(facts.CPUs), VCPUsAtStartup: int64(facts.CPUs), Metrics: dm.VMMetricsRef(dom0Metrics),
		DomainType: dm.DomainTypePV, OtherConfig: map[string]string{"storage_driver_domain": ""},
	}
	dom0Ref, err := tx.Insert(dm.VM.Class, "", dom0.Row())
	if err != nil {
		return err
	}
	return tx.Set(dm.Host.ControlDomain, hostRef, dom0Ref)
}

// insertManagementNetwork records the management network, on bridge
// xenbr0, and the host hostRef's management PIF on it, with its metrics.
func insertManagementNetwork(tx *db.Tx, facts HostFacts, now time.Time, hostRef string) error {
	bridge := "xenbr0"
	network, err := tx.Insert(dm.Network.Class, "", (&dm.NetworkRecord{NameLabel: "Pool-wide network associated with " + facts.Device,
		MTU: 1500, Bridge: bridge, Managed: true, OtherConfig: map[string]string{}, Purpose: []dm.NetworkPurpose{}}).Row())
	if err != nil {
		return err
	}
	pifMetrics, err := tx.Insert(dm.PIFMetrics.Class, "", (&dm.PIFMetricsRecord{Carrier: true, Speed: 1000, Duplex: true, LastUpdated: now,
		OtherConfig: map[string]string{}}).Row())
	if err != nil {
		return err
	}
	_, err = tx.Insert(dm.PIF.Class, "", (&dm.PIFRecord{Device: facts.Device, Network: dm.NetworkRef(network), Host: dm.HostRef(hostRef),
		MAC: facts.MAC, MTU: 1500, VLAN: -1, Metrics: dm.PIFMetricsRef(pifMetrics), Physical: true, CurrentlyAttached: true,
		IPConfigurationMode: dm.IPConfigurationModeDHCP, IP: facts.Address, Management: true, OtherConfig: map[string]string{},
		Managed: true, Properties: map[string]string{}, Capabilities: []string{}}).Row())
	return err
}

func roleNames() [][2]string {
	return [][2]string{
		{"pool-admin", "The Pool Administrator role has full access to all features and settings"},
		{"pool-operator", "The Pool Operator role manages host- and pool-wide resources"},
		{"vm-power-admin", "The VM Power Administrator role has full access to VM and template management"},
		{"vm-admin", "The VM Administrator role can manage VMs and templates"},
		{"vm-operator", "The VM Operator role can use VMs and interact with VM consoles"},
		{"read-only", "The Read-Only role can log in with basic read-only access"},
		{"client-cert", "The Client-Cert role is for clients authenticated by certificate"},
	}
}

// builtinDisks is the provisioning spec (other_config:disks) of each
// built-in template that installs a known system, by name: one bootable
// system disk at device 0, of the size xapi's templates give that kind
// of guest, on the SR the client writes into sr (left empty: the pool's
// default SR). "Other install media" has none, as the guest is unknown:
// the client makes its disks.
var builtinDisks = map[string]string{
	"Debian Bookworm 12":        systemDiskSpec(10 << 30),
	"Ubuntu Noble Numbat 24.04": systemDiskSpec(10 << 30),
	"Windows 10 (64-bit)":       systemDiskSpec(32 << 30),
}

func systemDiskSpec(size int64) string {
	return `<provision><disk device="0" size="` + strconv.FormatInt(size, 10) + `" sr="" bootable="true" type="system"/></provision>`
}

// upgradeTemplates gives the built-in templates of a database made before
// they had a provisioning spec the spec they have now. xapi recreates its
// default templates at start; here only the missing key is added, so a
// spec an administrator changed stays as it is.
func upgradeTemplates(tx *db.Tx) error {
	var refs []string
	tx.Ascend(dm.VM.Class, func(r *db.Row) bool {
		oc, _ := r.Get(dm.VM.OtherConfig).(map[string]string)
		if _, has := oc["disks"]; !has && r.Get(dm.VM.IsATemplate) == true && r.Get(dm.VM.IsDefaultTemplate) == true &&
			builtinDisks[r.String(dm.VM.NameLabel)] != "" {
			refs = append(refs, r.Ref)
		}
		return true
	})
	for _, ref := range refs {
		row, _ := tx.Get(dm.VM.Class, ref)
		if err := tx.AddToMap(dm.VM.OtherConfig, ref, "disks", builtinDisks[row.String(dm.VM.NameLabel)]); err != nil {
			return err
		}
	}
	return nil
}

func builtinTemplates() []*dm.VMRecord {
	mk := func(name, desc string, memMiB, vcpus int64, extra map[string]string) *dm.VMRecord {
		mem := memMiB << 20
		oc := map[string]string{"install-methods": "cdrom", "default_template": "true", "linux_template": "false"}
		for k, v := range extra {
			oc[k] = v
		}
		if spec := builtinDisks[name]; spec != "" {
			oc["disks"] = spec
		}
		return &dm.VMRecord{
			NameLabel: name, NameDescription: desc, IsATemplate: true, IsDefaultTemplate: true,
			MemoryStaticMax: mem, MemoryDynamicMax: mem, MemoryDynamicMin: mem, MemoryStaticMin: 128 << 20, MemoryTarget: mem,
			VCPUsMax: vcpus, VCPUsAtStartup: vcpus, HVMBootPolicy: "BIOS order", HVMBootParams: map[string]string{"order": "cd"},
			Platform:    map[string]string{"acpi": "1", "apic": "true", "pae": "true", "nx": "true", "viridian": "false", "device-model": "qemu-upstream-compat"},
			OtherConfig: oc, DomainType: dm.DomainTypeHVM, UserVersion: 1,
			Recommendations:      `<restrictions><restriction field="memory-static-max" max="1099511627776"/><restriction field="vcpus-max" max="64"/></restrictions>`,
			ActionsAfterShutdown: dm.OnNormalExitDestroy, ActionsAfterReboot: dm.OnNormalExitRestart, ActionsAfterCrash: dm.OnCrashBehaviourRestart,
		}
	}
	return []*dm.VMRecord{
		mk("Other install media", "Template which allows VM installation from install media", 1024, 1, nil),
		mk("Debian Bookworm 12", "Template for Debian 12 (64-bit)", 2048, 2, map[string]string{"linux_template": "true"}),
		mk("Ubuntu Noble Numbat 24.04", "Template for Ubuntu 24.04 (64-bit)", 2048, 2, map[string]string{"linux_template": "true"}),
		mk("Windows 10 (64-bit)", "Template for Windows 10 (64-bit)", 4096, 2, map[string]string{"viridian": "true"}),
	}
}

func kernelRelease() string {
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// ClearOperations forgets every operation recorded in progress
// (current_operations): a host starting, or a new coordinator taking over,
// owns none of them.
func ClearOperations(m *schema.Model, tx *db.Tx) error {
	for _, c := range m.Classes {
		f := c.Field("current_operations")
		if f == nil || !c.InDB {
			continue
		}
		var busy []string
		tx.Ascend(c, func(r *db.Row) bool {
			if m, ok := r.Get(f).(map[string]string); ok && len(m) > 0 {
				busy = append(busy, r.Ref)
			}
			return true
		})
		for _, ref := range busy {
			if err := tx.Set(f, ref, map[string]string{}); err != nil {
				return err
			}
		}
	}
	return nil
}

// StartupReset brings a loaded database in line with a fresh start, as
// xapi does: operations that were in progress are forgotten, every host
// is not live until proven (this one is, now), this host's facts and
// software version are refreshed, and built-in templates get what newer
// versions give them (upgradeTemplates).
func StartupReset(d *db.DB, hostRef string, facts HostFacts) error {
	_, err := d.Update(func(tx *db.Tx) error {
		if err := ClearOperations(d.Model(), tx); err != nil {
			return err
		}
		if err := upgradeTemplates(tx); err != nil {
			return err
		}
		host, ok := tx.Get(dm.Host.Class, hostRef)
		if !ok {
			return fmt.Errorf("this host %s is not in the database", hostRef)
		}
		var hosts []*db.Row
		tx.Ascend(dm.Host.Class, func(r *db.Row) bool { hosts = append(hosts, r); return true })
		for _, h := range hosts {
			m, _ := h.Get(dm.Host.Metrics).(string)
			if _, ok := tx.Get(dm.HostMetrics.Class, m); ok {
				if err := tx.Set(dm.HostMetrics.Live, m, h.Ref == hostRef); err != nil {
					return err
				}
			}
		}
		sv, _ := host.Get(dm.Host.SoftwareVersion).(map[string]string)
		next := map[string]string{}
		for k, v := range sv {
			next[k] = v
		}
		next["product_version"], next["platform_version"], next["xapi"] = ProductVersion, PlatformVersion, XapiVersion
		next["build_number"] = version.Version
		if err := tx.Set(dm.Host.SoftwareVersion, hostRef, next); err != nil {
			return err
		}
		return tx.Set(dm.Host.Address, hostRef, facts.Address)
	})
	return err
}

package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"toolstackd/internal/xenops/qemu/qmp"

	"toolstackd/internal/atomicfile"
	"toolstackd/internal/safepath"
	"toolstackd/internal/xenops/backend"
	"toolstackd/internal/xerr"
)

// Config tunes the QEMU backend.
type Config struct {
	// Binary is the emulator (default qemu-system-x86_64 from PATH).
	Binary string
	// Accel is "auto" (KVM when /dev/kvm is usable and a probe shows
	// QEMU running a VCPU of CPUModel under it, TCG otherwise), "kvm"
	// (KVM or refuse to start) or "tcg".
	Accel string
	// KVMDevice is the KVM device (default /dev/kvm).
	KVMDevice string
	// KVMCheck says whether KVMDevice is usable, and if not why (default:
	// open it and ask its API version, once per device). Tests set it to
	// decide the question without depending on the machine's /dev/kvm.
	KVMCheck func(dev string) (ok bool, why string)
	// CPUModel overrides -cpu (default host with KVM, max with TCG).
	CPUModel string
	// Machine is the machine type (default pc).
	Machine string
	// OVMFCode and OVMFVars are the UEFI firmware and its variable store
	// template (default Debian's ovmf package).
	OVMFCode, OVMFVars string
	// StateDir holds one directory per domain: its journal, sockets,
	// log and firmware variables. It must survive a daemon restart.
	StateDir string
	// NoUserNet leaves a VIF without any network backend when it cannot
	// have a tap on its bridge, instead of user-mode networking.
	NoUserNet bool
	// UnplugTimeout bounds how long an unplug waits for the guest to
	// release a device (default 10 s).
	UnplugTimeout time.Duration
	// ProcessGroup, when set, puts every QEMU in that process group
	// instead of a session of its own: tests whose fake watchdog resets
	// a host by killing its process group (internal/ha/watchdog) need
	// the host's VMs to go with it, as a real reset takes them.
	ProcessGroup int
	// Taps makes NICs' taps (qemu_net.go): the network module when the
	// daemon runs one; nil makes them through netlink in the daemon's
	// own namespace, on bridges that exist there.
	Taps Taps
	// Deprivilege is "auto" (default: jail each emulator when the daemon
	// runs as root, jail.go), "on" (the same, and refuse to run without
	// root) or "off" (emulators run as the daemon's user, unsandboxed).
	Deprivilege string
	// UserBase and Users are the user ids reserved for jailed emulators
	// (default DefaultUserBase and DefaultUsers); no other user of the
	// host may have one of them.
	UserBase, Users int
}

// QEMU runs one qemu-system-x86_64 process per domain and drives it over
// QMP. Processes run in their own session and outlive the daemon; each
// domain's journal (StateDir/UUID/domain.json) lets a new daemon find
// them again.
type QEMU struct {
	cfg Config
	log *slog.Logger

	mu        sync.Mutex
	doms      map[string]*qemuDomain
	nextDomid int64
	notifier  backend.Notifier

	stop chan struct{}
	wg   sync.WaitGroup

	// auto is what Accel "auto" resolved to at start-up, autoReason why
	// (see detectAccel).
	auto, autoReason string

	// jailOn says whether new domains' emulators are jailed (jail.go).
	jailOn bool

	// hostTaps makes taps when Config.Taps is nil (qemu_net.go).
	hostTaps *hostTaps
}

// qemuJournal is what is kept on disk about a domain.
type qemuJournal struct {
	UUID       string
	Domid      int64
	Spec       backend.Spec
	Disks      []backend.Disk
	NICs       []backend.NIC
	Accel      string
	Dir        string
	QMPPath    string
	VNCPath    string
	SerialPath string
	LogPath    string
	Pid        int
	PidStart   uint64
	Complete   bool
	StartTime  time.Time
	HotCPUs    []backend.CPUDevice
	Argv       []string
	// Migration is where an outgoing live migration stands (migrate.go):
	// "" none, migOutgoing under way, migSent sent. An incoming one is
	// Spec.Incoming, cleared once the state has arrived.
	Migration  string `json:",omitempty"`
	MigRunning bool   `json:",omitempty"` // the guest ran when the outgoing migration began
	// Received is set once an incoming migration's state has arrived and
	// cleared by MarkComplete: a restarted daemon finds such a domain
	// paused and leaves the decision to the manager (DomainInfo.Received).
	Received bool `json:",omitempty"`
	// Jail is set for a domain whose emulator is jailed (jail.go).
	Jail *jail `json:",omitempty"`
}

type qemuDomain struct {
	mu       sync.Mutex
	j        qemuJournal
	state    backend.DomainState
	reason   string
	vcpus    int
	memory   int64
	mon      *qmp.Conn
	child    bool
	stopping bool
	exited   chan struct{}
	exitOnce sync.Once
	waiters  []*eventWaiter
	migStats *MigrationStats // the last outgoing migration's (migrate.go)
}

type eventWaiter struct {
	match func(qmp.Event) bool
	ch    chan qmp.Event
}

var (
	_ backend.Backend         = (*QEMU)(nil)
	_ backend.Accelerated     = (*QEMU)(nil)
	_ backend.LiveSnapshotter = (*QEMU)(nil)
	_ backend.Migrator        = (*QEMU)(nil)
)

// New makes the backend and re-attaches to the domains journalled in
// cfg.StateDir: those whose process still runs are managed again (none is
// killed); the others are reported as Gone.
func New(cfg Config, log *slog.Logger) (*QEMU, error) {
	if log == nil {
		log = slog.Default()
	}
	if cfg.Binary == "" {
		cfg.Binary = "qemu-system-x86_64"
	}
	if cfg.Accel == "" {
		cfg.Accel = "auto"
	}
	if cfg.KVMDevice == "" {
		cfg.KVMDevice = "/dev/kvm"
	}
	if cfg.KVMCheck == nil {
		cfg.KVMCheck = kvmAvailable
	}
	if cfg.OVMFCode == "" {
		cfg.OVMFCode = "/usr/share/OVMF/OVMF_CODE.fd"
	}
	if cfg.OVMFVars == "" {
		cfg.OVMFVars = "/usr/share/OVMF/OVMF_VARS.fd"
	}
	if cfg.UnplugTimeout <= 0 {
		cfg.UnplugTimeout = 10 * time.Second
	}
	if cfg.StateDir == "" {
		return nil, errors.New("qemu backend: no state directory")
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, err
	}
	q := &QEMU{cfg: cfg, log: log, doms: map[string]*qemuDomain{}, nextDomid: 1, stop: make(chan struct{}), hostTaps: &hostTaps{}}
	if err := q.decideJail(); err != nil {
		return nil, err
	}
	q.detectAccel()
	ents, err := os.ReadDir(cfg.StateDir)
	if err != nil {
		return nil, err
	}
	for _, e := range ents {
		dir, err := backend.EntryPath(cfg.StateDir, e.Name(), "")
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, "domain.json")) //nolint:gosec // dir is EntryPath'd (safepath) above
		if err != nil {
			continue
		}
		d := &qemuDomain{exited: make(chan struct{})}
		if err := json.Unmarshal(b, &d.j); err != nil || d.j.UUID == "" {
			log.Warn("qemu: unreadable domain journal", "dir", e.Name(), "err", err)
			continue
		}
		if err := q.checkJournal(&d.j, e.Name()); err != nil {
			// Not ours as written: neither managed nor cleaned up.
			log.Warn("qemu: domain journal refused", "dir", e.Name(), "err", err)
			continue
		}
		q.doms[d.j.UUID] = d
		if d.j.Domid >= q.nextDomid {
			q.nextDomid = d.j.Domid + 1
		}
		q.reattach(d)
	}
	q.settleMigrations()
	q.wg.Add(1)
	go q.watch()
	return q, nil
}

// reattach connects to a journalled domain's process if it still runs.
func (q *QEMU) reattach(d *qemuDomain) {
	j := &d.j
	d.vcpus, d.memory = j.Spec.VCPUs, j.Spec.Target
	if !sameProcess(j.Pid, j.PidStart, j.UUID) {
		d.state, d.reason = backend.DomainGone, "emulator process no longer running"
		d.exitOnce.Do(func() { close(d.exited) })
		q.log.Info("qemu: journalled domain has no process", "vm", j.UUID, "pid", j.Pid)
		return
	}
	d.state = backend.DomainRunning
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := q.connect(ctx, d); err != nil {
		q.log.Warn("qemu: re-attached process but QMP is unreachable", "vm", j.UUID, "pid", j.Pid, "err", err)
		return
	}
	d.mu.Lock()
	mon := d.mon
	d.mu.Unlock()
	if st, err := qmp.Run(ctx, mon, qmp.QueryStatus{}); err == nil {
		d.mu.Lock()
		d.state = stateOfStatus(st.Status)
		d.mu.Unlock()
	}
	if cpus, err := qmp.Run(ctx, mon, qmp.QueryCPUsFast{}); err == nil && len(cpus) > 0 {
		d.vcpus = len(cpus)
	}
	q.log.Info("qemu: re-attached to running domain", "vm", j.UUID, "pid", j.Pid, "domid", j.Domid, "state", d.state)
}

func stateOfStatus(s string) backend.DomainState {
	switch s {
	case "running":
		return backend.DomainRunning
	case "shutdown":
		return backend.DomainShutdown
	case "guest-panicked", "internal-error", "io-error":
		return backend.DomainCrashed
	case "inmigrate":
		return backend.DomainBuilding
	}
	return backend.DomainPaused // paused, prelaunch, postmigrate, suspended, ...
}

// Name implements Backend.
func (q *QEMU) Name() string { return "qemu" }

// SetNotify implements Backend.
func (q *QEMU) SetNotify(f func(string)) { q.notifier.Set(f) }

// Close implements Backend: it stops watching and drops QMP connections;
// the processes go on.
func (q *QEMU) Close() {
	select {
	case <-q.stop:
		return
	default:
	}
	close(q.stop)
	q.wg.Wait()
	defer q.hostTaps.close()
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, d := range q.doms {
		d.mu.Lock()
		d.stopping = true // an EOF now is ours, not a death
		if d.mon != nil {
			_ = d.mon.Close()
		}
		d.mu.Unlock()
	}
}

// watch notices the death of processes that are not our children (those
// re-attached after a restart), within half a second.
func (q *QEMU) watch() {
	defer q.wg.Done()
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-q.stop:
			return
		case <-t.C:
		}
		doms := q.domains()
		for _, d := range doms {
			d.mu.Lock()
			check := !d.child && d.j.Pid > 0 && d.state != backend.DomainGone
			pid, start, id := d.j.Pid, d.j.PidStart, d.j.UUID
			d.mu.Unlock()
			if check && !sameProcess(pid, start, id) {
				q.processGone(d)
			}
		}
	}
}

func (q *QEMU) dom(uuid string) (*qemuDomain, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	d := q.doms[uuid]
	if d == nil {
		return nil, fmt.Errorf("qemu: no domain for VM %s", uuid)
	}
	return d, nil
}

// record changes a domain's journal under its lock and writes it.
func (q *QEMU) record(d *qemuDomain, change func(j *qemuJournal)) error {
	d.mu.Lock()
	change(&d.j)
	d.mu.Unlock()
	return q.save(d)
}

func (q *QEMU) save(d *qemuDomain) error {
	d.mu.Lock()
	b, err := json.MarshalIndent(&d.j, "", " ")
	dir := d.j.Dir
	d.mu.Unlock()
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(filepath.Join(dir, "domain.json"), b, 0o600)
}

// checkJournal refuses a journal that does not describe a domain of this
// state directory: its uuid is its directory's name, its files are in
// that directory, its sockets there or in a socket directory of ours,
// its taps named as setupNIC names them. Destroy removes what a journal
// names, so a journal must not be able to name anything else.
func (q *QEMU) checkJournal(j *qemuJournal, name string) error {
	dir, err := backend.EntryPath(q.cfg.StateDir, name, "")
	if err != nil {
		return err
	}
	if j.UUID != name || j.Dir != dir || j.LogPath != filepath.Join(dir, "qemu.log") {
		return fmt.Errorf("journal names %q in %q, expected %q", j.UUID, j.Dir, dir)
	}
	sd := filepath.Dir(j.QMPPath)
	if sd != dir && !isTempSockDir(sd) {
		return fmt.Errorf("socket directory %q", sd)
	}
	if j.QMPPath != filepath.Join(sd, "qmp.sock") || j.VNCPath != filepath.Join(sd, "vnc.sock") || j.SerialPath != filepath.Join(sd, "serial.sock") {
		return fmt.Errorf("socket paths %q %q %q", j.QMPPath, j.VNCPath, j.SerialPath)
	}
	if j.Spec.UUID != j.UUID {
		return fmt.Errorf("spec for %q", j.Spec.UUID)
	}
	for _, n := range j.NICs {
		if n.Tap != "" && !tapNamePattern.MatchString(n.Tap) {
			return fmt.Errorf("tap %q", n.Tap)
		}
	}
	if jl := j.Jail; jl != nil {
		if !q.inRange(jl.UID) || jl.Dir != "" && !isProcFd(jl.Dir) || jl.SockDir != "" && !isProcFd(jl.SockDir) {
			return fmt.Errorf("jail %d %q %q", jl.UID, jl.Dir, jl.SockDir)
		}
	}
	return nil
}

func (q *QEMU) accel(spec *backend.Spec) (string, error) {
	switch q.cfg.Accel {
	case "tcg":
		return "tcg", nil
	case "kvm":
		if ok, why := q.cfg.KVMCheck(q.cfg.KVMDevice); !ok {
			q.log.Warn("qemu: KVM required but unusable", "reason", why)
			return "", xerr.New(xerr.VMHVMRequired, spec.VMRef)
		}
		return "kvm", nil
	default:
		return q.auto, nil
	}
}

// Check implements Backend.
func (q *QEMU) Check(spec *backend.Spec) error {
	if _, err := exec.LookPath(q.cfg.Binary); err != nil {
		return xerr.New(xerr.FailedToStartEmulator, spec.VMRef, "qemu", "cannot find the emulator "+q.cfg.Binary+": "+err.Error())
	}
	if _, err := q.accel(spec); err != nil {
		return err
	}
	if spec.Firmware == "uefi" {
		for _, f := range []string{q.cfg.OVMFCode, q.cfg.OVMFVars} {
			if _, err := os.Stat(f); err != nil {
				return xerr.New(xerr.FailedToStartEmulator, spec.VMRef, "qemu", "UEFI firmware missing: "+err.Error())
			}
		}
	}
	return nil
}

// sockDir picks where a domain's sockets go: its own directory, unless
// that makes a path too long for a Unix socket.
func (q *QEMU) sockDir(dir, uuid string) string {
	if len(dir)+len("/serial.sock") < 100 {
		return dir
	}
	short := filepath.Base(dir) // the uuid, already checked to be a plain name
	if len(short) > 8 {
		short = short[:8]
	}
	return filepath.Join(os.TempDir(), sockDirPrefix+short+"-"+strconv.FormatInt(time.Now().UnixNano()%1e6, 36))
}

// Create implements Backend.
func (q *QEMU) Create(ctx context.Context, spec *backend.Spec) (int64, error) {
	accel, err := q.accel(spec)
	if err != nil {
		return 0, err
	}
	q.mu.Lock()
	if old := q.doms[spec.UUID]; old != nil {
		q.mu.Unlock()
		return 0, xerr.New(xerr.DomainExists, spec.VMRef, strconv.FormatInt(old.j.Domid, 10))
	}
	dir, err := backend.EntryPath(q.cfg.StateDir, spec.UUID, "")
	if err != nil {
		q.mu.Unlock()
		return 0, err
	}
	domid := q.nextDomid
	q.nextDomid++
	d := &qemuDomain{state: backend.DomainBuilding, exited: make(chan struct{}), vcpus: spec.VCPUs, memory: spec.Target}
	var jl *jail
	if q.jailOn {
		uid, err := q.allocUID()
		if err != nil {
			q.mu.Unlock()
			return 0, err
		}
		jl = &jail{UID: uid}
	}
	sd := q.sockDir(dir, spec.UUID)
	d.j = qemuJournal{UUID: spec.UUID, Domid: domid, Spec: *spec, Accel: accel, Dir: dir,
		QMPPath: filepath.Join(sd, "qmp.sock"), VNCPath: filepath.Join(sd, "vnc.sock"), SerialPath: filepath.Join(sd, "serial.sock"),
		LogPath: filepath.Join(dir, "qemu.log"), HotCPUs: spec.HotCPUs, Jail: jl}
	q.doms[spec.UUID] = d
	q.mu.Unlock()
	fail := func(err error) (int64, error) {
		q.mu.Lock()
		delete(q.doms, spec.UUID)
		q.mu.Unlock()
		_ = removeBelow(q.cfg.StateDir, dir)
		if sd != dir {
			_ = removeBelow(os.TempDir(), sd)
		}
		return 0, err
	}
	_ = removeBelow(q.cfg.StateDir, dir) // leftovers of a domain destroyed half-way
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fail(err)
	}
	if err := os.MkdirAll(sd, 0o700); err != nil {
		return fail(err)
	}
	if jl != nil {
		if err := ownDirs(jl.UID, dir, sd); err != nil {
			return fail(err)
		}
	}
	if err := q.save(d); err != nil {
		return fail(err)
	}
	return domid, nil
}

// Build implements Backend: it checks the boot files and makes the UEFI
// variable store.
func (q *QEMU) Build(ctx context.Context, uuid string) error {
	d, err := q.dom(uuid)
	if err != nil {
		return err
	}
	s := &d.j.Spec
	for _, f := range []string{s.Kernel, s.Ramdisk} {
		if f == "" {
			continue
		}
		if _, err := os.Stat(f); err != nil {
			return xerr.New(xerr.BootloaderFailed, s.VMRef, err.Error())
		}
	}
	if s.Incoming && s.RestoreFrom != "" {
		return fmt.Errorf("qemu: VM %s cannot both resume from an image and receive a migration", uuid)
	}
	if s.RestoreFrom != "" {
		if _, err := os.Stat(s.RestoreFrom); err != nil {
			return xerr.New(xerr.SuspendImageNotAccessible, s.RestoreFrom)
		}
	}
	if s.Firmware == "uefi" {
		vars, err := safepath.Join(d.j.Dir, "OVMF_VARS.fd")
		if err != nil {
			return err
		}
		if _, err := os.Stat(vars); err != nil {
			if err := backend.CopyFile(q.cfg.OVMFVars, vars); err != nil {
				return xerr.New(xerr.FailedToStartEmulator, s.VMRef, "qemu", "UEFI variable store: "+err.Error())
			}
		}
	}
	if jl := d.j.Jail; jl != nil {
		// QEMU's loader opens a direct boot's files by name: they are
		// copied to where the emulator's user can read them.
		for _, f := range []struct{ src, name string }{{s.Kernel, "kernel"}, {s.Ramdisk, "initrd"}} {
			if f.src == "" {
				continue
			}
			if err := copyOwned(f.src, d.j.Dir, f.name, jl.UID); err != nil {
				return xerr.New(xerr.BootloaderFailed, s.VMRef, f.name+": "+err.Error())
			}
		}
	}
	return nil
}

// AddDisk implements Backend.
func (q *QEMU) AddDisk(ctx context.Context, uuid string, disk backend.Disk) error {
	d, err := q.dom(uuid)
	if err != nil {
		return err
	}
	return q.record(d, func(j *qemuJournal) { j.Disks = append(j.Disks, disk) })
}

// AddNIC implements Backend: it makes the NIC's tap (or decides on
// user-mode networking) now, so the device model finds it ready.
func (q *QEMU) AddNIC(ctx context.Context, uuid string, n backend.NIC) error {
	d, err := q.dom(uuid)
	if err != nil {
		return err
	}
	return q.setupNIC(ctx, d, &n)
}

// StartDeviceModel implements Backend.
func (q *QEMU) StartDeviceModel(ctx context.Context, uuid string) error {
	d, err := q.dom(uuid)
	if err != nil {
		return err
	}
	d.mu.Lock()
	j := d.j
	d.mu.Unlock()
	vm := j.Spec.VMRef
	// What QEMU inherits: a resume's image first (fd 3, -incoming fd:3),
	// then a jailed domain's directories, images and taps.
	h := &startHandoff{}
	defer h.close()
	if j.Spec.RestoreFrom != "" {
		img, _, err := backend.OpenImageStream(j.Spec.RestoreFrom, backend.RecQEMU)
		if err != nil {
			q.log.Warn("qemu: unusable suspend image", "vm", j.UUID, "err", err)
			return xerr.New(xerr.SuspendImageNotAccessible, j.Spec.RestoreFrom)
		}
		h.add(img)
	}
	var hand handoff
	if jl := j.Jail; jl != nil {
		names := *jl
		if names.Dir, err = h.dir(j.Dir); err != nil {
			return err
		}
		names.SockDir = names.Dir
		if sd := filepath.Dir(j.QMPPath); sd != j.Dir {
			if names.SockDir, err = h.dir(sd); err != nil {
				return err
			}
		}
		j.Jail, hand = &names, h
	}
	argv, err := q.qemuArgv(&j, hand)
	if err != nil {
		return err
	}
	argv = append(h.args, argv...)
	d.mu.Lock()
	d.j.Argv, d.j.Jail = argv, j.Jail
	d.mu.Unlock()
	logf, err := os.OpenFile(j.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	cmd := exec.Command(q.cfg.Binary, argv...) //nolint:gosec // the configured QEMU binary, argv built here; no shell
	cmd.Dir = j.Dir
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own session: signals to the daemon's process group never reach
	// it, and it outlives the daemon.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if q.cfg.ProcessGroup > 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pgid: q.cfg.ProcessGroup}
	}
	if j.Jail != nil {
		cmd.SysProcAttr.Credential = q.credential(&j)
		cmd.Dir = "/"
	}
	cmd.ExtraFiles = h.files
	err = cmd.Start()
	_ = logf.Close()
	if err != nil {
		return xerr.New(xerr.FailedToStartEmulator, vm, "qemu", err.Error())
	}
	pid := cmd.Process.Pid
	start, _ := procStartTime(pid)
	d.mu.Lock()
	d.j.Pid, d.j.PidStart, d.child = pid, start, true
	d.mu.Unlock()
	go func() {
		_ = cmd.Wait()
		q.processGone(d)
	}()
	if err := q.save(d); err != nil {
		return err
	}
	if err := q.connect(ctx, d); err != nil {
		select {
		case <-d.exited:
			return xerr.New(xerr.FailedToStartEmulator, vm, "qemu", emulatorError(j.LogPath))
		default:
		}
		return err
	}
	d.mu.Lock()
	mon := d.mon
	d.mu.Unlock()
	if j.Spec.RestoreFrom != "" {
		if err := q.waitRestored(ctx, d, mon); err != nil {
			return err
		}
	}
	d.mu.Lock()
	d.state = backend.DomainPaused
	if j.Spec.AutoStart && !j.Spec.Incoming {
		d.state = backend.DomainRunning
	}
	if j.Spec.Incoming {
		d.state = backend.DomainBuilding // "inmigrate" until ReceiveLive
	}
	d.j.StartTime = time.Now().UTC()
	d.mu.Unlock()
	return q.save(d)
}

// emulatorError is the useful part of a failed emulator's log.
func emulatorError(logPath string) string {
	msg := tailFile(logPath, 600)
	if msg == "" {
		msg = "the emulator exited during start-up"
	}
	return msg
}

func (q *QEMU) waitRestored(ctx context.Context, d *qemuDomain, mon *qmp.Conn) error {
	for {
		st, err := qmp.Run(ctx, mon, qmp.QueryStatus{})
		if err != nil {
			select {
			case <-d.exited:
				return xerr.New(xerr.FailedToStartEmulator, d.j.Spec.VMRef, "qemu", emulatorError(d.j.LogPath))
			default:
			}
			return err
		}
		if st.Status != "inmigrate" {
			return nil
		}
		select {
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		case <-d.exited:
			return xerr.New(xerr.FailedToStartEmulator, d.j.Spec.VMRef, "qemu", emulatorError(d.j.LogPath))
		}
	}
}

// connect waits for the domain's QMP socket and connects to it.
func (q *QEMU) connect(ctx context.Context, d *qemuDomain) error {
	path := d.j.QMPPath
	const delay = 2 * time.Millisecond
	for {
		dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		mon, err := qmp.Dial(dctx, path, func(ev qmp.Event) { q.onEvent(d, ev) })
		cancel()
		if err == nil {
			d.mu.Lock()
			if old := d.mon; old != nil {
				_ = old.Close()
			}
			d.mon = mon
			d.mu.Unlock()
			go func() {
				<-mon.Done()
				// An EOF usually means the process ended; make sure.
				time.Sleep(50 * time.Millisecond)
				d.mu.Lock()
				pid, start, id, child := d.j.Pid, d.j.PidStart, d.j.UUID, d.child
				d.mu.Unlock()
				if !child && !sameProcess(pid, start, id) {
					q.processGone(d)
				}
			}()
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-d.exited:
			return fmt.Errorf("qemu exited before its monitor came up")
		case <-time.After(delay):
		}
	}
}

// onEvent follows QEMU's events (called from the QMP reader).
func (q *QEMU) onEvent(d *qemuDomain, ev qmp.Event) {
	d.mu.Lock()
	for i := 0; i < len(d.waiters); i++ {
		w := d.waiters[i]
		if w.match(ev) {
			select {
			case w.ch <- ev:
			default:
			}
			d.waiters = append(d.waiters[:i:i], d.waiters[i+1:]...)
			i--
		}
	}
	changed := false
	switch ev.Event {
	case "SHUTDOWN":
		var data struct {
			Guest  bool
			Reason string
		}
		_ = json.Unmarshal(ev.Data, &data) // malformed data reads as the zero value: the safe default
		if data.Guest {
			switch data.Reason {
			case "guest-reset":
				d.state = backend.DomainReboot
			case "guest-panic":
				d.state, d.reason = backend.DomainCrashed, "guest panicked"
			default:
				d.state = backend.DomainShutdown
			}
			changed = true
		}
	case "GUEST_PANICKED":
		d.state, d.reason, changed = backend.DomainCrashed, "guest panicked", true
	case "STOP":
		if d.state == backend.DomainRunning {
			d.state, changed = backend.DomainPaused, true
		}
	case "RESUME":
		if d.state == backend.DomainPaused {
			d.state, changed = backend.DomainRunning, true
		}
	}
	uuid := d.j.UUID
	stopping := d.stopping
	d.mu.Unlock()
	if changed && !stopping {
		go q.notifier.Tell(uuid)
	}
}

// processGone records that a domain's process has ended.
func (q *QEMU) processGone(d *qemuDomain) {
	first := false
	d.exitOnce.Do(func() { close(d.exited); first = true })
	if !first {
		return
	}
	d.mu.Lock()
	expected := d.stopping
	if !expected {
		switch d.state {
		case backend.DomainShutdown, backend.DomainReboot, backend.DomainCrashed:
		default:
			d.state, d.reason = backend.DomainCrashed, "emulator exited: "+truncate(tailFile(d.j.LogPath, 300), 300)
		}
	}
	uuid := d.j.UUID
	d.mu.Unlock()
	if !expected {
		q.log.Warn("qemu: emulator process ended", "vm", uuid)
		q.notifier.Tell(uuid)
	}
}

func (q *QEMU) monitor(d *qemuDomain) (*qmp.Conn, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.mon == nil {
		return nil, fmt.Errorf("qemu: domain %s has no monitor connection", d.j.UUID)
	}
	select {
	case <-d.exited:
		return nil, fmt.Errorf("qemu: domain %s has no running emulator", d.j.UUID)
	default:
	}
	return d.mon, nil
}

// MarkComplete implements Backend.
func (q *QEMU) MarkComplete(uuid string) error {
	d, err := q.dom(uuid)
	if err != nil {
		return err
	}
	return q.record(d, func(j *qemuJournal) { j.Complete, j.Received = true, false })
}

// live finds a domain and its monitor connection: the start of every
// call that talks to a running emulator.
func (q *QEMU) live(uuid string) (*qemuDomain, *qmp.Conn, error) {
	d, err := q.dom(uuid)
	if err != nil {
		return nil, nil, err
	}
	mon, err := q.monitor(d)
	if err != nil {
		return d, nil, err
	}
	return d, mon, nil
}

// command runs cmd on a running domain's monitor.
func (q *QEMU) command(ctx context.Context, uuid string, cmd qmp.Command[qmp.Empty]) (*qemuDomain, error) {
	d, mon, err := q.live(uuid)
	if err != nil {
		return d, err
	}
	return d, qmp.Do(ctx, mon, cmd)
}

// disk returns a copy of the domain's disk at device.
func (d *qemuDomain) disk(device string) (backend.Disk, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if i := d.j.diskIndex(device); i >= 0 {
		return d.j.Disks[i], true
	}
	return backend.Disk{}, false
}

// diskIndex is where the disk at device is in the journal, or -1.
func (j *qemuJournal) diskIndex(device string) int {
	return slices.IndexFunc(j.Disks, func(x backend.Disk) bool { return x.Device == device })
}

// nic returns a copy of the domain's NIC at device.
func (d *qemuDomain) nic(device string) (backend.NIC, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if i := slices.IndexFunc(d.j.NICs, func(x backend.NIC) bool { return x.Device == device }); i >= 0 {
		return d.j.NICs[i], true
	}
	return backend.NIC{}, false
}

// dropBlockNode removes a block node; failures are ignored, as it is only
// ever tidying up after the device that used the node.
func dropBlockNode(ctx context.Context, mon *qmp.Conn, node string) {
	_ = qmp.Do(ctx, mon, qmp.BlockdevDel{NodeName: node})
}

// Pause implements Backend.
func (q *QEMU) Pause(ctx context.Context, uuid string) error {
	return q.setRunState(ctx, uuid, qmp.Stop{}, backend.DomainPaused)
}

// Unpause implements Backend.
func (q *QEMU) Unpause(ctx context.Context, uuid string) error {
	if d, err := q.dom(uuid); err == nil {
		d.mu.Lock()
		running := d.state == backend.DomainRunning && !d.j.Complete && d.j.Spec.AutoStart
		d.mu.Unlock()
		if running {
			return nil // started by itself (Spec.AutoStart)
		}
	}
	if err := q.setRunState(ctx, uuid, qmp.Cont{}, backend.DomainRunning); err != nil {
		return err
	}
	return q.forgetSent(uuid)
}

// setRunState pauses or resumes the guest with the QMP command cmd ("stop"
// or "cont") and records the state it leaves the domain in. A domain
// whose guest has already stopped is refused (backend.RefuseStopped).
func (q *QEMU) setRunState(ctx context.Context, uuid string, cmd qmp.Command[qmp.Empty], to backend.DomainState) error {
	if d, err := q.dom(uuid); err == nil {
		d.mu.Lock()
		err := backend.RefuseStopped(d.state, d.j.Spec.VMRef)
		d.mu.Unlock()
		if err != nil {
			return err
		}
	}
	d, err := q.command(ctx, uuid, cmd)
	if err != nil {
		return err
	}
	d.mu.Lock()
	d.state = to
	d.mu.Unlock()
	return nil
}

// RequestShutdown implements Backend.
func (q *QEMU) RequestShutdown(ctx context.Context, uuid string) error {
	_, err := q.command(ctx, uuid, qmp.SystemPowerdown{})
	return err
}

// Suspend implements Backend: QEMU migrates the domain into a file it is
// handed over the monitor socket. The file starts with the image header
// (the domain's description); QEMU's migration stream follows it.
func (q *QEMU) Suspend(ctx context.Context, uuid, path string, progress func(float64)) error {
	d, mon, err := q.live(uuid)
	if err != nil {
		return err
	}
	d.mu.Lock()
	wasRunning := d.state == backend.DomainRunning
	d.mu.Unlock()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR|os.O_TRUNC, 0o600) //nolint:gosec // a suspend image path in the suspend dir
	if err != nil {
		return err
	}
	defer func(c func() error) { _ = c() }(f.Close)
	lengthAt, err := backend.WriteImageHeader(f, d.imageMeta(), backend.RecQEMU)
	if err != nil {
		return err
	}
	// QEMU gets the same open file, positioned after the header.
	if _, err := qmp.RunFD(ctx, mon, qmp.GetFD{FDName: "suspend"}, int(f.Fd())); err != nil {
		return err
	}
	if wasRunning {
		if err := q.Pause(ctx, uuid); err != nil {
			return err
		}
	}
	if err := q.migrateToFile(ctx, mon, progress); err != nil {
		q.cancelMigration(mon, uuid, wasRunning)
		return err
	}
	if err := backend.FinishImage(f, lengthAt); err != nil {
		q.cancelMigration(mon, uuid, wasRunning)
		return err
	}
	d.mu.Lock()
	d.state = backend.DomainPaused
	d.mu.Unlock()
	return nil
}

// imageMeta is the suspend image's header: what a restore needs to build
// the same domain again.
func (d *qemuDomain) imageMeta() *backend.ImageMeta {
	d.mu.Lock()
	meta := &backend.ImageMeta{Spec: d.j.Spec, Disks: append([]backend.Disk(nil), d.j.Disks...), NICs: append([]backend.NIC(nil), d.j.NICs...),
		HotCPUs: append([]backend.CPUDevice(nil), d.j.HotCPUs...), Backend: "qemu"}
	d.mu.Unlock()
	meta.Spec.RestoreFrom, meta.Spec.HotCPUs = "", nil
	return meta
}

// migrateToFile runs QEMU's migration into the file passed as "suspend"
// and waits for it to complete, reporting its progress.
func (q *QEMU) migrateToFile(ctx context.Context, mon *qmp.Conn, progress func(float64)) error {
	// Saving would crawl at QEMU's default migration speed (32 MiB/s).
	bandwidth := int64(8) << 30
	_ = qmp.Do(ctx, mon, qmp.MigrateSetParameters{MaxBandwidth: &bandwidth})
	if err := qmp.Do(ctx, mon, qmp.Migrate{URI: "fd:suspend"}); err != nil {
		return err
	}
	for {
		st, err := qmp.Run(ctx, mon, qmp.QueryMigrate{})
		if err != nil {
			return err
		}
		switch st.Status {
		case "completed":
			return nil
		case "failed", "cancelled":
			return fmt.Errorf("saving the memory image failed: %s", st.ErrorDesc)
		}
		if progress != nil && st.RAM.Total > 0 {
			progress(min(0.99, float64(st.RAM.Transferred)/float64(st.RAM.Total)))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// cancelMigration undoes a suspend that failed: the migration is
// cancelled (and waited for), QEMU lets go of the file and a guest that
// ran runs again. The image is the manager's to discard: its path may be
// a storage-owned VDI, which is never removed from here.
func (q *QEMU) cancelMigration(mon *qmp.Conn, uuid string, wasRunning bool) {
	bg, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = qmp.Do(bg, mon, qmp.MigrateCancel{})
	for i := 0; i < 200; i++ {
		st, err := qmp.Run(bg, mon, qmp.QueryMigrate{})
		if err != nil || st.Status != "active" && st.Status != "cancelling" {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	_ = qmp.Do(bg, mon, qmp.CloseFD{FDName: "suspend"})
	if wasRunning {
		_ = q.Unpause(bg, uuid)
	}
}

// Destroy implements Backend. It does not stop half-way: once begun it
// runs to the end, whatever the context says.
func (q *QEMU) Destroy(ctx context.Context, uuid string) error {
	q.mu.Lock()
	d := q.doms[uuid]
	q.mu.Unlock()
	if d == nil {
		dir, err := backend.EntryPath(q.cfg.StateDir, uuid, "")
		if err != nil {
			return err
		}
		_ = removeBelow(q.cfg.StateDir, dir)
		return nil
	}
	d.mu.Lock()
	d.stopping = true
	mon, j, child := d.mon, d.j, d.child
	d.mu.Unlock()
	alive := func() bool {
		select {
		case <-d.exited:
			return false
		default:
		}
		return j.Pid > 0 && (child || sameProcess(j.Pid, j.PidStart, j.UUID))
	}
	if alive() && mon != nil {
		qctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = qmp.Do(qctx, mon, qmp.Quit{})
		cancel()
		if child {
			select {
			case <-d.exited:
			case <-time.After(3 * time.Second):
			}
		} else {
			for i := 0; i < 150 && alive(); i++ {
				time.Sleep(20 * time.Millisecond)
			}
		}
	}
	if alive() {
		if !killProcess(j.Pid, j.PidStart, j.UUID, 10*time.Second) {
			return fmt.Errorf("qemu: process %d of VM %s would not die", j.Pid, uuid)
		}
		if child {
			select {
			case <-d.exited:
			case <-time.After(5 * time.Second):
			}
		}
	}
	d.exitOnce.Do(func() { close(d.exited) })
	if mon != nil {
		_ = mon.Close()
	}
	for _, n := range j.NICs {
		if n.Tap != "" {
			if err := q.deleteTap(n.VIF, n.Tap); err != nil {
				q.log.Warn("qemu: removing tap", "tap", n.Tap, "err", err)
			}
		}
	}
	if sd := filepath.Dir(j.QMPPath); sd != j.Dir && isTempSockDir(sd) {
		if err := removeBelow(os.TempDir(), sd); err != nil {
			q.log.Warn("qemu: socket directory left", "vm", uuid, "err", err)
		}
	}
	if err := removeBelow(q.cfg.StateDir, j.Dir); err != nil {
		q.log.Warn("qemu: state directory left", "vm", uuid, "err", err)
	}
	q.mu.Lock()
	if q.doms[uuid] == d {
		delete(q.doms, uuid)
	}
	q.mu.Unlock()
	return nil
}

// waitEvent registers interest in an event before the command that
// causes it is sent.
func (d *qemuDomain) waitEvent(match func(qmp.Event) bool) *eventWaiter {
	w := &eventWaiter{match: match, ch: make(chan qmp.Event, 1)}
	d.mu.Lock()
	d.waiters = append(d.waiters, w)
	d.mu.Unlock()
	return w
}

func (d *qemuDomain) dropWaiter(w *eventWaiter) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for i, x := range d.waiters {
		if x == w {
			d.waiters = append(d.waiters[:i:i], d.waiters[i+1:]...)
			return
		}
	}
}

func deviceDeleted(id string) func(qmp.Event) bool {
	return func(ev qmp.Event) bool {
		if ev.Event != "DEVICE_DELETED" {
			return false
		}
		var data struct{ Device string }
		_ = json.Unmarshal(ev.Data, &data) // malformed data reads as the zero value: the safe default
		return data.Device == id
	}
}

// deviceDel asks the guest to release a device and waits for it. ok is
// false when the guest did not within the timeout.
func (q *QEMU) deviceDel(ctx context.Context, d *qemuDomain, mon *qmp.Conn, id string, timeout time.Duration) (bool, error) {
	w := d.waitEvent(deviceDeleted(id))
	defer d.dropWaiter(w)
	if err := qmp.Do(ctx, mon, qmp.DeviceDel{ID: id}); err != nil {
		var qe *qmp.Error
		if errors.As(err, &qe) && qe.Class == "DeviceNotFound" {
			return true, nil
		}
		return false, err
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-w.ch:
		return true, nil
	case <-t.C:
		return false, nil
	case <-ctx.Done():
		return false, ctx.Err()
	}
}

// PlugDisk implements Backend.
func (q *QEMU) PlugDisk(ctx context.Context, uuid string, disk backend.Disk) error {
	d, mon, err := q.live(uuid)
	if err != nil {
		return err
	}
	d.mu.Lock()
	bus := d.j.Spec.Platform["disk-bus"]
	d.mu.Unlock()
	if disk.CD {
		return xerr.New(xerr.OperationNotAllowed, "CD drives cannot be hot-plugged; insert media into an existing one")
	}
	dev, err := diskDevice(disk, bus, 0)
	if err != nil {
		return err
	}
	if dev["driver"] != "virtio-blk-pci" {
		return xerr.New(xerr.OperationNotAllowed, "IDE disks cannot be hot-plugged")
	}
	if disk.Path != "" {
		bd, err := blockdevFor(live(ctx, d, mon, devID(disk.Device)), disk)
		if err == nil {
			err = qmp.Do(ctx, mon, qmp.BlockdevAdd(bd))
		}
		if err != nil {
			dropFdsets(context.WithoutCancel(ctx), mon, diskOpaque(disk.Device), "")
			return err
		}
	}
	if err := qmp.Do(ctx, mon, qmp.DeviceAdd(dev)); err != nil {
		if disk.Path != "" {
			dropBlockNode(context.Background(), mon, nodeName(disk.Device))
			dropFdsets(context.Background(), mon, diskOpaque(disk.Device), "")
		}
		return err
	}
	return q.record(d, func(j *qemuJournal) { j.Disks = append(j.Disks, disk) })
}

// UnplugDisk implements Backend.
func (q *QEMU) UnplugDisk(ctx context.Context, uuid, device string, force bool) error {
	d, mon, err := q.live(uuid)
	if err != nil {
		return err
	}
	disk, found := d.disk(device)
	if !found {
		return nil
	}
	timeout := q.cfg.UnplugTimeout
	if force {
		timeout = min(timeout, 2*time.Second)
	}
	ok, err := q.deviceDel(ctx, d, mon, devID(device), timeout)
	if err != nil {
		return err
	}
	if !ok && !force {
		return xerr.New(xerr.DeviceDetachRejected, "VBD", disk.VBD, "the guest did not release the device")
	}
	if ok && disk.Path != "" {
		for i := len(disk.Overlays) - 1; i >= 0; i-- {
			dropBlockNode(ctx, mon, disk.Overlays[i])
		}
		dropBlockNode(ctx, mon, nodeName(device))
		dropFdsets(ctx, mon, diskOpaque(device), "")
	}
	if !ok {
		q.log.Warn("qemu: forced unplug; the guest still holds the device until it reboots", "vm", uuid, "device", device)
	}
	return q.record(d, func(j *qemuJournal) {
		if i := j.diskIndex(device); i >= 0 {
			j.Disks = slices.Delete(j.Disks, i, i+1)
		}
	})
}

// ChangeMedium implements Backend.
func (q *QEMU) ChangeMedium(ctx context.Context, uuid string, disk backend.Disk) error {
	d, mon, err := q.live(uuid)
	if err != nil {
		return err
	}
	name := ""
	if disk.Path == "" {
		err = qmp.Do(ctx, mon, qmp.Eject{ID: devID(disk.Device), Force: true})
	} else {
		format := disk.Format
		if format == "" {
			format = "raw"
		}
		name = disk.Path
		if h := live(ctx, d, mon, devID(disk.Device)); h != nil {
			var fs []*os.File
			if fs, err = openImage(disk.Path, true); err != nil {
				return err
			}
			if name, err = h.fdset(fs, diskOpaque(disk.Device)); err != nil {
				return err
			}
		}
		err = qmp.Do(ctx, mon, qmp.BlockdevChangeMedium{
			ID: devID(disk.Device), Filename: name, Format: format, ReadOnlyMode: "read-only"})
	}
	// The old medium's descriptors go (or the new one's, if it failed).
	if err != nil {
		if strings.HasPrefix(name, "/dev/fdset/") {
			dropFdsets(context.WithoutCancel(ctx), mon, diskOpaque(disk.Device), "")
		}
		return err
	}
	dropFdsets(ctx, mon, diskOpaque(disk.Device), name)
	return q.record(d, func(j *qemuJournal) {
		if i := j.diskIndex(disk.Device); i >= 0 {
			j.Disks[i] = disk
		}
	})
}

// LiveSnapshot makes the image at path (an empty overlay whose backing
// file is what the disk has open) the disk's active image, with QMP
// blockdev-snapshot: storage calls this when it snapshots a VDI a running
// VM writes to.
func (q *QEMU) LiveSnapshot(ctx context.Context, uuid, device, path, format string) error {
	d, mon, err := q.live(uuid)
	if err != nil {
		return err
	}
	disk, ok := d.disk(device)
	if !ok {
		return fmt.Errorf("qemu: VM %s has no disk %s", uuid, device)
	}
	top := nodeName(device)
	if n := len(disk.Overlays); n > 0 {
		top = disk.Overlays[n-1]
	}
	node := fmt.Sprintf("vbd%s-overlay%d", device, len(disk.Overlays)+1)
	if format == "" {
		format = "qcow2"
	}
	file := protocolNode(path, false)
	if h := live(ctx, d, mon, node); h != nil {
		if file, err = handedNode(h, path, false, diskOpaque(device)); err != nil {
			return err
		}
	}
	overlay := qmp.BlockdevAdd{"driver": format, "node-name": node, "backing": nil, "file": file}
	if err := qmp.Do(ctx, mon, overlay); err != nil {
		return err
	}
	if err := qmp.Do(ctx, mon, qmp.BlockdevSnapshot{Node: top, Overlay: node}); err != nil {
		dropBlockNode(context.WithoutCancel(ctx), mon, node)
		return err
	}
	return q.record(d, func(j *qemuJournal) {
		if i := j.diskIndex(device); i >= 0 {
			j.Disks[i].Overlays = append(j.Disks[i].Overlays, node)
			j.Disks[i].Path, j.Disks[i].Format = path, format
		}
	})
}

// PlugNIC implements Backend.
func (q *QEMU) PlugNIC(ctx context.Context, uuid string, n backend.NIC) error {
	d, mon, err := q.live(uuid)
	if err != nil {
		return err
	}
	if err := q.setupNIC(ctx, d, &n); err != nil {
		return err
	}
	nd, err := netdevFor(live(ctx, d, mon, netID(n.Device)), n)
	if err != nil {
		q.forgetNIC(d, n.Device)
		return err
	}
	if nd == nil {
		return nil
	}
	undo := func(err error) error {
		_ = qmp.Do(context.Background(), mon, qmp.NetdevDel{ID: netID(n.Device)})
		q.forgetNIC(d, n.Device)
		return err
	}
	if err := qmp.Do(ctx, mon, qmp.NetdevAdd(nd)); err != nil {
		return undo(err)
	}
	d.mu.Lock()
	model := nicModel(d.j.Spec.Platform)
	d.mu.Unlock()
	if err := qmp.Do(ctx, mon, qmp.DeviceAdd(nicDevice(n, model, 0))); err != nil {
		return undo(err)
	}
	return nil
}

// UnplugNIC implements Backend.
func (q *QEMU) UnplugNIC(ctx context.Context, uuid, device string) error {
	d, mon, err := q.live(uuid)
	if err != nil {
		return err
	}
	nic, found := d.nic(device)
	if !found {
		return nil
	}
	if nic.Mode != "none" {
		ok, err := q.deviceDel(ctx, d, mon, nicID(device), q.cfg.UnplugTimeout)
		if err != nil {
			return err
		}
		if !ok {
			return xerr.New(xerr.DeviceDetachRejected, "VIF", nic.VIF, "the guest did not release the device")
		}
		_ = qmp.Do(ctx, mon, qmp.NetdevDel{ID: netID(device)})
	}
	q.forgetNIC(d, device)
	return nil
}

func (q *QEMU) forgetNIC(d *qemuDomain, device string) {
	d.mu.Lock()
	var tap, vif string
	for i := range d.j.NICs {
		if d.j.NICs[i].Device == device {
			tap, vif = d.j.NICs[i].Tap, d.j.NICs[i].VIF
			d.j.NICs = append(d.j.NICs[:i:i], d.j.NICs[i+1:]...)
			break
		}
	}
	d.mu.Unlock()
	if tap != "" {
		if err := q.deleteTap(vif, tap); err != nil {
			q.log.Warn("qemu: removing tap", "tap", tap, "err", err)
		}
	}
	// The NIC is gone from the domain whatever the file says; a stale
	// entry is dropped again when the domain is next saved.
	if err := q.save(d); err != nil {
		q.log.Warn("qemu: saving domain state", "vm", d.j.UUID, "err", err)
	}
}

// SetVCPUs implements Backend: VCPUs are hot-added from the free slots
// QEMU offers (up to VCPUs_max); only hot-added ones can be removed.
func (q *QEMU) SetVCPUs(ctx context.Context, uuid string, n int) error {
	d, mon, err := q.live(uuid)
	if err != nil {
		return err
	}
	slots, err := qmp.Run(ctx, mon, qmp.QueryHotpluggableCPUs{})
	if err != nil {
		return err
	}
	present := 0
	for _, s := range slots {
		if s.QOMPath != "" {
			present++
		}
	}
	// QEMU lists slots from the highest; plug from the lowest.
	slices.Reverse(slots)
	for _, s := range slots {
		if present >= n {
			break
		}
		if s.QOMPath != "" {
			continue
		}
		id := fmt.Sprintf("cpu-hot-%v-%v-%v", s.Props["socket-id"], s.Props["core-id"], s.Props["thread-id"])
		args := map[string]any{"driver": s.Type, "id": id}
		for k, v := range s.Props {
			if k != "node-id" {
				args[k] = v
			}
		}
		if err := qmp.Do(ctx, mon, qmp.DeviceAdd(args)); err != nil {
			return err
		}
		present++
		d.mu.Lock()
		d.j.HotCPUs = append(d.j.HotCPUs, backend.CPUDevice{ID: id, Args: args})
		d.mu.Unlock()
	}
	for present > n {
		d.mu.Lock()
		if len(d.j.HotCPUs) == 0 {
			d.mu.Unlock()
			return xerr.New(xerr.OperationNotAllowed, "only VCPUs added while the VM runs can be removed while it runs")
		}
		id := d.j.HotCPUs[len(d.j.HotCPUs)-1].ID
		d.mu.Unlock()
		if err := qmp.Do(ctx, mon, qmp.DeviceDel{ID: id}); err != nil {
			return err
		}
		d.mu.Lock()
		d.j.HotCPUs = d.j.HotCPUs[:len(d.j.HotCPUs)-1]
		d.mu.Unlock()
		present--
	}
	d.mu.Lock()
	d.vcpus = n
	d.mu.Unlock()
	return q.save(d)
}

// SetMemoryTarget implements Backend (virtio-balloon).
func (q *QEMU) SetMemoryTarget(ctx context.Context, uuid string, bytes int64) error {
	d, err := q.command(ctx, uuid, qmp.Balloon{Value: bytes})
	if err != nil {
		return err
	}
	d.mu.Lock()
	d.memory = bytes
	d.mu.Unlock()
	return nil
}

func (q *QEMU) info(d *qemuDomain) backend.DomainInfo {
	d.mu.Lock()
	defer d.mu.Unlock()
	i := backend.DomainInfo{UUID: d.j.UUID, Domid: d.j.Domid, State: d.state, Complete: d.j.Complete, StartTime: d.j.StartTime,
		VCPUs: d.vcpus, Memory: d.memory, Reason: d.reason, Migrated: d.j.Migration == migSent,
		Received: d.j.Received && !d.j.Complete, Disks: append([]backend.Disk(nil), d.j.Disks...), NICs: append([]backend.NIC(nil), d.j.NICs...)}
	select {
	case <-d.exited:
	default:
		i.Pid = d.j.Pid
	}
	return i
}

// Info implements Backend.
func (q *QEMU) Info(uuid string) (backend.DomainInfo, bool) {
	q.mu.Lock()
	d := q.doms[uuid]
	q.mu.Unlock()
	if d == nil {
		return backend.DomainInfo{}, false
	}
	return q.info(d), true
}

// domains lists the domains the backend has now.
func (q *QEMU) domains() []*qemuDomain {
	q.mu.Lock()
	defer q.mu.Unlock()
	doms := make([]*qemuDomain, 0, len(q.doms))
	for _, d := range q.doms {
		doms = append(doms, d)
	}
	return doms
}

// List implements Backend.
func (q *QEMU) List() []backend.DomainInfo {
	doms := q.domains()
	out := make([]backend.DomainInfo, 0, len(doms))
	for _, d := range doms {
		out = append(out, q.info(d))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Domid < out[j].Domid })
	return out
}

// ConsolePath implements Backend.
func (q *QEMU) ConsolePath(uuid, protocol string) (string, error) {
	d, err := q.dom(uuid)
	if err != nil {
		return "", err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	switch protocol {
	case "rfb":
		return d.j.VNCPath, nil
	case "vt100":
		return d.j.SerialPath, nil
	}
	return "", fmt.Errorf("qemu: no %s console", protocol)
}

package qmp

import (
	"context"
	"encoding/json"
)

// Command is one QMP command with typed arguments and a typed return
// value. The command's value, marshalled as JSON, is its "arguments"
// object (omitted when it marshals to {}); R is what QEMU returns.
// Commands are defined in this package only (the unexported method), so
// that every one is in Commands and checked against QEMU's own schema by
// the package's tests.
type Command[R any] interface {
	Name() string
	returns() R
}

// Empty is the return value of commands that return nothing ({}).
type Empty struct{}

// Run executes cmd and decodes what QEMU returns.
func Run[R any](ctx context.Context, c *Conn, cmd Command[R]) (R, error) {
	return run(ctx, c, cmd, -1)
}

// RunFD is Run with a file descriptor passed alongside the command
// (add-fd, getfd).
func RunFD[R any](ctx context.Context, c *Conn, cmd Command[R], fd int) (R, error) {
	return run(ctx, c, cmd, fd)
}

// Do executes a command that returns nothing.
func Do(ctx context.Context, c *Conn, cmd Command[Empty]) error {
	_, err := run(ctx, c, cmd, -1)
	return err
}

func run[R any](ctx context.Context, c *Conn, cmd Command[R], fd int) (R, error) {
	var r R
	b, err := json.Marshal(cmd)
	if err != nil {
		return r, err
	}
	var args any
	if string(b) != "{}" {
		args = json.RawMessage(b)
	}
	err = c.execute(ctx, cmd.Name(), args, &r, fd)
	return r, err
}

// The commands, by what they are for. Field names are QEMU's (QAPI)
// member names; a pointer or omitempty field is one QEMU lets a caller
// leave out.

// --- Run state ---

// QueryStatus is query-status.
type QueryStatus struct{}

// StatusInfo is query-status's return.
type StatusInfo struct {
	Running bool   `json:"running"`
	Status  string `json:"status"` // "running", "paused", "inmigrate", "postmigrate", "shutdown", ...
}

// Cont is cont: resume a stopped guest.
type Cont struct{}

// Stop is stop: pause the guest.
type Stop struct{}

// Quit is quit: the emulator exits.
type Quit struct{}

// SystemPowerdown is system_powerdown: the ACPI power button.
type SystemPowerdown struct{}

// SystemReset is system_reset.
type SystemReset struct{}

// SystemWakeup is system_wakeup: wake a guest in S3.
type SystemWakeup struct{}

// InjectNMI is inject-nmi: an NMI to every VCPU.
type InjectNMI struct{}

// SendKey is send-key.
type SendKey struct {
	Keys []KeyValue `json:"keys"`
}

// KeyValue is one key of send-key: Type "qcode" (Data a QKeyCode such
// as "alt") or "number".
type KeyValue struct {
	Type string `json:"type"`
	Data string `json:"data"`
}

// --- VCPUs and memory ---

// QueryCPUsFast is query-cpus-fast.
type QueryCPUsFast struct{}

// CPUInfoFast is one VCPU of query-cpus-fast.
type CPUInfoFast struct {
	CPUIndex int    `json:"cpu-index"`
	QOMPath  string `json:"qom-path"`
	ThreadID int    `json:"thread-id"`
}

// QueryHotpluggableCPUs is query-hotpluggable-cpus.
type QueryHotpluggableCPUs struct{}

// HotpluggableCPU is one slot of query-hotpluggable-cpus: QOMPath is
// empty for a slot with no VCPU plugged.
type HotpluggableCPU struct {
	Type       string         `json:"type"`
	VCPUsCount int            `json:"vcpus-count"`
	Props      map[string]any `json:"props"` // node-id, socket-id, die-id, core-id, thread-id
	QOMPath    string         `json:"qom-path,omitempty"`
}

// QueryBalloon is query-balloon (a QMP error when the guest has no
// balloon device).
type QueryBalloon struct{}

// BalloonInfo is query-balloon's return.
type BalloonInfo struct {
	Actual int64 `json:"actual"`
}

// Balloon is balloon: the guest's memory target, in bytes.
type Balloon struct {
	Value int64 `json:"value"`
}

// --- Devices ---

// DeviceAdd is device_add: a device's driver, id and properties (QEMU's
// schema leaves the properties open: they are the driver's).
type DeviceAdd map[string]any

// DeviceDel is device_del (completed by a DEVICE_DELETED event).
type DeviceDel struct {
	ID string `json:"id"`
}

// NetdevAdd is netdev_add: a network backend's type, id and options.
type NetdevAdd map[string]any

// NetdevDel is netdev_del.
type NetdevDel struct {
	ID string `json:"id"`
}

// --- Block nodes ---

// BlockdevAdd is blockdev-add: a node's driver, node-name and the
// driver's options (BlockdevOptions, a union on driver).
type BlockdevAdd map[string]any

// BlockdevDel is blockdev-del.
type BlockdevDel struct {
	NodeName string `json:"node-name"`
}

// QueryNamedBlockNodes is query-named-block-nodes.
type QueryNamedBlockNodes struct {
	Flat bool `json:"flat,omitempty"`
}

// BlockDeviceInfo is one node of query-named-block-nodes.
type BlockDeviceInfo struct {
	NodeName string `json:"node-name"`
	File     string `json:"file"` // the node's filename (an NBD URI for an NBD node)
	Image    struct {
		VirtualSize int64 `json:"virtual-size"`
	} `json:"image"`
}

// QueryBlockstats is query-blockstats; its return is kept raw, for the
// caller's own decoding.
type QueryBlockstats struct{}

// BlockdevSnapshot is blockdev-snapshot: Overlay (a node already added,
// with no backing) becomes the active layer over Node.
type BlockdevSnapshot struct {
	Node    string `json:"node"`
	Overlay string `json:"overlay"`
}

// BlockResize is block_resize, by node name.
type BlockResize struct {
	NodeName string `json:"node-name"`
	Size     int64  `json:"size"`
}

// Eject is eject: the medium of a removable drive, by device id.
type Eject struct {
	ID    string `json:"id"`
	Force bool   `json:"force,omitempty"`
}

// BlockdevChangeMedium is blockdev-change-medium.
type BlockdevChangeMedium struct {
	ID           string `json:"id"`
	Filename     string `json:"filename"`
	Format       string `json:"format,omitempty"`
	ReadOnlyMode string `json:"read-only-mode,omitempty"` // "retain", "read-only", "read-write"
}

// --- Block jobs (mirrors) ---

// BlockdevMirror is blockdev-mirror.
type BlockdevMirror struct {
	JobID         string `json:"job-id"`
	Device        string `json:"device"` // the source node
	Target        string `json:"target"` // the target node
	Sync          string `json:"sync"`   // "full", "top", "none"
	Speed         int64  `json:"speed,omitempty"`
	BufSize       int64  `json:"buf-size,omitempty"`
	OnSourceError string `json:"on-source-error,omitempty"`
	OnTargetError string `json:"on-target-error,omitempty"`
	AutoDismiss   *bool  `json:"auto-dismiss,omitempty"`
	CopyMode      string `json:"copy-mode,omitempty"` // "background", "write-blocking"
}

// QueryBlockJobs is query-block-jobs.
type QueryBlockJobs struct{}

// BlockJobInfo is one job of query-block-jobs.
type BlockJobInfo struct {
	Device string `json:"device"` // the job id
	Type   string `json:"type"`
	Len    int64  `json:"len"`
	Offset int64  `json:"offset"`
	Ready  bool   `json:"ready"`
	Status string `json:"status"` // JobStatus: "running", "ready", "concluded", ...
	Error  string `json:"error,omitempty"`
}

// BlockJobComplete is block-job-complete: pivot a ready mirror.
type BlockJobComplete struct {
	Device string `json:"device"`
}

// BlockJobCancel is block-job-cancel.
type BlockJobCancel struct {
	Device string `json:"device"`
	Force  bool   `json:"force,omitempty"`
}

// JobDismiss is job-dismiss: forget a concluded job.
type JobDismiss struct {
	ID string `json:"id"`
}

// --- NBD exports ---

// NBDServerStart is nbd-server-start.
type NBDServerStart struct {
	Addr           SocketAddressLegacy `json:"addr"`
	MaxConnections int                 `json:"max-connections,omitempty"`
}

// SocketAddressLegacy is the old form of a socket address, which
// nbd-server-start takes: {"type": "unix", "data": {"path": ...}}.
type SocketAddressLegacy struct {
	Type string `json:"type"`
	Data any    `json:"data"`
}

// UnixSocketAddress is the data of a "unix" SocketAddressLegacy.
type UnixSocketAddress struct {
	Path string `json:"path"`
}

// NBDServerStop is nbd-server-stop.
type NBDServerStop struct{}

// BlockExportAdd is block-export-add of an NBD export.
type BlockExportAdd struct {
	Type     string `json:"type"` // "nbd"
	ID       string `json:"id"`
	NodeName string `json:"node-name"`
	Writable bool   `json:"writable,omitempty"`
	Export   string `json:"name,omitempty"` // the NBD export name
}

// BlockExportDel is block-export-del.
type BlockExportDel struct {
	ID   string `json:"id"`
	Mode string `json:"mode,omitempty"` // "safe", "hard"
}

// QueryBlockExports is query-block-exports.
type QueryBlockExports struct{}

// BlockExportInfo is one export of query-block-exports.
type BlockExportInfo struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	NodeName string `json:"node-name"`
}

// --- File descriptors ---

// AddFD is add-fd (with the descriptor passed alongside): into a new
// set, or the set FdsetID names.
type AddFD struct {
	FdsetID *int   `json:"fdset-id,omitempty"`
	Opaque  string `json:"opaque,omitempty"`
}

// AddfdInfo is add-fd's return.
type AddfdInfo struct {
	FdsetID int `json:"fdset-id"`
	FD      int `json:"fd"`
}

// RemoveFD is remove-fd.
type RemoveFD struct {
	FdsetID int  `json:"fdset-id"`
	FD      *int `json:"fd,omitempty"`
}

// QueryFdsets is query-fdsets.
type QueryFdsets struct{}

// FdsetInfo is one set of query-fdsets.
type FdsetInfo struct {
	FdsetID int `json:"fdset-id"`
	FDs     []struct {
		FD     int    `json:"fd"`
		Opaque string `json:"opaque,omitempty"`
	} `json:"fds"`
}

// GetFD is getfd (with the descriptor passed alongside): QEMU keeps it
// under FDName, for a "fd:FDName" URI.
type GetFD struct {
	FDName string `json:"fdname"`
}

// CloseFD is closefd.
type CloseFD struct {
	FDName string `json:"fdname"`
}

// --- Migration (live, and suspend to a file) ---

// MigrateSetCapabilities is migrate-set-capabilities.
type MigrateSetCapabilities struct {
	Capabilities []MigrationCapabilityStatus `json:"capabilities"`
}

// MigrationCapabilityStatus is one capability's state.
type MigrationCapabilityStatus struct {
	Capability string `json:"capability"` // "events", "auto-converge", "pause-before-switchover", ...
	State      bool   `json:"state"`
}

// MigrateSetParameters is migrate-set-parameters, with the parameters
// toolstackd sets.
type MigrateSetParameters struct {
	DowntimeLimit *int64 `json:"downtime-limit,omitempty"` // milliseconds
	MaxBandwidth  *int64 `json:"max-bandwidth,omitempty"`  // bytes per second
}

// Migrate is migrate.
type Migrate struct {
	URI string `json:"uri"`
}

// MigrateIncoming is migrate-incoming.
type MigrateIncoming struct {
	URI string `json:"uri"`
}

// MigrateContinue is migrate-continue: go on from a pause (State is the
// pause's state, "pre-switchover").
type MigrateContinue struct {
	State string `json:"state"`
}

// MigrateCancel is migrate_cancel.
type MigrateCancel struct{}

// QueryMigrate is query-migrate.
type QueryMigrate struct{}

// MigrationInfo is query-migrate's return.
type MigrationInfo struct {
	Status    string `json:"status"` // "active", "completed", "failed", "cancelling", "pre-switchover", ...
	ErrorDesc string `json:"error-desc,omitempty"`
	TotalTime int64  `json:"total-time,omitempty"`
	Downtime  int64  `json:"downtime,omitempty"`
	RAM       struct {
		Transferred int64 `json:"transferred"`
		Total       int64 `json:"total"`
	} `json:"ram"`
}

// Names and return types. Each command's Name is QEMU's; returns ties
// it to its return type at compile time and is never called.

func (QueryStatus) Name() string             { return "query-status" }
func (QueryStatus) returns() StatusInfo      { return StatusInfo{} }
func (Cont) Name() string                    { return "cont" }
func (Cont) returns() Empty                  { return Empty{} }
func (Stop) Name() string                    { return "stop" }
func (Stop) returns() Empty                  { return Empty{} }
func (Quit) Name() string                    { return "quit" }
func (Quit) returns() Empty                  { return Empty{} }
func (SystemPowerdown) Name() string         { return "system_powerdown" }
func (SystemPowerdown) returns() Empty       { return Empty{} }
func (SystemReset) Name() string             { return "system_reset" }
func (SystemReset) returns() Empty           { return Empty{} }
func (SystemWakeup) Name() string            { return "system_wakeup" }
func (SystemWakeup) returns() Empty          { return Empty{} }
func (InjectNMI) Name() string               { return "inject-nmi" }
func (InjectNMI) returns() Empty             { return Empty{} }
func (SendKey) Name() string                 { return "send-key" }
func (SendKey) returns() Empty               { return Empty{} }
func (QueryCPUsFast) Name() string           { return "query-cpus-fast" }
func (QueryCPUsFast) returns() []CPUInfoFast { return nil }
func (QueryHotpluggableCPUs) Name() string   { return "query-hotpluggable-cpus" }
func (QueryHotpluggableCPUs) returns() []HotpluggableCPU {
	return nil
}
func (QueryBalloon) Name() string                       { return "query-balloon" }
func (QueryBalloon) returns() BalloonInfo               { return BalloonInfo{} }
func (Balloon) Name() string                            { return "balloon" }
func (Balloon) returns() Empty                          { return Empty{} }
func (DeviceAdd) Name() string                          { return "device_add" }
func (DeviceAdd) returns() Empty                        { return Empty{} }
func (DeviceDel) Name() string                          { return "device_del" }
func (DeviceDel) returns() Empty                        { return Empty{} }
func (NetdevAdd) Name() string                          { return "netdev_add" }
func (NetdevAdd) returns() Empty                        { return Empty{} }
func (NetdevDel) Name() string                          { return "netdev_del" }
func (NetdevDel) returns() Empty                        { return Empty{} }
func (BlockdevAdd) Name() string                        { return "blockdev-add" }
func (BlockdevAdd) returns() Empty                      { return Empty{} }
func (BlockdevDel) Name() string                        { return "blockdev-del" }
func (BlockdevDel) returns() Empty                      { return Empty{} }
func (QueryNamedBlockNodes) Name() string               { return "query-named-block-nodes" }
func (QueryNamedBlockNodes) returns() []BlockDeviceInfo { return nil }
func (QueryBlockstats) Name() string                    { return "query-blockstats" }
func (QueryBlockstats) returns() json.RawMessage        { return nil }
func (BlockdevSnapshot) Name() string                   { return "blockdev-snapshot" }
func (BlockdevSnapshot) returns() Empty                 { return Empty{} }
func (BlockResize) Name() string                        { return "block_resize" }
func (BlockResize) returns() Empty                      { return Empty{} }
func (Eject) Name() string                              { return "eject" }
func (Eject) returns() Empty                            { return Empty{} }
func (BlockdevChangeMedium) Name() string               { return "blockdev-change-medium" }
func (BlockdevChangeMedium) returns() Empty             { return Empty{} }
func (BlockdevMirror) Name() string                     { return "blockdev-mirror" }
func (BlockdevMirror) returns() Empty                   { return Empty{} }
func (QueryBlockJobs) Name() string                     { return "query-block-jobs" }
func (QueryBlockJobs) returns() []BlockJobInfo          { return nil }
func (BlockJobComplete) Name() string                   { return "block-job-complete" }
func (BlockJobComplete) returns() Empty                 { return Empty{} }
func (BlockJobCancel) Name() string                     { return "block-job-cancel" }
func (BlockJobCancel) returns() Empty                   { return Empty{} }
func (JobDismiss) Name() string                         { return "job-dismiss" }
func (JobDismiss) returns() Empty                       { return Empty{} }
func (NBDServerStart) Name() string                     { return "nbd-server-start" }
func (NBDServerStart) returns() Empty                   { return Empty{} }
func (NBDServerStop) Name() string                      { return "nbd-server-stop" }
func (NBDServerStop) returns() Empty                    { return Empty{} }
func (BlockExportAdd) Name() string                     { return "block-export-add" }
func (BlockExportAdd) returns() Empty                   { return Empty{} }
func (BlockExportDel) Name() string                     { return "block-export-del" }
func (BlockExportDel) returns() Empty                   { return Empty{} }
func (QueryBlockExports) Name() string                  { return "query-block-exports" }
func (QueryBlockExports) returns() []BlockExportInfo    { return nil }
func (AddFD) Name() string                              { return "add-fd" }
func (AddFD) returns() AddfdInfo                        { return AddfdInfo{} }
func (RemoveFD) Name() string                           { return "remove-fd" }
func (RemoveFD) returns() Empty                         { return Empty{} }
func (QueryFdsets) Name() string                        { return "query-fdsets" }
func (QueryFdsets) returns() []FdsetInfo                { return nil }
func (GetFD) Name() string                              { return "getfd" }
func (GetFD) returns() Empty                            { return Empty{} }
func (CloseFD) Name() string                            { return "closefd" }
func (CloseFD) returns() Empty                          { return Empty{} }
func (MigrateSetCapabilities) Name() string             { return "migrate-set-capabilities" }
func (MigrateSetCapabilities) returns() Empty           { return Empty{} }
func (MigrateSetParameters) Name() string               { return "migrate-set-parameters" }
func (MigrateSetParameters) returns() Empty             { return Empty{} }
func (Migrate) Name() string                            { return "migrate" }
func (Migrate) returns() Empty                          { return Empty{} }
func (MigrateIncoming) Name() string                    { return "migrate-incoming" }
func (MigrateIncoming) returns() Empty                  { return Empty{} }
func (MigrateContinue) Name() string                    { return "migrate-continue" }
func (MigrateContinue) returns() Empty                  { return Empty{} }
func (MigrateCancel) Name() string                      { return "migrate_cancel" }
func (MigrateCancel) returns() Empty                    { return Empty{} }
func (QueryMigrate) Name() string                       { return "query-migrate" }
func (QueryMigrate) returns() MigrationInfo             { return MigrationInfo{} }

// Commands lists one value of every command this package defines, for
// the check against a QEMU's schema (query-qmp-schema).
func Commands() []interface{ Name() string } {
	return []interface{ Name() string }{
		QueryStatus{}, Cont{}, Stop{}, Quit{}, SystemPowerdown{}, SystemReset{}, SystemWakeup{}, InjectNMI{}, SendKey{},
		QueryCPUsFast{}, QueryHotpluggableCPUs{}, QueryBalloon{}, Balloon{},
		DeviceAdd{}, DeviceDel{}, NetdevAdd{}, NetdevDel{},
		BlockdevAdd{}, BlockdevDel{}, QueryNamedBlockNodes{}, QueryBlockstats{}, BlockdevSnapshot{}, BlockResize{}, Eject{}, BlockdevChangeMedium{},
		BlockdevMirror{}, QueryBlockJobs{}, BlockJobComplete{}, BlockJobCancel{}, JobDismiss{},
		NBDServerStart{}, NBDServerStop{}, BlockExportAdd{}, BlockExportDel{}, QueryBlockExports{},
		AddFD{}, RemoveFD{}, QueryFdsets{}, GetFD{}, CloseFD{},
		MigrateSetCapabilities{}, MigrateSetParameters{}, Migrate{}, MigrateIncoming{}, MigrateContinue{}, MigrateCancel{}, QueryMigrate{},
	}
}

package storage

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"toolstackd/internal/nbd"
	"toolstackd/internal/xerr"
)

// Plugin drivers: SR types implemented outside toolstackd by executables,
// one per operation, SMAPIv3 style. PLUGINS.md documents the protocol;
// in short, a plugin directory holds
//
//	volume/<sr type>/Plugin.Query, SR.create, SR.attach, ..., Volume.create, ...
//	datapath/<uri scheme>/Datapath.attach, Datapath.activate, ...
//
// and each call runs the executable named after the operation with a JSON
// request {"method": ..., "params": {...}} on its standard input. Exit
// status 0 and a JSON result on standard output is success; anything
// else is a failure, described by {"error": {"code": ..., "params": [...]}}
// on standard output when the plugin can say more.

const maxPluginOutput = 16 << 20

type pluginDriver struct {
	typ       string
	dir       string
	datapaths map[string]string // URI scheme -> datapath plugin directory
	info      DriverInfo
	timeout   time.Duration
	log       *slog.Logger
	policy    *locationPolicy // where file datapaths may not point
}

// pluginQuery is Plugin.Query's answer.
type pluginQuery struct {
	Plugin             string            `json:"plugin"`
	Name               string            `json:"name"`
	Description        string            `json:"description"`
	Vendor             string            `json:"vendor"`
	Copyright          string            `json:"copyright"`
	Version            string            `json:"version"`
	RequiredAPIVersion string            `json:"required_api_version"`
	Features           []string          `json:"features"`
	Configuration      map[string]string `json:"configuration"`
}

// discoverPlugins finds the volume plugins in dirs (the first directory
// that has a type wins) and asks each for its description.
func discoverPlugins(dirs []string, timeout time.Duration, log *slog.Logger) map[string]Driver {
	out := map[string]Driver{}
	for _, root := range dirs {
		dps := map[string]string{}
		if ents, err := os.ReadDir(filepath.Join(root, "datapath")); err == nil {
			for _, e := range ents {
				if e.IsDir() || e.Type()&fs.ModeSymlink != 0 {
					dps[e.Name()] = filepath.Join(root, "datapath", e.Name())
				}
			}
		}
		ents, err := os.ReadDir(filepath.Join(root, "volume"))
		if err != nil {
			continue
		}
		for _, e := range ents {
			typ := e.Name()
			if _, dup := out[typ]; dup || !(e.IsDir() || e.Type()&fs.ModeSymlink != 0) {
				continue
			}
			p := &pluginDriver{typ: typ, dir: filepath.Join(root, "volume", typ), datapaths: dps, timeout: timeout, log: log}
			if err := p.query(); err != nil {
				log.Error("storage plugin unusable", "type", typ, "dir", p.dir, "err", err)
				continue
			}
			out[typ] = p
			log.Info("storage plugin found", "type", typ, "dir", p.dir)
		}
	}
	return out
}

func (p *pluginDriver) query() error {
	ctx, cancel := context.WithTimeout(context.Background(), min(p.timeout, time.Minute))
	defer cancel()
	var q pluginQuery
	if err := p.call(ctx, p.dir, "Plugin.Query", map[string]any{}, &q); err != nil {
		return err
	}
	p.info = DriverInfo{Type: p.typ, Name: q.Name, Description: q.Description, Vendor: q.Vendor, Copyright: q.Copyright,
		Version: q.Version, Configuration: q.Configuration, Capabilities: q.Features, Formats: []string{"raw"}, Filename: p.dir}
	if p.info.Name == "" {
		p.info.Name = p.typ
	}
	for _, f := range q.Features {
		if f == "SR_SHARED" {
			p.info.Shared = true
		}
	}
	return nil
}

func (p *pluginDriver) Info() DriverInfo { return p.info }

var codeRE = regexp.MustCompile(`^[A-Z][A-Z0-9_]{0,99}$`)

// pluginFailure is what a plugin says about its failure.
type pluginFailure struct {
	Error *struct {
		Code   string   `json:"code"`
		Params []string `json:"params"`
	} `json:"error"`
}

// parsePluginError turns a failed call's output into a XenAPI error: the
// plugin's own code when it is a XenAPI error code or an
// SR_BACKEND_FAILURE_<n>, otherwise SR_BACKEND_FAILURE [status, stdout,
// stderr].
func parsePluginError(status string, stdout, stderr []byte) *xerr.Error {
	var f pluginFailure
	if json.Unmarshal(stdout, &f) == nil && f.Error != nil && codeRE.MatchString(f.Error.Code) {
		params := make([]string, 0, len(f.Error.Params))
		for _, p := range f.Error.Params {
			params = append(params, clip(p, 4096))
		}
		if strings.HasPrefix(f.Error.Code, xerr.SRBackendFailure+"_") || knownCode(f.Error.Code) {
			return xerr.New(f.Error.Code, params...)
		}
		return xerr.New(xerr.SRBackendFailure, status, clip(f.Error.Code+": "+strings.Join(params, "; "), 4096), clip(string(stderr), 4096))
	}
	return xerr.New(xerr.SRBackendFailure, status, clip(string(stdout), 4096), clip(string(stderr), 4096))
}

func clip(s string, n int) string {
	s = strings.ToValidUTF8(s, "?")
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// knownCode lists the XenAPI errors a plugin may raise directly.
func knownCode(code string) bool {
	switch code {
	case xerr.SRFull, xerr.VDIInUse, xerr.VDITooSmall, xerr.VDITooLarge, xerr.VDIReadonly, xerr.VDIMissing, xerr.VDILocationMissing,
		xerr.SRNotEmpty, xerr.SROperationNotSupported, xerr.UnimplementedInSMBackend, xerr.SRNotAttached, xerr.VDIIncompatibleType,
		xerr.OperationNotAllowed, xerr.SRUnhealthy, xerr.VDINotAvailable, xerr.SRSourceSpaceInsufficient:
		return true
	}
	return false
}

// parsePluginResult decodes a successful call's output into out. Empty
// output and null are allowed when the caller expects nothing.
func parsePluginResult(stdout []byte, out any) error {
	trimmed := bytes.TrimSpace(stdout)
	if out == nil {
		if len(trimmed) == 0 || json.Valid(trimmed) {
			return nil
		}
		return errors.New("plugin output is not JSON")
	}
	if len(trimmed) == 0 {
		return errors.New("plugin gave no output")
	}
	return json.Unmarshal(trimmed, out)
}

// call runs one plugin operation.
func (p *pluginDriver) call(ctx context.Context, dir, method string, params, out any) error {
	exe := filepath.Join(dir, method)
	st, err := os.Stat(exe) //nolint:gosec // the operator's plugin dir and a method name from this code
	if err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
		return xerr.New(xerr.UnimplementedInSMBackend, method)
	}
	req, err := json.Marshal(map[string]any{"method": method, "params": params})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe) //nolint:gosec // the operator's plugin dir and a method name from this code; no shell
	cmd.Dir = dir
	cmd.Stdin = bytes.NewReader(req)
	cmd.Env = append(os.Environ(), "TOOLSTACKD_PLUGIN_METHOD="+method)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	stdout, stderr := &capped{n: maxPluginOutput}, &capped{n: 64 << 10}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	start := time.Now()
	err = cmd.Run()
	p.log.Debug("storage plugin call", "type", p.typ, "method", method, "took", time.Since(start), "err", err)
	if ctx.Err() != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return xerr.New(xerr.SMPluginCommunicationFailure, p.typ+": "+method+" timed out")
		}
		return xerr.New(xerr.TaskCancelled, "")
	}
	if err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			return xerr.New(xerr.SMPluginCommunicationFailure, p.typ+": "+method+": "+err.Error())
		}
		return parsePluginError(strconv.Itoa(ee.ExitCode()), stdout.Bytes(), stderr.Bytes())
	}
	if stdout.over {
		return xerr.New(xerr.SMPluginCommunicationFailure, p.typ+": "+method+": output too large")
	}
	if err := parsePluginResult(stdout.Bytes(), out); err != nil {
		return xerr.New(xerr.SMPluginCommunicationFailure, p.typ+": "+method+": "+err.Error())
	}
	return nil
}

// capped keeps the first n bytes written to it.
type capped struct {
	bytes.Buffer
	n    int
	over bool
}

func (c *capped) Write(b []byte) (int, error) {
	if room := c.n - c.Len(); room < len(b) {
		c.over = true
		if room > 0 {
			c.Buffer.Write(b[:room])
		}
		return len(b), nil
	}
	return c.Buffer.Write(b)
}

func (p *pluginDriver) Probe(ctx context.Context, cfg map[string]string) ([]ProbeResult, error) {
	var out []ProbeResult
	if err := p.call(ctx, p.dir, "SR.probe", map[string]any{"configuration": cfg}, &out); err != nil {
		return nil, err
	}
	return out, nil
}

func (p *pluginDriver) Create(ctx context.Context, sr SRSpec) (map[string]string, error) {
	var out struct {
		Configuration map[string]string `json:"configuration"`
	}
	err := p.call(ctx, p.dir, "SR.create", map[string]any{"uuid": sr.UUID, "name": sr.Name, "description": sr.Description,
		"configuration": orEmpty(sr.DeviceConfig), "sm_config": orEmpty(sr.SMConfig), "physical_size": sr.PhysicalSize}, &out)
	if err != nil {
		return nil, err
	}
	if out.Configuration == nil {
		return sr.DeviceConfig, nil
	}
	return out.Configuration, nil
}

func (p *pluginDriver) Attach(ctx context.Context, sr SRSpec) (SR, error) {
	var handle string
	if err := p.call(ctx, p.dir, "SR.attach", map[string]any{"uuid": sr.UUID, "configuration": orEmpty(sr.DeviceConfig)}, &handle); err != nil {
		return nil, err
	}
	if handle == "" {
		return nil, xerr.New(xerr.SMPluginCommunicationFailure, p.typ+": SR.attach returned no SR")
	}
	return &pluginSR{p: p, sr: handle, uris: map[string]string{}}, nil
}

type pluginSR struct {
	p    *pluginDriver
	sr   string
	mu   sync.Mutex
	uris map[string]string // attached key -> datapath URI
}

// pluginVolume is a volume as plugins describe it.
type pluginVolume struct {
	Key                 string            `json:"key"`
	UUID                string            `json:"uuid"`
	Name                string            `json:"name"`
	Description         string            `json:"description"`
	ReadWrite           *bool             `json:"read_write"`
	VirtualSize         int64             `json:"virtual_size"`
	PhysicalUtilisation int64             `json:"physical_utilisation"`
	Sharable            bool              `json:"sharable"`
	URI                 []string          `json:"uri"`
	Keys                map[string]string `json:"keys"`
}

// volume checks a volume a plugin described. Plugin output is not
// trusted: a key becomes the VDI's location, which drivers and tools use
// as a path below the SR, so an absolute key or one with a ".." step is
// refused, as is a URI whose path climbs with "..".
func (v pluginVolume) volume() (Volume, error) {
	if v.Key == "" || v.VirtualSize < 0 || v.PhysicalUtilisation < 0 {
		return Volume{}, errors.New("plugin returned a volume without a key or with a negative size")
	}
	if err := checkVolumeKey(v.Key); err != nil {
		return Volume{}, fmt.Errorf("plugin returned a volume key that is not a relative path inside the SR: %w", err)
	}
	for _, u := range v.URI {
		if err := checkPluginURI(u); err != nil {
			return Volume{}, fmt.Errorf("plugin returned a bad URI %q for volume %s: %w", clip(u, 200), clip(v.Key, 200), err)
		}
	}
	out := Volume{Key: v.Key, UUID: v.UUID, Name: v.Name, Description: v.Description, VirtualSize: v.VirtualSize,
		PhysicalUtilisation: v.PhysicalUtilisation, Sharable: v.Sharable, ReadOnly: v.ReadWrite != nil && !*v.ReadWrite, Format: "raw"}
	if k := v.Keys; k != nil {
		out.Type = k["vdi-type"]
		out.IsSnapshot = k["is-snapshot"] == "true"
		out.SnapshotOf = k["snapshot-of"]
		if t, err := time.Parse(time.RFC3339, k["snapshot-time"]); err == nil {
			out.SnapshotTime = t
		}
	}
	return out, nil
}

func (s *pluginSR) volCall(ctx context.Context, method string, params map[string]any) (Volume, error) {
	params["sr"] = s.sr
	var v pluginVolume
	if err := s.p.call(ctx, s.p.dir, method, params, &v); err != nil {
		return Volume{}, err
	}
	out, err := v.volume()
	if err != nil {
		return Volume{}, xerr.New(xerr.SMPluginCommunicationFailure, s.p.typ+": "+method+": "+err.Error())
	}
	return out, nil
}

func (s *pluginSR) Detach(ctx context.Context) error {
	return s.p.call(ctx, s.p.dir, "SR.detach", map[string]any{"sr": s.sr}, nil)
}

func (s *pluginSR) Destroy(ctx context.Context) error {
	return s.p.call(ctx, s.p.dir, "SR.destroy", map[string]any{"sr": s.sr}, nil)
}

func (s *pluginSR) Stat(ctx context.Context) (SRStat, error) {
	var out struct {
		Name        string `json:"name"`
		Description string `json:"description"`
		TotalSpace  int64  `json:"total_space"`
		FreeSpace   int64  `json:"free_space"`
	}
	if err := s.p.call(ctx, s.p.dir, "SR.stat", map[string]any{"sr": s.sr}, &out); err != nil {
		return SRStat{}, err
	}
	if out.TotalSpace < 0 || out.FreeSpace < 0 {
		return SRStat{}, xerr.New(xerr.SMPluginCommunicationFailure, s.p.typ+": SR.stat: negative space")
	}
	return SRStat{PhysicalSize: out.TotalSpace, FreeSpace: out.FreeSpace, PhysicalUtilisation: max(out.TotalSpace-out.FreeSpace, 0),
		Name: out.Name, Description: out.Description}, nil
}

func (s *pluginSR) Scan(ctx context.Context) ([]Volume, error) {
	var vs []pluginVolume
	if err := s.p.call(ctx, s.p.dir, "SR.ls", map[string]any{"sr": s.sr}, &vs); err != nil {
		return nil, err
	}
	out := make([]Volume, 0, len(vs))
	for _, v := range vs {
		vol, err := v.volume()
		if err != nil {
			return nil, xerr.New(xerr.SMPluginCommunicationFailure, s.p.typ+": SR.ls: "+err.Error())
		}
		out = append(out, vol)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

func (s *pluginSR) SetName(ctx context.Context, name, description string) error {
	err := s.p.call(ctx, s.p.dir, "SR.set_name", map[string]any{"sr": s.sr, "new_name": name}, nil)
	if err == nil {
		err = s.p.call(ctx, s.p.dir, "SR.set_description", map[string]any{"sr": s.sr, "new_description": description}, nil)
	}
	if xerr.HasCode(err, xerr.UnimplementedInSMBackend) {
		return nil
	}
	return err
}

func volKeys(v VolumeSpec) map[string]string {
	k := map[string]string{}
	if v.Type != "" {
		k["vdi-type"] = v.Type
	}
	if v.IsSnapshot {
		k["is-snapshot"] = "true"
		k["snapshot-of"] = v.SnapshotOf
		k["snapshot-time"] = v.Time.UTC().Format(time.RFC3339)
	}
	return k
}

func (s *pluginSR) VolumeCreate(ctx context.Context, v VolumeSpec) (Volume, error) {
	return s.volCall(ctx, "Volume.create", map[string]any{"uuid": v.UUID, "name": v.Name, "description": v.Description,
		"size": v.Size, "sharable": v.Sharable, "keys": volKeys(v)})
}

func (s *pluginSR) VolumeStat(ctx context.Context, key string) (Volume, error) {
	return s.volCall(ctx, "Volume.stat", map[string]any{"key": key})
}

func (s *pluginSR) VolumeDestroy(ctx context.Context, key string) error {
	return s.p.call(ctx, s.p.dir, "Volume.destroy", map[string]any{"sr": s.sr, "key": key}, nil)
}

func (s *pluginSR) VolumeResize(ctx context.Context, key string, size int64) (Volume, error) {
	if err := s.p.call(ctx, s.p.dir, "Volume.resize", map[string]any{"sr": s.sr, "key": key, "new_size": size}, nil); err != nil {
		return Volume{}, err
	}
	return s.VolumeStat(ctx, key)
}

func (s *pluginSR) VolumeSnapshot(ctx context.Context, key string, meta VolumeSpec, live LiveSwitch) (Volume, error) {
	meta.IsSnapshot, meta.SnapshotOf = true, key
	return s.volCall(ctx, "Volume.snapshot", map[string]any{"key": key, "uuid": meta.UUID, "name": meta.Name,
		"description": meta.Description, "keys": volKeys(meta)})
}

func (s *pluginSR) VolumeClone(ctx context.Context, key string, meta VolumeSpec, live LiveSwitch) (Volume, error) {
	return s.volCall(ctx, "Volume.clone", map[string]any{"key": key, "uuid": meta.UUID, "name": meta.Name,
		"description": meta.Description, "keys": volKeys(meta)})
}

func (s *pluginSR) VolumeSetName(ctx context.Context, key, name, description string) error {
	err := s.p.call(ctx, s.p.dir, "Volume.set_name", map[string]any{"sr": s.sr, "key": key, "new_name": name}, nil)
	if err == nil {
		err = s.p.call(ctx, s.p.dir, "Volume.set_description", map[string]any{"sr": s.sr, "key": key, "new_description": description}, nil)
	}
	if xerr.HasCode(err, xerr.UnimplementedInSMBackend) {
		return nil
	}
	return err
}

// datapathFor picks the first of a volume's URIs that a datapath plugin
// serves.
func (s *pluginSR) datapathFor(ctx context.Context, key string) (string, string, error) {
	var v pluginVolume
	if err := s.p.call(ctx, s.p.dir, "Volume.stat", map[string]any{"sr": s.sr, "key": key}, &v); err != nil {
		return "", "", err
	}
	if _, err := v.volume(); err != nil {
		return "", "", xerr.New(xerr.SMPluginCommunicationFailure, s.p.typ+": Volume.stat: "+err.Error())
	}
	for _, uri := range v.URI {
		u, err := url.Parse(uri)
		if err != nil {
			continue
		}
		if dir, ok := s.p.datapaths[u.Scheme]; ok {
			return uri, dir, nil
		}
	}
	return "", "", xerr.New(xerr.SMPluginCommunicationFailure, fmt.Sprintf("%s: no datapath plugin serves volume %s (URIs %v)", s.p.typ, key, v.URI))
}

func (s *pluginSR) dp(key string) (string, string, error) {
	s.mu.Lock()
	uri := s.uris[key]
	s.mu.Unlock()
	if uri == "" {
		return "", "", xerr.New(xerr.OperationNotAllowed, "volume "+key+" is not attached")
	}
	u, err := url.Parse(uri)
	if err != nil {
		return "", "", err
	}
	return uri, s.p.datapaths[u.Scheme], nil
}

func (s *pluginSR) VolumeAttach(ctx context.Context, key string, readonly bool) (Datapath, error) {
	uri, dir, err := s.datapathFor(ctx, key)
	if err != nil {
		return Datapath{}, err
	}
	var d Datapath
	if err := s.p.call(ctx, dir, "Datapath.attach", map[string]any{"uri": uri, "domain": "toolstackd", "readonly": readonly}, &d); err != nil {
		return Datapath{}, err
	}
	switch d.Kind {
	case "nbd":
		if _, err := nbd.ParseURI(d.URI); err != nil {
			return Datapath{}, xerr.New(xerr.SMPluginCommunicationFailure, s.p.typ+": Datapath.attach: "+err.Error())
		}
		d.Format = "raw"
	case "file":
		if !filepath.IsAbs(d.Path) || (d.Format != "raw" && d.Format != "qcow2") {
			return Datapath{}, xerr.New(xerr.SMPluginCommunicationFailure, s.p.typ+": Datapath.attach: a file datapath needs an absolute path and a format (raw or qcow2)")
		}
		if err := s.p.policy.checkDatapathFile(d.Path); err != nil {
			return Datapath{}, xerr.New(xerr.SMPluginCommunicationFailure, fmt.Sprintf("%s: Datapath.attach: refusing file datapath %q: %v", s.p.typ, clip(d.Path, 200), err))
		}
	default:
		return Datapath{}, xerr.New(xerr.SMPluginCommunicationFailure, s.p.typ+": Datapath.attach: kind must be nbd or file")
	}
	d.ReadOnly = readonly
	s.mu.Lock()
	s.uris[key] = uri
	s.mu.Unlock()
	return d, nil
}

func (s *pluginSR) dpCall(ctx context.Context, key, method string) error {
	uri, dir, err := s.dp(key)
	if err != nil {
		return err
	}
	return s.p.call(ctx, dir, method, map[string]any{"uri": uri, "domain": "toolstackd"}, nil)
}

func (s *pluginSR) VolumeActivate(ctx context.Context, key string, readonly bool) error {
	err := s.dpCall(ctx, key, "Datapath.activate")
	if xerr.HasCode(err, xerr.UnimplementedInSMBackend) {
		return nil
	}
	return err
}

func (s *pluginSR) VolumeDeactivate(ctx context.Context, key string) error {
	err := s.dpCall(ctx, key, "Datapath.deactivate")
	if xerr.HasCode(err, xerr.UnimplementedInSMBackend) {
		return nil
	}
	return err
}

func (s *pluginSR) VolumeDetach(ctx context.Context, key string) error {
	if err := s.dpCall(ctx, key, "Datapath.detach"); err != nil && !xerr.HasCode(err, xerr.UnimplementedInSMBackend) {
		return err
	}
	s.mu.Lock()
	delete(s.uris, key)
	s.mu.Unlock()
	return nil
}

package network

import (
	"strconv"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
)

// VIF rate limits (xapi's VIF.qos_algorithm_type "ratelimit" with
// qos_algorithm_params kbps and timeslice_us).
//
// What is limited is what the guest sends, as on Xen, where xapi hands
// the rate to xenopsd, which writes it to the VIF's backend and
// netback's credit scheduler holds back the frames the guest transmits
// beyond it; what the guest receives is not limited. kbps is kilobytes
// (1,024 bytes) per second, not kilobits. timeslice_us is the period
// over which netback replenishes its credit (50 ms when absent or not
// positive, as xenopsd defaults it): here it sets the burst, the rate
// times the timeslice, but never less than the 128 KiB netback allows
// so that a large frame always gets through.
//
// The limit is applied when the VIF's tap is plugged (LockVIF, which
// the tap's plug calls), applied again when the database changes the
// VIF's qos fields while it runs (Watch, with the locking rules), and
// removed when the VIF is unplugged. As xapi does, parameters that do
// not make a limit (kbps missing or not an integer, an unknown type)
// leave the VIF unlimited with a log line; so do kbps that are not
// positive or absurdly large. Applying a valid limit that the kernel
// cannot (no IFB or tc support) is logged and leaves the VIF unlimited
// too: a VM is never refused for its rate limit.
//
// The kernel side is the Shaper, implemented by the netlink Links
// (package netlinkx); a Links that is not a Shaper (the Recorder) has no
// rate limits.

// Shaper is what the module asks of the kernel for a VIF's rate limit.
type Shaper interface {
	// SetRate limits what enters the host through dev (a VM's tap: what
	// the guest sends) to rate bytes per second with bursts of burst
	// bytes; rate 0 removes the limit.
	SetRate(dev string, rate, burst uint64) error
}

// Rate is a VIF's rate limit in bytes per second and its burst in
// bytes; the zero Rate is no limit.
type Rate struct {
	Bytes, Burst uint64
}

// The bounds of rate limits.
const (
	// QoSRateLimit is the qos_algorithm_type of a rate limit.
	QoSRateLimit = "ratelimit"
	// DefaultTimesliceUS is xenopsd's timeslice when none is given.
	DefaultTimesliceUS = 50_000
	// MinBurst is the smallest burst (netback's: a 128 KiB packet).
	MinBurst = 128 << 10
	// MaxKBps is the largest rate accepted, in KiB/s (about 1 TiB/s):
	// above it the parameter is taken for a mistake.
	MaxKBps = 1 << 30
	// MaxTimesliceUS bounds timeslice_us (10 s); a larger one is taken
	// for a mistake and the default used.
	MaxTimesliceUS = 10_000_000
)

// RateFor is the rate limit a VIF's qos fields ask for, and, when they
// ask for one that cannot be made, what is wrong with them (the caller
// logs it; the VIF then has no limit). An empty type asks for none.
func RateFor(typ string, params map[string]string) (Rate, string) {
	switch typ {
	case "":
		return Rate{}, ""
	case QoSRateLimit:
	default:
		return Rate{}, "unknown qos_algorithm_type " + strconv.Quote(typ) + ": no rate limit"
	}
	s, ok := params["kbps"]
	if !ok {
		return Rate{}, `necessary parameter "kbps" not found: no rate limit`
	}
	kbps, err := strconv.ParseInt(s, 10, 64)
	switch {
	case err != nil:
		return Rate{}, `parameter "kbps" not an integer: no rate limit`
	case kbps <= 0:
		return Rate{}, `parameter "kbps" not positive: no rate limit`
	case kbps > MaxKBps:
		return Rate{}, `parameter "kbps" absurdly large: no rate limit`
	}
	note := ""
	ts := int64(DefaultTimesliceUS)
	if v, ok := params["timeslice_us"]; ok {
		n, err := strconv.ParseInt(v, 10, 64)
		switch {
		case err != nil || n <= 0:
			// xenopsd takes it as 0, then its default.
		case n > MaxTimesliceUS:
			note = `parameter "timeslice_us" absurdly large: the default (50 ms) is used`
		default:
			ts = n
		}
	}
	bytes := uint64(kbps) << 10
	return Rate{Bytes: bytes, Burst: max(bytes*uint64(ts)/1_000_000, MinBurst)}, note
}

// vifRate reads a VIF's rate limit from the database.
func vifRate(snap db.Reader, vifRef string) (Rate, string) {
	row, ok := snap.Get(dm.VIF.Class, vifRef)
	if !ok {
		return Rate{}, ""
	}
	var vif dm.VIFRecord
	vif.FromRow(snap.Values(row))
	return RateFor(vif.QosAlgorithmType, vif.QosAlgorithmParams)
}

// shaper is the kernel's rate limits, if the Links can make them.
func (m *Manager) shaper() Shaper {
	s, _ := m.cfg.Links.(Shaper)
	return s
}

// setRate makes tap's limit r, where it was old; a failure is logged and
// the limit is then none (reported back so that it is tried again on
// the next change).
func (m *Manager) setRate(vifRef, tap string, old, r Rate, note, oldNote string) Rate {
	if note != "" && note != oldNote {
		m.log.Warn("network: VIF QoS failed", "vif", vifRef, "reason", note)
	}
	if r == old {
		return r
	}
	s := m.shaper()
	if s == nil {
		if r != (Rate{}) {
			m.log.Warn("network: VIF QoS failed", "vif", vifRef, "reason", "this host's network backend cannot limit rates")
		}
		return Rate{}
	}
	if err := s.SetRate(tap, r.Bytes, r.Burst); err != nil {
		m.log.Warn("network: VIF QoS failed", "vif", vifRef, "tap", tap, "err", err)
		if r != (Rate{}) {
			_ = s.SetRate(tap, 0, 0)
		}
		return Rate{}
	}
	if r != (Rate{}) {
		m.log.Info("network: VIF rate limit", "vif", vifRef, "tap", tap, "bytes_per_s", r.Bytes, "burst", r.Burst)
	}
	return r
}

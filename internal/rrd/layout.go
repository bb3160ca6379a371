package rrd

// The archive layout xapi's rrdd gives every RRD it creates.
const (
	// DefaultStep is the length of a primary data point: one sampling tick.
	DefaultStep = 5
	// DefaultHeartbeat is the minimal_heartbeat of every source rrdd
	// creates: readings more than five minutes apart are unknown.
	DefaultHeartbeat = 300.0
)

// Timescale is one (rows, steps per row) pair of the standard layout.
type Timescale struct {
	Rows, PDPPerRow int
}

// Timescales are xapi's four resolutions: 120 rows of 5 s (10 minutes),
// 120 of 1 minute (2 hours), 168 of 1 hour (a week) and 366 of 1 day (a
// year).
var Timescales = [4]Timescale{{120, 1}, {120, 12}, {168, 720}, {366, 17280}}

// StandardArchives is the archive list rrdd creates. With minMax every
// timescale but the 5 s one gets AVERAGE, MIN and MAX archives with xff 1.0;
// otherwise, and always for the 5 s timescale, there is one AVERAGE archive
// with xff 0.5. The host RRD always has minMax; VM and SR RRDs have it when
// the pool asks for it (other-config:create_min_max_in_new_VM_RRDs).
func StandardArchives(minMax bool) []RRAConfig {
	var out []RRAConfig
	for _, ts := range Timescales {
		if ts.PDPPerRow > 1 && minMax {
			for _, cf := range []CF{Average, Min, Max} {
				out = append(out, RRAConfig{CF: cf, Rows: ts.Rows, PDPPerRow: ts.PDPPerRow, XFF: 1.0})
			}
			continue
		}
		out = append(out, RRAConfig{CF: Average, Rows: ts.Rows, PDPPerRow: ts.PDPPerRow, XFF: 0.5})
	}
	return out
}

// HostArchives is the host RRD's layout: StandardArchives(true).
func HostArchives() []RRAConfig { return StandardArchives(true) }

// VMArchives is a VM's layout for the pool's min/max setting.
func VMArchives(minMax bool) []RRAConfig { return StandardArchives(minMax) }

// SRArchives is an SR's layout: rrdd treats SRs as it does VMs.
func SRArchives(minMax bool) []RRAConfig { return StandardArchives(minMax) }

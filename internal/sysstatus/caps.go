package sysstatus

import (
	"context"
	"encoding/xml"
	"sort"
	"strconv"
	"strings"

	"toolstackd/internal/xerr"
)

// PII says whether a capability's content identifies the customer or
// their network, with xen-bugtool's four values.
const (
	PIINo           = "no"            // never
	PIIYes          = "yes"           // likely or certainly
	PIIMaybe        = "maybe"         // worth an audit
	PIIIfCustomized = "if_customized" // only if the operator edited what is collected
)

// Content types of capabilities.
const (
	TypeText = "text/plain"
	TypeXML  = "application/xml"
)

const (
	kib = 1 << 10
	mib = 1 << 20
)

// Capability is one kind of content a report may hold. Sizes are bytes
// and times seconds, -1 where there is no estimate.
type Capability struct {
	Key            string
	PII            string
	MinSize        int64
	MaxSize        int64
	MinTime        int
	MaxTime        int
	ContentType    string
	DefaultChecked bool
}

// capability is a Capability with the code that gathers it.
type capability struct {
	Capability
	gather func(ctx context.Context, e *entry)
}

// The keys of the capabilities.
const (
	CapLogs       = "toolstackd-logs"
	CapDB         = "toolstackd-db"
	CapConfig     = "toolstackd-config"
	CapSystemInfo = "system-info"
	CapQEMU       = "qemu"
)

// capabilities is the fixed table. Max sizes bound what each may add to
// an archive; max times bound how long each may take.
func (s *Service) capabilities() []capability {
	return []capability{
		{Capability{Key: CapLogs, PII: PIIMaybe, MinSize: 0, MaxSize: 32 * mib, MinTime: -1, MaxTime: 30,
			ContentType: TypeText, DefaultChecked: true}, s.gatherLogs},
		{Capability{Key: CapDB, PII: PIIYes, MinSize: -1, MaxSize: 64 * mib, MinTime: -1, MaxTime: 30,
			ContentType: TypeXML, DefaultChecked: true}, s.gatherDB},
		{Capability{Key: CapConfig, PII: PIIMaybe, MinSize: 0, MaxSize: 2 * mib, MinTime: -1, MaxTime: 5,
			ContentType: TypeText, DefaultChecked: true}, s.gatherConfig},
		{Capability{Key: CapSystemInfo, PII: PIIMaybe, MinSize: -1, MaxSize: 2 * mib, MinTime: -1, MaxTime: 30,
			ContentType: TypeText, DefaultChecked: true}, s.gatherSystemInfo},
		{Capability{Key: CapQEMU, PII: PIIYes, MinSize: 0, MaxSize: 4 * mib, MinTime: -1, MaxTime: 15,
			ContentType: TypeText, DefaultChecked: true}, s.gatherQEMU},
	}
}

// CapabilitiesXML is the capabilities document, in the form of
// xen-bugtool --capabilities.
func (s *Service) CapabilitiesXML() string {
	var b strings.Builder
	b.WriteString(`<?xml version="1.0" ?>` + "\n<system-status-capabilities>\n")
	for _, c := range s.Capabilities() {
		b.WriteString("\t<capability")
		for _, a := range [][2]string{
			{"content-type", c.ContentType},
			{"default-checked", yesNo(c.DefaultChecked)},
			{"key", c.Key},
			{"max-size", strconv.FormatInt(c.MaxSize, 10)},
			{"max-time", strconv.Itoa(c.MaxTime)},
			{"min-size", strconv.FormatInt(c.MinSize, 10)},
			{"min-time", strconv.Itoa(c.MinTime)},
			{"pii", c.PII},
		} {
			b.WriteString(" " + a[0] + `="`)
			_ = xml.EscapeText(&b, []byte(a[1])) // a strings.Builder does not fail
			b.WriteString(`"`)
		}
		b.WriteString("/>\n")
	}
	b.WriteString("</system-status-capabilities>\n")
	return b.String()
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// maxEntriesParam bounds the entries parameter a request may give.
const maxEntriesParam = 4 * kib

// Select resolves a comma-separated entries list against the table: the
// capabilities in table order, each once. Empty means every
// default-checked capability. Unknown names are refused all together
// (VALUE_NOT_SUPPORTED, naming them and the known keys).
func (s *Service) Select(list string) ([]string, error) {
	if len(list) > maxEntriesParam {
		return nil, xerr.New(xerr.ValueNotSupported, "entries", clip(list), "the list is too long")
	}
	want := map[string]bool{}
	var unknown []string
	for _, name := range strings.Split(list, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		if s.find(name) == nil {
			unknown = append(unknown, name)
			continue
		}
		want[name] = true
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return nil, xerr.New(xerr.ValueNotSupported, "entries", clip(strings.Join(unknown, ",")),
			"unknown capabilities; known: "+strings.Join(s.keys(), ","))
	}
	var out []string
	for _, c := range s.caps {
		if want[c.Key] || (len(want) == 0 && c.DefaultChecked) {
			out = append(out, c.Key)
		}
	}
	return out, nil
}

func (s *Service) find(key string) *capability {
	for i := range s.caps {
		if s.caps[i].Key == key {
			return &s.caps[i]
		}
	}
	return nil
}

func (s *Service) keys() []string {
	out := make([]string, 0, len(s.caps))
	for _, c := range s.caps {
		out = append(out, c.Key)
	}
	sort.Strings(out)
	return out
}

// clip shortens text from a request quoted back in an error.
func clip(s string) string {
	if len(s) > 200 {
		return strings.ToValidUTF8(s[:200], "") + "..."
	}
	return s
}

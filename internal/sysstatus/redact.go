package sysstatus

import (
	"bufio"
	"bytes"
	"net/url"
	"strings"

	"toolstackd/internal/db"
	"toolstackd/internal/db/xmldb"
	"toolstackd/internal/schema"
)

// Removed replaces every secret a report would otherwise hold.
const Removed = "REMOVED"

// secretWords mark a name (a map key, a setting, an option) whose value
// is taken to be a secret.
var secretWords = []string{"password", "passwd", "secret", "key", "token", "credential"}

// SecretName reports whether a value named name looks like a secret: the
// name holds one of secretWords, or is "pass" or ends in "_pass" or
// "-pass" (xapi's external_auth_configuration keeps a password under
// "pass"). Case does not matter.
func SecretName(name string) bool {
	n := strings.ToLower(name)
	for _, w := range secretWords {
		if strings.Contains(n, w) {
			return true
		}
	}
	return n == "pass" || strings.HasSuffix(n, "_pass") || strings.HasSuffix(n, "-pass")
}

// secretFieldWords mark a string field of the database holding a secret
// (user.password_hash, Cluster.cluster_token, ...). "key" is not among
// them: fields named so hold names of keys, not keys.
var secretFieldWords = []string{"password", "passwd", "secret", "token", "private", "credential"}

func secretField(c *schema.Class, f *schema.Field) bool {
	if f.Type == nil || f.Type.Kind != schema.KString {
		return false
	}
	if strings.EqualFold(c.Name, "secret") && f.Name == "value" {
		return true
	}
	n := strings.ToLower(f.Name)
	for _, w := range secretFieldWords {
		if strings.Contains(n, w) {
			return true
		}
	}
	return false
}

// droppedClass is a class whose rows a report leaves out entirely: a
// session's ref is a bearer credential.
func droppedClass(c *schema.Class) bool { return strings.EqualFold(c.Name, "session") }

// DumpOf is the persistent tables of snap as a dump: the rows of each,
// with every field's value (derived sets included).
func DumpOf(m *schema.Model, snap db.Reader) *xmldb.Dump {
	d := &xmldb.Dump{SchemaMajor: m.SchemaMajor, SchemaMinor: m.SchemaMinor, Generation: snap.Generation(),
		Tables: map[*schema.Class][]xmldb.Row{}}
	for _, c := range m.Classes {
		if !c.Persist || !c.InDB {
			continue
		}
		var rows []xmldb.Row
		snap.Ascend(c, func(r *db.Row) bool {
			rows = append(rows, xmldb.Row{Ref: r.Ref, Created: r.Created, Modified: r.Modified, Values: snap.Values(r)})
			return true
		})
		d.Tables[c] = rows
	}
	return d
}

// RedactDump returns d without its secrets; d is left as it was. It
// leaves out the rows of sessions, and replaces with Removed the value of
// every secret, every string field whose name says it holds a password,
// token or private key (user.password_hash, ...), and every value of a
// string map (other_config, device_config, ...) whose key SecretName
// picks.
func RedactDump(d *xmldb.Dump) *xmldb.Dump {
	out := &xmldb.Dump{SchemaMajor: d.SchemaMajor, SchemaMinor: d.SchemaMinor, Generation: d.Generation,
		Tables: make(map[*schema.Class][]xmldb.Row, len(d.Tables))}
	for c, rows := range d.Tables {
		if droppedClass(c) {
			continue
		}
		redacted := make([]xmldb.Row, len(rows))
		for i, r := range rows {
			vals := make([]any, len(r.Values))
			copy(vals, r.Values)
			for _, f := range c.Fields {
				if f.Index < len(vals) && vals[f.Index] != nil {
					vals[f.Index] = redactField(c, f, vals[f.Index])
				}
			}
			redacted[i] = xmldb.Row{Ref: r.Ref, Created: r.Created, Modified: r.Modified, Values: vals}
		}
		out.Tables[c] = redacted
	}
	return out
}

func redactField(c *schema.Class, f *schema.Field, v any) any {
	if secretField(c, f) {
		if s, _ := v.(string); s == "" {
			return v // nothing to hide; an empty value says so
		}
		return Removed
	}
	if m, ok := v.(map[string]string); ok {
		return redactMap(m)
	}
	return v
}

// redactMap is m with the values of secret-looking keys removed (m
// itself when there are none).
func redactMap(m map[string]string) map[string]string {
	var out map[string]string
	for k, v := range m {
		if !SecretName(k) || v == Removed {
			continue
		}
		if out == nil {
			out = make(map[string]string, len(m))
			for k2, v2 := range m {
				out[k2] = v2
			}
		}
		out[k] = Removed
	}
	if out == nil {
		return m
	}
	return out
}

// RedactValue is a setting's value as a report shows it: Removed when its
// name looks secret, and a URL's password removed in any case.
func RedactValue(name, value string) string {
	if value == "" {
		return value
	}
	if SecretName(name) {
		return Removed
	}
	if strings.Contains(value, "@") && strings.Contains(value, "://") {
		if u, err := url.Parse(value); err == nil && u.User != nil {
			if _, has := u.User.Password(); has {
				u.User = url.UserPassword(u.User.Username(), Removed)
				return u.String()
			}
		}
	}
	return value
}

// RedactConfig is a configuration file (name = value lines, '#'
// comments) with secret-looking values removed. Lines that are not
// settings are kept as they are.
func RedactConfig(text []byte) []byte {
	var out bytes.Buffer
	sc := bufio.NewScanner(bytes.NewReader(text))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		name, value, ok := strings.Cut(trimmed, "=")
		if ok && !strings.HasPrefix(trimmed, "#") {
			name, value = strings.TrimSpace(name), strings.TrimSpace(value)
			if r := RedactValue(name, strings.Trim(value, `"`)); r != strings.Trim(value, `"`) {
				line = name + " = " + r
			}
		}
		out.WriteString(line)
		out.WriteByte('\n')
	}
	if sc.Err() != nil {
		out.WriteString("** the rest of the file is left out: " + sc.Err().Error() + " **\n")
	}
	return out.Bytes()
}

// RedactArgs is a command line with its secrets removed: QEMU's
// comma-separated options whose key looks secret (password=...), and the
// data= of a secret object (-object secret,id=...,data=...).
func RedactArgs(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		parts := strings.Split(a, ",")
		secretObject := parts[0] == "secret" || strings.HasPrefix(parts[0], "qom-type=secret")
		for j, p := range parts {
			k, _, ok := strings.Cut(p, "=")
			if ok && (SecretName(k) || (secretObject && k == "data")) {
				parts[j] = k + "=" + Removed
			}
		}
		out[i] = strings.Join(parts, ",")
	}
	return out
}

// Package wire is the XenAPI wire codec: XML-RPC and JSON-RPC requests in,
// replies out, byte-compatible with what xapi puts on the wire. It knows
// nothing about HTTP or about the datamodel.
//
// # Neutral values
//
// Decoders produce, and encoders accept, "neutral" values:
//
//	string          XML-RPC bare <value> or <string>; JSON string
//	int64           XML-RPC <int>, <i4>, <i8>; JSON integer literal
//	float64         XML-RPC <double>; JSON number with a fraction or exponent
//	bool            XML-RPC <boolean>; JSON true/false
//	time.Time       XML-RPC <dateTime.iso8601>, always in UTC (JSON has no date type)
//	[]byte          XML-RPC <base64> (JSON has no binary type)
//	nil             XML-RPC <nil/>; JSON null
//	[]any           arrays
//	map[string]any  structs / objects
//
// For encoding, these are accepted as well:
//
//	int                as int64
//	Int32              a 32-bit integer that must travel as <i4> (e.g. valid_ref_counts)
//	[]string           as an array of strings
//	map[string]string  as a struct of strings
//	Marshaler          anything that writes itself through an Encoder
//
// A nil []any, []string or map encodes as an empty array or struct, never as
// nil. Map members are written in sorted key order so output is
// deterministic. Encoding any other type is a programming error and panics.
//
// # Streaming
//
// Encoder is the streaming seam: a Marshaler (e.g. a generated VM record)
// writes its members straight to the output, so replies such as
// VM.get_all_records on 10,000 VMs never build intermediate maps. Encoders
// buffer internally and hand the writer chunks of about 8 KiB, so memory use
// does not grow with the size of the reply.
//
// # XML-RPC output (xapi's dialect)
//
//   - Compact: no whitespace or newline between tags.
//   - Strings are bare <value>s</value>; never <string> or <string/>.
//     &, <, > and " are escaped; CR is written as &#13; so that it survives
//     XML line-end normalisation; other control characters below 0x20
//     except tab and LF are dropped (as xapi does, since XML 1.0 cannot
//     carry them); invalid UTF-8 and the non-characters U+FFFE/U+FFFF are
//     replaced by U+FFFD, so the output is always well-formed XML.
//     Struct member names are escaped the same way.
//   - int64 is a bare string <value>123</value>; never <i8>. Int32 is <i4>.
//   - Floats are <double> in C's %.16g form (what xapi prints); if 16
//     significant digits do not read back as the same float64, 17 are used,
//     so no value is ever lost. NaN and ±Inf are written as NaN, Infinity
//     and -Infinity, which JavaScript's Number(), Python's float(), Go's
//     strconv.ParseFloat, Java and .NET all parse. (xapi itself prints
//     nan/inf, which JavaScript's Number() turns into NaN.)
//   - Dates are <dateTime.iso8601>20060102T15:04:05Z</dateTime.iso8601> in
//     UTC, with the trailing Z as xapi writes it. Sub-second precision is
//     dropped.
//   - Replies wrap the value as {Status: "Success", Value: v} or
//     {Status: "Failure", ErrorDescription: [code, params...]}, except for
//     WriteXMLRaw (system.listMethods) and WriteXMLFault.
//
// # XML-RPC input
//
// DecodeXMLRequest accepts what Python's xmlrpc.client, XenAPI.py and Xen
// Orchestra send: bare strings or <string>, <int>/<i4>/<i8>, <double>,
// <boolean> (0/1, true/false), <dateTime.iso8601> with or without dashes,
// colons, fraction and zone (no zone means UTC), <base64> (line breaks
// allowed), <nil/>, arrays and structs. Whitespace between elements is
// formatting and is skipped. Inside <value>, text that is followed by a type
// element must be whitespace and is ignored; text that is the whole content
// of <value> is the string, untrimmed (so <value>  </value> is "  ", as the
// XML-RPC spec and xapi say). <value/>, <value></value>, <string/> and
// <string></string> are all "". Strings are never trimmed; the contents of
// numeric, boolean, date and base64 elements are. Comments, processing
// instructions and DOCTYPE declarations are skipped (entities declared in a
// DOCTYPE are not expanded); namespace prefixes on element names are
// ignored (as xapi does). Failures are *DecodeError: not XML, a root other
// than methodCall, no or empty methodName, unknown type tags, bad scalar
// text, containers nested deeper than MaxDepth, or trailing content.
// Encodings other than UTF-8 (and its ASCII subset) are refused.
//
// # JSON-RPC
//
// DecodeJSONRequest accepts JSON-RPC 1.0 (no "jsonrpc" member; "params"
// must be an array) and 2.0 ("jsonrpc": "2.0"; "params" may be an array,
// an object, which becomes the single parameter, null or absent). The "id"
// must be an integer or a string; notifications (no id, or null) are
// refused. Integer literals become int64 (out of int64 range is an error
// rather than a silent float); other numbers become float64.
//
// JSON output follows xapi: int64 and Int32 are numbers; floats use the same
// digits as XML-RPC and always carry a fraction or exponent (1.0, not 1) so
// that typed clients see a float; NaN and ±Inf become the strings "NaN",
// "Infinity" and "-Infinity" (bare NaN/Infinity literals are not JSON and
// break JSON.parse; xapi's Go SDK reads these strings back as floats); dates
// are strings in xapi's 20060102T15:04:05Z form; []byte is a base64 string.
// Strings are valid JSON for any Go string: invalid UTF-8 becomes \ufffd and
// U+2028/U+2029 are escaped.
//
// # Limits
//
// Containers may nest MaxDepth levels deep on input. Decoding is linear in
// the input; callers must bound the body size (xapi allows 300 KiB for an
// RPC body).
package wire

// InvalidDateTime is a <dateTime.iso8601> whose text is no date. It is
// decoded, not refused: only a call that reads it as a date fails
// (FIELD_TYPE_ERROR), as with xapi.
type InvalidDateTime string

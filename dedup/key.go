package dedup

import (
	"errors"
	"fmt"
	"strings"

	"github.com/tidwall/gjson"
	"github.com/twmb/franz-go/pkg/kgo"
)

// ErrNoKey is wrapped by KeyFunc errors: the record carries no usable dedup
// key (no record key, a missing header, a value that is not JSON, lacks the
// path, or is beyond MaxJSONBytes or MaxJSONDepth). Such records are
// forwarded unchanged and counted, never dropped.
var ErrNoKey = errors.New("dedup: record cannot be keyed")

// Limits of json:PATH key extraction. A record value beyond either has no
// key (ErrNoKey): it is forwarded unchanged and counted as unkeyed, so that
// no record can make extraction take more than linear time and a bounded
// stack. gjson validates and walks nested values recursively: a value of
// ten million '[' overflowed the goroutine stack (a fatal error, not a
// recoverable panic) and ten megabytes of them took 1 GB of stack.
const (
	// MaxJSONBytes is the largest record value, in bytes, a JSON key is
	// read from (8 MiB, eight times Kafka's default max.message.bytes).
	MaxJSONBytes = 8 << 20
	// MaxJSONDepth is the deepest nesting of arrays and objects a JSON key
	// is read from: {"id":1} is depth 1. 512 is well past real documents
	// (serde_json stops at 128, Ruby's JSON at 100) and keeps gjson's
	// recursion within a few hundred kilobytes of stack.
	MaxJSONDepth = 512
)

// Key derives the dedup key of a record. A Key is immutable and safe for
// concurrent use. The zero Key uses the record key.
type Key struct {
	kind keyKind
	arg  string // header name or JSON path
	// routed: the records' keys were derived already and carried as
	// their record keys (Routed).
	routed bool
}

// Routed returns k for records whose dedup key k derived before and
// carried as their record key, as a repartition topic's records are
// (package consumer): Of returns the record key, and String is k's spec,
// so that the state keeps the spec its keys were derived by.
func (k Key) Routed() Key {
	k.routed = true
	return k
}

type keyKind uint8

const (
	keyRecord keyKind = iota
	keyHeader
	keyJSON
)

// ParseKey parses a key spec:
//
//	""  or "key"    the record key (default)
//	"header:NAME"   the value of the first header named NAME
//	"json:PATH"     the value at PATH in the JSON record value, in
//	                github.com/tidwall/gjson path syntax ("user.id",
//	                "items.0.sku"); a JSON string keys by its contents,
//	                any other JSON value by its raw text (so 1 and 1.0
//	                are different keys)
func ParseKey(spec string) (Key, error) {
	switch {
	case spec == "" || spec == "key":
		return Key{}, nil
	case strings.HasPrefix(spec, "header:") && len(spec) > len("header:"):
		return Key{kind: keyHeader, arg: strings.TrimPrefix(spec, "header:")}, nil
	case strings.HasPrefix(spec, "json:") && len(spec) > len("json:"):
		return Key{kind: keyJSON, arg: strings.TrimPrefix(spec, "json:")}, nil
	}
	return Key{}, fmt.Errorf("dedup: key spec %q: want \"key\", \"header:NAME\" or \"json:PATH\"", spec)
}

// String returns the spec ParseKey reads k from.
func (k Key) String() string {
	switch k.kind {
	case keyHeader:
		return "header:" + k.arg
	case keyJSON:
		return "json:" + k.arg
	}
	return "key"
}

// Of returns r's dedup key (its record key when k is Routed), or an error
// wrapping ErrNoKey that says why there is none. A null or empty key, header value or JSON value is no key:
// deduplicating every keyless record against each other would drop all but
// the first. The returned slice may alias the record; do not modify it.
func (k Key) Of(r *kgo.Record) ([]byte, error) {
	kind := k.kind
	if k.routed {
		kind = keyRecord
	}
	switch kind {
	case keyHeader:
		for _, h := range r.Headers {
			if h.Key == k.arg {
				if len(h.Value) == 0 {
					return nil, fmt.Errorf("%w: header %q is empty", ErrNoKey, k.arg)
				}
				return h.Value, nil
			}
		}
		return nil, fmt.Errorf("%w: no header %q", ErrNoKey, k.arg)
	case keyJSON:
		if r.Value == nil {
			return nil, fmt.Errorf("%w: null value has no JSON path %q", ErrNoKey, k.arg)
		}
		if len(r.Value) > MaxJSONBytes {
			return nil, fmt.Errorf("%w: value is %d bytes, more than the %d a JSON key is read from", ErrNoKey, len(r.Value), MaxJSONBytes)
		}
		if !jsonDepthAtMost(r.Value, MaxJSONDepth) {
			return nil, fmt.Errorf("%w: value nests arrays and objects deeper than %d levels", ErrNoKey, MaxJSONDepth)
		}
		if !gjson.ValidBytes(r.Value) {
			return nil, fmt.Errorf("%w: value is not valid JSON", ErrNoKey)
		}
		v := gjson.GetBytes(r.Value, k.arg)
		switch {
		case !v.Exists():
			return nil, fmt.Errorf("%w: JSON path %q not found", ErrNoKey, k.arg)
		case v.Type == gjson.Null:
			return nil, fmt.Errorf("%w: JSON path %q is null", ErrNoKey, k.arg)
		case v.Type == gjson.String:
			if v.Str == "" {
				return nil, fmt.Errorf("%w: JSON path %q is an empty string", ErrNoKey, k.arg)
			}
			return []byte(v.Str), nil
		}
		return []byte(v.Raw), nil
	}
	if len(r.Key) == 0 {
		return nil, fmt.Errorf("%w: record has no key", ErrNoKey)
	}
	return r.Key, nil
}

// jsonDepthAtMost reports whether the arrays and objects of b, counted
// outside strings, nest at most limit deep. It is one iterative pass that
// allocates nothing, run before gjson's recursive validator, whose depth
// on any input (valid or not) is at most the depth counted here: gjson
// stops at the first byte that breaks the grammar, and up to that byte its
// brackets and strings are the ones counted. Bytes that are not JSON are
// left to gjson to refuse.
func jsonDepthAtMost(b []byte, limit int) bool {
	depth, inString := 0, false
	for i := 0; i < len(b); i++ {
		c := b[i]
		if inString {
			switch c {
			case '\\':
				i++ // the escaped byte cannot end the string
			case '"':
				inString = false
			}
			continue
		}
		switch c {
		case '"':
			inString = true
		case '[', '{':
			if depth++; depth > limit {
				return false
			}
		case ']', '}':
			if depth > 0 { // an unmatched close: gjson refuses it
				depth--
			}
		}
	}
	return true
}

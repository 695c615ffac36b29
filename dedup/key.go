package dedup

import (
	"errors"
	"fmt"
	"strings"

	"github.com/tidwall/gjson"
	"github.com/twmb/franz-go/pkg/kgo"
)

// ErrNoKey is wrapped by KeyFunc errors: the record carries no usable dedup
// key (no record key, a missing header, a value that is not JSON or lacks
// the path). Such records are forwarded unchanged and counted, never dropped.
var ErrNoKey = errors.New("dedup: record cannot be keyed")

// Key derives the dedup key of a record. A Key is immutable and safe for
// concurrent use. The zero Key uses the record key.
type Key struct {
	kind keyKind
	arg  string // header name or JSON path
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

// Of returns r's dedup key, or an error wrapping ErrNoKey that says why
// there is none. A null or empty key, header value or JSON value is no key:
// deduplicating every keyless record against each other would drop all but
// the first. The returned slice may alias the record; do not modify it.
func (k Key) Of(r *kgo.Record) ([]byte, error) {
	switch k.kind {
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

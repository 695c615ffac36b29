package dedup

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/tidwall/gjson"
	"github.com/twmb/franz-go/pkg/kgo"
)

func TestParseKey(t *testing.T) {
	for _, tc := range []struct {
		spec    string
		want    Key
		wantErr bool
	}{
		{spec: "", want: Key{}},
		{spec: "key", want: Key{}},
		{spec: "header:x-id", want: Key{kind: keyHeader, arg: "x-id"}},
		// Only the first colon separates the mode; the rest is the name.
		{spec: "header:a:b", want: Key{kind: keyHeader, arg: "a:b"}},
		{spec: "json:user.id", want: Key{kind: keyJSON, arg: "user.id"}},
		{spec: "json:items.0.sku", want: Key{kind: keyJSON, arg: "items.0.sku"}},
		{spec: "header:", wantErr: true},
		{spec: "json:", wantErr: true},
		{spec: "value", wantErr: true},
		{spec: "hdr:x", wantErr: true},
		{spec: "Key", wantErr: true},
		{spec: " key", wantErr: true},
		{spec: "header", wantErr: true},
		{spec: "json", wantErr: true},
		{spec: "HEADER:x", wantErr: true},
	} {
		t.Run(tc.spec, func(t *testing.T) {
			k, err := ParseKey(tc.spec)
			if tc.wantErr {
				if err == nil {
					t.Fatalf("ParseKey(%q) = %+v, want an error", tc.spec, k)
				}
				if k != (Key{}) {
					t.Errorf("ParseKey(%q) returned %+v with its error, want the zero Key", tc.spec, k)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseKey(%q): %v", tc.spec, err)
			}
			if k != tc.want {
				t.Fatalf("ParseKey(%q) = %+v, want %+v", tc.spec, k, tc.want)
			}
			// String is the spec that parses back to k.
			back, err := ParseKey(k.String())
			if err != nil || back != k {
				t.Errorf("ParseKey(%q.String() = %q) = %+v, %v; want %+v", tc.spec, k.String(), back, err, k)
			}
		})
	}
}

func TestKeyOf(t *testing.T) {
	hdr := func(kv ...string) []kgo.RecordHeader {
		var hs []kgo.RecordHeader
		for i := 0; i < len(kv); i += 2 {
			hs = append(hs, kgo.RecordHeader{Key: kv[i], Value: []byte(kv[i+1])})
		}
		return hs
	}
	user := []byte(`{"user":{"id":"u-1","n":42,"f":1.0,"obj":{"a" : [1, 2]},"null":null,"empty":"","esc":"a\"b","t":true},"items":[{"sku":"s0"},{"sku":"s1"}]}`)
	for _, tc := range []struct {
		name string
		spec string
		r    *kgo.Record
		want string // "" means ErrNoKey
	}{
		{name: "key/present", spec: "key", r: &kgo.Record{Key: []byte("k1"), Value: []byte("v")}, want: "k1"},
		{name: "key/binary", spec: "", r: &kgo.Record{Key: []byte{0, 0xff, 0}}, want: "\x00\xff\x00"},
		{name: "key/tombstone keeps its key", spec: "key", r: &kgo.Record{Key: []byte("k1")}, want: "k1"},
		{name: "key/nil", spec: "key", r: &kgo.Record{Value: []byte("v")}},
		{name: "key/empty", spec: "key", r: &kgo.Record{Key: []byte{}, Value: []byte("v")}},
		{name: "key/ignores headers", spec: "key", r: &kgo.Record{Headers: hdr("key", "h")}},

		{name: "header/present", spec: "header:x-id", r: &kgo.Record{Key: []byte("k"), Headers: hdr("a", "1", "x-id", "id-7")}, want: "id-7"},
		{name: "header/tombstone keeps its key", spec: "header:x-id", r: &kgo.Record{Headers: hdr("x-id", "id-7")}, want: "id-7"},
		{name: "header/missing", spec: "header:x-id", r: &kgo.Record{Key: []byte("k"), Headers: hdr("a", "1")}},
		{name: "header/no headers", spec: "header:x-id", r: &kgo.Record{Key: []byte("k")}},
		{name: "header/name is case sensitive", spec: "header:x-id", r: &kgo.Record{Headers: hdr("X-Id", "id-7")}},
		{name: "header/empty", spec: "header:x-id", r: &kgo.Record{Headers: hdr("x-id", "")}},
		{name: "header/nil value", spec: "header:x-id", r: &kgo.Record{Headers: []kgo.RecordHeader{{Key: "x-id"}}}},
		{name: "header/first of duplicates wins", spec: "header:x-id", r: &kgo.Record{Headers: hdr("x-id", "first", "x-id", "second")}, want: "first"},
		// The first header decides even when it is empty and a later one is not.
		{name: "header/empty first of duplicates", spec: "header:x-id", r: &kgo.Record{Headers: hdr("x-id", "", "x-id", "second")}},

		{name: "json/string", spec: "json:user.id", r: &kgo.Record{Value: user}, want: "u-1"},
		{name: "json/number is raw text", spec: "json:user.n", r: &kgo.Record{Value: user}, want: "42"},
		{name: "json/1.0 is not 1", spec: "json:user.f", r: &kgo.Record{Value: user}, want: "1.0"},
		{name: "json/true", spec: "json:user.t", r: &kgo.Record{Value: user}, want: "true"},
		{name: "json/object is raw JSON", spec: "json:user.obj", r: &kgo.Record{Value: user}, want: `{"a" : [1, 2]}`},
		{name: "json/nested array path", spec: "json:items.1.sku", r: &kgo.Record{Value: user}, want: "s1"},
		{name: "json/escaped string is unescaped", spec: "json:user.esc", r: &kgo.Record{Value: user}, want: `a"b`},
		{name: "json/top level", spec: "json:id", r: &kgo.Record{Value: []byte(` {"id": 7} `)}, want: "7"},
		{name: "json/missing path", spec: "json:user.nope", r: &kgo.Record{Value: user}},
		{name: "json/missing index", spec: "json:items.5.sku", r: &kgo.Record{Value: user}},
		{name: "json/null", spec: "json:user.null", r: &kgo.Record{Value: user}},
		{name: "json/empty string", spec: "json:user.empty", r: &kgo.Record{Value: user}},
		{name: "json/invalid", spec: "json:user.id", r: &kgo.Record{Value: []byte(`{"user":{"id":"u-1"`)}},
		{name: "json/trailing garbage", spec: "json:id", r: &kgo.Record{Value: []byte(`{"id":"a"} x`)}},
		{name: "json/not JSON", spec: "json:id", r: &kgo.Record{Value: []byte("id=1")}},
		{name: "json/empty value", spec: "json:id", r: &kgo.Record{Value: []byte{}}},
		{name: "json/tombstone", spec: "json:id", r: &kgo.Record{Key: []byte("k")}},
		{name: "json/ignores record key", spec: "json:id", r: &kgo.Record{Key: []byte("k"), Value: []byte(`{}`)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k, err := ParseKey(tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			got, err := k.Of(tc.r)
			if tc.want == "" {
				if !errors.Is(err, ErrNoKey) {
					t.Fatalf("Of = %q, %v; want an error wrapping ErrNoKey", got, err)
				}
				if got != nil {
					t.Errorf("Of returned key %q with its error, want nil", got)
				}
				return
			}
			if err != nil {
				t.Fatalf("Of: %v", err)
			}
			if string(got) != tc.want {
				t.Fatalf("Of = %q, want %q", got, tc.want)
			}
		})
	}
}

// FuzzKeyOf derives keys from arbitrary records under every key mode.
// Invariants:
//   - nothing panics;
//   - ParseKey accepts "header:NAME" and "json:PATH" exactly when NAME or
//     PATH is non-empty, and String parses back to the same Key;
//   - Of returns either a non-empty key and no error, or a nil key and an
//     error wrapping ErrNoKey;
//   - record-key mode returns the record key; header mode returns the value
//     of the first header with that name;
//   - JSON mode keys only valid, non-nil values of at most MaxJSONBytes
//     nested at most MaxJSONDepth deep (as gjson parses them), and a key it
//     returns equals gjson.GetBytes(value, path): Str for a string, Raw
//     otherwise.
func FuzzKeyOf(f *testing.F) {
	f.Add(uint8(0), "", []byte("k"), "x-id", []byte("h"), []byte("v"))
	f.Add(uint8(1), "x-id", []byte(nil), "x-id", []byte("h"), []byte(nil))
	f.Add(uint8(1), "x-id", []byte(nil), "x-id", []byte(""), []byte(nil))
	f.Add(uint8(2), "user.id", []byte(nil), "", []byte(nil), []byte(`{"user":{"id":"u-1"}}`))
	f.Add(uint8(2), "user.id", []byte(nil), "", []byte(nil), []byte(`{"user":{"id":42}}`))
	f.Add(uint8(2), "user", []byte(nil), "", []byte(nil), []byte(`{"user":{"id":null}}`))
	f.Add(uint8(2), "a.0", []byte(nil), "", []byte(nil), []byte(`{"a":[""]}`))
	f.Add(uint8(2), "@this", []byte(nil), "", []byte(nil), []byte(`"x"`))
	f.Add(uint8(2), "#", []byte(nil), "", []byte(nil), []byte(`[1,2]`))
	f.Add(uint8(2), "a|@reverse", []byte(nil), "", []byte(nil), []byte(`{"a":[1,2]}`))
	f.Add(uint8(2), "id", []byte(nil), "", []byte(nil), []byte(`{"id":`))
	// Nested one level past MaxJSONDepth, valid JSON otherwise.
	f.Add(uint8(2), "0", []byte(nil), "", []byte(nil), deepJSON(MaxJSONDepth+1))
	f.Add(uint8(2), "id", []byte(nil), "", []byte(nil), []byte(`{"id":"[[[","x":"\\\"{{"}`))
	f.Add(uint8(2), "id", []byte(nil), "", []byte(nil), []byte(`]]]]{"id":1}`))
	f.Fuzz(func(t *testing.T, mode uint8, arg string, key []byte, hname string, hvalue, value []byte) {
		var spec string
		switch mode % 3 {
		case 0:
			spec = "key"
		case 1:
			spec = "header:" + arg
		case 2:
			spec = "json:" + arg
		}
		k, err := ParseKey(spec)
		if mode%3 != 0 && arg == "" {
			if err == nil {
				t.Fatalf("ParseKey(%q) accepted an empty argument", spec)
			}
			return
		}
		if err != nil {
			t.Fatalf("ParseKey(%q): %v", spec, err)
		}
		if back, err := ParseKey(k.String()); err != nil || back != k {
			t.Fatalf("ParseKey(%q) = %+v, %v; want %+v", k.String(), back, err, k)
		}

		r := &kgo.Record{
			Key:   key,
			Value: value,
			Headers: []kgo.RecordHeader{
				{Key: hname, Value: hvalue},
				{Key: arg, Value: []byte("second")},
			},
		}
		got, err := k.Of(r)
		if err != nil {
			if !errors.Is(err, ErrNoKey) {
				t.Fatalf("Of: error %v does not wrap ErrNoKey", err)
			}
			if got != nil {
				t.Fatalf("Of returned key %q with error %v", got, err)
			}
		} else if len(got) == 0 {
			t.Fatalf("Of returned an empty key and no error")
		}

		switch mode % 3 {
		case 0:
			if err == nil && !bytes.Equal(got, key) {
				t.Fatalf("record-key mode: Of = %q, want %q", got, key)
			}
			if err != nil && len(key) != 0 {
				t.Fatalf("record-key mode: Of failed (%v) with record key %q", err, key)
			}
		case 1:
			want := []byte("second")
			if hname == arg {
				want = hvalue
			}
			if err == nil && !bytes.Equal(got, want) {
				t.Fatalf("header mode: Of = %q, want first header %q", got, want)
			}
			if err != nil && len(want) != 0 {
				t.Fatalf("header mode: Of failed (%v) with first header %q", err, want)
			}
		case 2:
			if err != nil {
				return
			}
			if value == nil || !gjson.ValidBytes(value) {
				t.Fatalf("JSON mode: Of = %q for value %q, which is not valid JSON", got, value)
			}
			if len(value) > MaxJSONBytes || gjsonDepth(gjson.ParseBytes(value)) > MaxJSONDepth {
				t.Fatalf("JSON mode: Of = %q for a value beyond the limits (%d bytes, depth %d)", got, len(value), gjsonDepth(gjson.ParseBytes(value)))
			}
			v := gjson.GetBytes(value, arg)
			want := v.Raw
			if v.Type == gjson.String {
				want = v.Str
			}
			if string(got) != want {
				t.Fatalf("JSON mode: Of = %q, gjson.GetBytes(%q, %q) gives %q", got, value, arg, want)
			}
		}
	})
}

// deepJSON returns depth nested arrays holding the string "x", the depth
// MaxJSONDepth counts.
func deepJSON(depth int) []byte {
	return slices.Concat(bytes.Repeat([]byte("["), depth), []byte(`"x"`), bytes.Repeat([]byte("]"), depth))
}

// gjsonDepth is the nesting depth of v as gjson parses it: the model the
// iterative scan before gjson must agree with.
func gjsonDepth(v gjson.Result) int {
	if !v.IsArray() && !v.IsObject() {
		return 0
	}
	d := 0
	v.ForEach(func(_, e gjson.Result) bool {
		d = max(d, gjsonDepth(e))
		return true
	})
	return d + 1
}

// TestKeyOfJSONLimits checks the bounds of JSON key extraction: values
// nested deeper than MaxJSONDepth or larger than MaxJSONBytes have no key,
// with a reason naming the limit, and values at the limits key as usual.
// The deep value is the one that overflowed the stack: ten million '['
// then ten million ']'.
func TestKeyOfJSONLimits(t *testing.T) {
	// {"id":"k1","d":[[...]]}: depth n counting the outer object.
	nested := func(n int) []byte {
		return slices.Concat([]byte(`{"id":"k1","d":`), deepJSON(n-1), []byte(`}`))
	}
	padded := func(n int) []byte { // {"id":"k1"} padded with spaces to n bytes
		v := []byte(`{"id":"k1"}`)
		return append(v, bytes.Repeat([]byte(" "), n-len(v))...)
	}
	bomb := slices.Concat(bytes.Repeat([]byte("["), 10_000_000), bytes.Repeat([]byte("]"), 10_000_000))
	for _, tc := range []struct {
		name    string
		value   []byte
		path    string
		want    string // "" means ErrNoKey with reason
		reason  string
		inDepth bool // the model depth of value, checked against gjson's
	}{
		{name: "at the depth limit", value: nested(MaxJSONDepth), path: "id", want: "k1", inDepth: true},
		{name: "key at the deepest level", value: deepJSON(MaxJSONDepth), path: strings.Repeat("0.", MaxJSONDepth-1) + "0", want: "x", inDepth: true},
		{name: "one level past the limit", value: nested(MaxJSONDepth + 1), path: "id", reason: fmt.Sprintf("deeper than %d levels", MaxJSONDepth)},
		{name: "brackets in strings do not count", value: slices.Concat([]byte(`{"id":"k1","s":"`), bytes.Repeat([]byte(`[\"{`), MaxJSONDepth), []byte(`"}`)), path: "id", want: "k1", inDepth: true},
		{name: "2 MB of nesting", value: bomb[10_000_000-1_000_000 : 10_000_000+1_000_000], path: "0", reason: "deeper than"},
		{name: "20 MB of nesting", value: bomb, path: "0", reason: fmt.Sprintf("more than the %d", MaxJSONBytes)},
		{name: "at the size limit", value: padded(MaxJSONBytes), path: "id", want: "k1"},
		{name: "one byte past the size limit", value: padded(MaxJSONBytes + 1), path: "id", reason: fmt.Sprintf("is %d bytes, more than the %d", MaxJSONBytes+1, MaxJSONBytes)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.inDepth {
				if d := gjsonDepth(gjson.ParseBytes(tc.value)); d > MaxJSONDepth {
					t.Fatalf("test value has depth %d as gjson parses it", d)
				}
			}
			k, err := ParseKey("json:" + tc.path)
			if err != nil {
				t.Fatal(err)
			}
			got, err := k.Of(&kgo.Record{Value: tc.value})
			if tc.want != "" {
				if err != nil || string(got) != tc.want {
					t.Fatalf("Of = %q, %v; want %q", got, err, tc.want)
				}
				return
			}
			if !errors.Is(err, ErrNoKey) || got != nil || !strings.Contains(err.Error(), tc.reason) {
				t.Fatalf("Of = %q, %v; want ErrNoKey saying %q", got, err, tc.reason)
			}
		})
	}
}

func TestJSONDepthAtMost(t *testing.T) {
	for _, tc := range []struct {
		in    string
		depth int // the least limit it passes
	}{
		{``, 0}, {`1`, 0}, {`"[{"`, 0}, {`[]`, 1}, {`{"a":[{}]}`, 3},
		{`["\"[", [1]]`, 2}, {`["\\", [1]]`, 2}, {`"\\"[[`, 2},
		{`]]]]]]][[`, 2}, // unmatched closes do not lend depth
		{`[[[`, 3},       // unclosed opens count
	} {
		if !jsonDepthAtMost([]byte(tc.in), tc.depth) || (tc.depth > 0 && jsonDepthAtMost([]byte(tc.in), tc.depth-1)) {
			t.Errorf("%s: depth is not %d", tc.in, tc.depth)
		}
	}
}

// TestRoutedKey: a routed key reads the record key, whatever its spec,
// and prints as its spec, which the state stores.
func TestRoutedKey(t *testing.T) {
	for _, spec := range []string{"key", "header:id", "json:event_id"} {
		k, err := ParseKey(spec)
		if err != nil {
			t.Fatal(err)
		}
		r := k.Routed()
		if r.String() != k.String() {
			t.Errorf("%s: routed prints as %q", spec, r.String())
		}
		rec := &kgo.Record{Key: []byte("ev-1"), Value: []byte(`{"event_id":"other"}`), Headers: []kgo.RecordHeader{{Key: "id", Value: []byte("other")}}}
		if got, err := r.Of(rec); err != nil || string(got) != "ev-1" {
			t.Errorf("%s: routed key of a record keyed ev-1: %q, %v", spec, got, err)
		}
		if _, err := r.Of(&kgo.Record{Value: rec.Value, Headers: rec.Headers}); !errors.Is(err, ErrNoKey) {
			t.Errorf("%s: routed key of a record without key: %v, want ErrNoKey", spec, err)
		}
	}
}

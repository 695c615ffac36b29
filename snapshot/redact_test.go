package snapshot

import (
	"context"
	"strings"
	"testing"
)

// TestOpenRedactsPassword opens URLs that carry a password and that Open
// refuses, at parsing or at the driver: no error text holds the password
// or its escaped form.
func TestOpenRedactsPassword(t *testing.T) {
	for _, tc := range []struct {
		name, url string
		secrets   []string
	}{
		{"wrong scheme", "https://AKIAEXAMPLE:s3cr3tKey@s3.example.com/bucket/prefix", []string{"s3cr3tKey"}},
		{"bad escape", "s3://user:s3cr3tKey@bucket/%zz", []string{"s3cr3tKey"}},
		{"bad escape in the password", "s3://user:s3cr%zzetKey@bucket/p", []string{"s3cr%zzetKey", "etKey"}},
		{"unknown driver", "nosuchdriver://user:s3cr3tKey@host/x?region=eu", []string{"s3cr3tKey"}},
		{"escaped password", "nosuchdriver://user:p%40ss%2Fw0rd@host/x", []string{"p%40ss%2Fw0rd", "p@ss/w0rd"}},
		{"bad port", "s3://user:s3cr3tKey@bucket:port/x", []string{"s3cr3tKey"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, err := Open(context.Background(), tc.url)
			if err == nil {
				st.Close()
				t.Fatalf("Open(%s) succeeded; the test needs a refused URL", tc.name)
			}
			for _, s := range tc.secrets {
				if strings.Contains(err.Error(), s) {
					t.Fatalf("Open error holds the password %q: %v", s, err)
				}
			}
			if !strings.HasPrefix(err.Error(), "snapshot: ") || !strings.Contains(err.Error(), "xxxxx") {
				t.Fatalf("Open error %q: want a snapshot: error naming the redacted URL", err)
			}
		})
	}
}

// TestRedactRawURL strips the user information of URLs that may not parse.
func TestRedactRawURL(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"s3://u:p@b/x", "s3://xxxxx@b/x"},
		{"s3://b/x", "s3://b/x"},
		{"no url", "no url"},
		{"s3://u:p@ss@b/x", "s3://xxxxx@b/x"},
	} {
		if got := redactRawURL(tc.in); got != tc.want {
			t.Errorf("redactRawURL(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

package optcheck

import "testing"

// TestRedactURL: a value without '@' is printed as given; one that parses
// with one user info part loses its password (url.URL.Redacted) or a lone
// user name.
func TestRedactURL(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{"s3://bucket/prefix?region=eu-west-1&endpoint=http://127.0.0.1:9000", "s3://bucket/prefix?region=eu-west-1&endpoint=http://127.0.0.1:9000"},
		{"file:///snapshots", "file:///snapshots"},
		{"kafka-1:9092,kafka-2:9092", "kafka-1:9092,kafka-2:9092"},
		{"s3://key:secret@bucket/prefix", "s3://key:xxxxx@bucket/prefix"},
		{"s3://token@bucket/prefix", "s3://xxxxx@bucket/prefix"},
		{"s3://key:secret@bucket/a@b", "s3://xxxxx@b"}, // which '@' ends the user info is not said
		{"key:secret@bucket", "key:xxxxx@bucket"},
		{"secret@bucket", "xxxxx@bucket"},
	} {
		if got := RedactURL(tc.in); got != tc.want {
			t.Errorf("RedactURL(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

package app

import (
	"errors"
	"io"
	"log/slog"
	"testing"

	"github.com/kdedup/kdedup/config"
)

// TestOpenSnapshotsHidesCredentials: a KDEDUP_SNAPSHOT_URL holding a
// password stops start-up with ErrConfig naming the variable and the URL
// without its password, even in a Config that skipped Validate (gocloud's
// "no driver registered" error would quote the URL whole).
func TestOpenSnapshotsHidesCredentials(t *testing.T) {
	for _, tc := range []struct{ url, want string }{
		{"https://AKIAIOSFODNN7EXAMPLE:s3cr3tpass@s3.eu-west-1.amazonaws.com/bucket",
			"invalid configuration: KDEDUP_SNAPSHOT_URL=https://AKIAIOSFODNN7EXAMPLE:xxxxx@s3.eu-west-1.amazonaws.com/bucket: must start with s3://, gs://, azblob:// or file://"},
		{"s3://AKIAIOSFODNN7EXAMPLE:s3cr3tpass@bucket/%zz",
			"invalid configuration: KDEDUP_SNAPSHOT_URL=s3://xxxxx@bucket/%zz: must be a URL: it has a '%' not followed by two hexadecimal digits (write a literal '%' as %25)"},
	} {
		t.Run(tc.url, func(t *testing.T) {
			st, err := openSnapshots(t.Context(), config.Config{SnapshotURL: tc.url}, slog.New(slog.NewTextHandler(io.Discard, nil)))
			if st != nil {
				st.Close()
			}
			if !errors.Is(err, ErrConfig) || err.Error() != tc.want {
				t.Errorf("error %v, want %q (ErrConfig)", err, tc.want)
			}
		})
	}
}

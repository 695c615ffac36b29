package snapshot

import (
	"errors"
	"net/url"
	"slices"

	"github.com/kdedup/kdedup/internal/optcheck"
)

// Schemes are the schemes of the object stores Open opens: the
// gocloud.dev/blob drivers store.go imports (s3blob, gcsblob, azureblob,
// fileblob). A driver imported there is a scheme listed here.
var Schemes = []string{"s3", "gs", "azblob", "file"}

// ErrInvalidURL is wrapped by CheckURL's error.
var ErrInvalidURL = errors.New("snapshot: invalid store URL")

// CheckURL reports why rawURL cannot name a snapshot store, as an
// *optcheck.Error wrapping ErrInvalidURL with one problem for the field
// "URL", or nil when it can: it must parse, use one of Schemes followed
// by "//", and hold no credentials, neither as user info nor in a URL in
// its query (endpoint=https://user:password@host): the stores' SDKs read
// credentials from their usual sources, and a URL is logged and shown.
// The problem never quotes rawURL or any part of it; print rawURL through
// optcheck.RedactURL. Safe for concurrent use.
func CheckURL(rawURL string) error {
	l := optcheck.New(ErrInvalidURL)
	u, err := url.Parse(rawURL)
	switch {
	case err != nil:
		l.Add("URL", "", "must be a URL: it "+optcheck.URLParseReason(err))
	case !slices.Contains(Schemes, u.Scheme) || u.Opaque != "":
		l.Add("URL", "", "must start with s3://, gs://, azblob:// or file://")
	case holdsCredentials(u):
		l.Add("URL", "", "must not hold credentials: the store's SDK reads them from its usual sources (environment, files, pod identity)")
	}
	return l.Err()
}

// holdsCredentials reports whether u has user info, or a query value that
// is a URL with user info.
func holdsCredentials(u *url.URL) bool {
	if u.User != nil {
		return true
	}
	for _, vs := range u.Query() {
		for _, v := range vs {
			if q, err := url.Parse(v); err == nil && q.User != nil {
				return true
			}
		}
	}
	return false
}

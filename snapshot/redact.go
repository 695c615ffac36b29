package snapshot

import (
	"net/url"
	"strings"
)

// redactedError is an error whose text had a store URL's password removed;
// errors.Is and errors.As still see its cause.
type redactedError struct {
	msg   string
	cause error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.cause }

// redacted returns err with every form of the password of rawURL (and of
// u, the URL as rewritten for the driver, when not nil) removed from its
// text, or err itself when its text holds none.
func redacted(err error, rawURL string, u *url.URL) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	if u != nil {
		msg = strings.ReplaceAll(msg, u.String(), u.Redacted())
	}
	msg = strings.ReplaceAll(msg, rawURL, redactRawURL(rawURL))
	for _, secret := range passwords(rawURL, u) {
		msg = strings.ReplaceAll(msg, secret, "xxxxx")
	}
	if msg == err.Error() {
		return err
	}
	return &redactedError{msg: msg, cause: err}
}

// passwords returns the forms a URL's password may take in an error's
// text: as written in rawURL, unescaped, and escaped as url.URL.String
// and the query and path escapers write it.
func passwords(rawURL string, u *url.URL) []string {
	var ps []string
	if i := strings.Index(rawURL, "//"); i >= 0 {
		if at := strings.LastIndex(rawURL[i+2:], "@"); at >= 0 {
			if _, p, ok := strings.Cut(rawURL[i+2:i+2+at], ":"); ok {
				ps = append(ps, p)
				if un, err := url.PathUnescape(p); err == nil {
					ps = append(ps, un)
				}
			}
		}
	}
	if u != nil && u.User != nil {
		if p, ok := u.User.Password(); ok {
			ps = append(ps, p, url.QueryEscape(p), url.PathEscape(p))
			if _, esc, ok := strings.Cut(u.User.String(), ":"); ok {
				ps = append(ps, esc)
			}
		}
	}
	out := ps[:0]
	for _, p := range ps {
		if p != "" {
			out = append(out, p)
		}
	}
	return out
}

// redactRawURL strips the user information of a URL that may not parse:
// everything between its "//" and the last "@" after it (more than the
// user information when a path holds an "@", never less).
func redactRawURL(rawURL string) string {
	i := strings.Index(rawURL, "//")
	if i < 0 {
		return rawURL
	}
	at := strings.LastIndex(rawURL[i+2:], "@")
	if at < 0 {
		return rawURL
	}
	return rawURL[:i+2] + "xxxxx" + rawURL[i+2+at:]
}

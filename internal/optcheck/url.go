package optcheck

import (
	"errors"
	"net/url"
	"strings"
)

// redactedUserinfo stands for the credentials RedactURL removes; it is
// what url.URL.Redacted writes for a password.
const redactedUserinfo = "xxxxx"

// RedactURL returns rawURL fit to print: with its password replaced by
// "xxxxx" (url.URL.Redacted) when it parses with one user-info part and
// holds no other '@'; otherwise, since a URL that does not parse cannot
// say where its user info ends, with everything from the start of its
// authority (after "//", or after "scheme:" without one) to its last '@'
// replaced by "xxxxx". A value without '@' cannot carry user info and is
// returned as is. The second form also covers a password holding '/', '#'
// or '?', a URL nested in a query parameter (endpoint=https://user:pass@host)
// and a comma-separated list of such values, at the cost of hiding more
// than the credentials. A problem that quotes a URL-like value (a broker,
// a snapshot URL) quotes it through RedactURL. Safe for concurrent use.
func RedactURL(rawURL string) string {
	at := strings.LastIndex(rawURL, "@")
	if at < 0 {
		return rawURL
	}
	if u, err := url.Parse(rawURL); err == nil && u.User != nil && strings.Count(rawURL, "@") == 1 {
		if _, has := u.User.Password(); has {
			return u.Redacted()
		}
		// A user name alone may be the secret (a token as user name).
		u.User = url.User(redactedUserinfo)
		return u.String()
	}
	start := 0
	if i := strings.Index(rawURL, "//"); i >= 0 && i < at {
		start = i + 2
	} else if i := strings.Index(rawURL, ":"); i >= 0 && i < at {
		start = i + 1
	}
	return rawURL[:start] + redactedUserinfo + rawURL[at:]
}

// URLParseReason says in words why url.Parse refused a URL. It never
// quotes the URL or any part of it: url.Parse's own messages do ("invalid
// port \":s3cr3t\" after host" is part of a password).
func URLParseReason(err error) string {
	var uerr *url.Error
	if errors.As(err, &uerr) {
		err = uerr.Err
	}
	var esc url.EscapeError
	var host url.InvalidHostError
	switch {
	case errors.As(err, &esc):
		return "has a '%' not followed by two hexadecimal digits (write a literal '%' as %25)"
	case errors.As(err, &host):
		return "has a character that a host name may not hold"
	}
	msg := err.Error()
	switch {
	case strings.HasPrefix(msg, "invalid port"):
		return "has a host followed by ':' and something other than a port number"
	case msg == "missing protocol scheme":
		return "has no scheme, such as s3://"
	case strings.Contains(msg, "invalid control character"):
		return "holds a control character, such as a newline"
	case strings.Contains(msg, "invalid userinfo"):
		return "has characters before '@' that a user name or password may not hold unescaped"
	case strings.Contains(msg, "first path segment"):
		return "has a ':' before its first '/' but no valid scheme before it"
	case strings.Contains(msg, "missing ']'"):
		return "has a '[' in its host without a closing ']'"
	}
	return "does not parse as a URL"
}

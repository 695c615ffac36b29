package app

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestProfilesOnlyWhenAsked checks that Go's runtime profiles are served at
// /debug/pprof/ with KDEDUP_PPROF and not without, and that the probes and
// /metrics answer either way.
func TestProfilesOnlyWhenAsked(t *testing.T) {
	for _, profiles := range []bool{false, true} {
		srv := httptest.NewServer(httpHandler(prometheus.NewRegistry(), func() bool { return true }, func() error { return nil }, profiles))
		get := func(path string) (int, string) {
			t.Helper()
			resp, err := http.Get(srv.URL + path)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			return resp.StatusCode, string(body)
		}
		for _, path := range []string{"/metrics", "/healthz", "/readyz"} {
			if code, _ := get(path); code != http.StatusOK {
				t.Errorf("profiles %v: %s answered %d", profiles, path, code)
			}
		}
		want := http.StatusNotFound
		if profiles {
			want = http.StatusOK
		}
		for _, path := range []string{"/debug/pprof/", "/debug/pprof/heap?debug=1", "/debug/pprof/goroutine?debug=1", "/debug/pprof/cmdline"} {
			if code, _ := get(path); code != want {
				t.Errorf("profiles %v: %s answered %d, want %d", profiles, path, code, want)
			}
		}
		if profiles {
			if _, body := get("/debug/pprof/heap?debug=1"); !strings.Contains(body, "heap profile") {
				t.Errorf("/debug/pprof/heap?debug=1 is not a heap profile: %.200q", body)
			}
		}
		srv.Close()
	}
}

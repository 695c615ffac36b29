package budget

import (
	"errors"
	"testing"

	"github.com/kdedup/kdedup/store"
)

// storeBytes and storeBytes2MiB are store.Options.MemoryBytes at the
// defaults and with FlushBytes 2 MiB (TestStoreBytes ties them).
const (
	storeBytes     = 442 * mib
	storeBytes2MiB = 442 * mib
)

// TestPlanAddsUp: over budgets from 2 GiB to 64 GiB, every share is
// positive, the shares add up to the total exactly (outside Go + GoLimit,
// headroom + live, live = its parts), the fetch buffer stays within
// franz-go's default and 4 MiB, and a larger budget never gets a smaller
// cache.
func TestPlanAddsUp(t *testing.T) {
	var prevCache int64
	for total := int64(2 << 30); total <= 64<<30; total += total / 7 {
		s, err := Plan(Inputs{TotalBytes: total, StoreBytes: storeBytes, DecompressBytes: 64 * mib, PageBytes: 4096})
		if err != nil {
			t.Fatalf("total %d: %v", total, err)
		}
		for name, v := range map[string]int64{"NonGo": s.NonGo, "GoLimit": s.GoLimit, "Headroom": s.Headroom, "Cache": s.Cache, "Dirty": s.Dirty, "Fetch": s.Fetch} {
			if v <= 0 {
				t.Fatalf("total %d: %s = %d", total, name, v)
			}
		}
		if s.NonGo+s.GoLimit != total || s.Headroom+s.Live != s.GoLimit ||
			s.Live != s.Runtime+s.Store+s.Fetch+s.Decompress+s.Dirty+s.Cache {
			t.Fatalf("total %d: shares do not add up: %+v", total, s)
		}
		if s.Fetch < minFetchBytes || s.Fetch > maxFetchBytes {
			t.Fatalf("total %d: fetch %d outside [%d, %d]", total, s.Fetch, minFetchBytes, maxFetchBytes)
		}
		if s.Cache < prevCache {
			t.Fatalf("total %d: cache %d, smaller than %d for a smaller budget", total, s.Cache, prevCache)
		}
		if got := s.MaxDirtyPageBytes() * 3 / 2; got > s.Dirty {
			t.Fatalf("total %d: 1.5 x the dirty bound (%d) exceeds the dirty share %d", total, got, s.Dirty)
		}
		if s.CacheOverride || s.Over != 0 {
			t.Fatalf("total %d: an override without CacheBytes: %+v", total, s)
		}
		prevCache = s.Cache
	}
}

// TestPlanTooSmall: a budget that leaves the cache under 16 pages is
// refused with ErrTooSmall, and the least budget the error names is the
// least accepted, to the MiB.
func TestPlanTooSmall(t *testing.T) {
	for _, in := range []Inputs{
		{TotalBytes: 256 * mib, StoreBytes: storeBytes, DecompressBytes: 64 * mib, PageBytes: 4096},
		{TotalBytes: 0, StoreBytes: 100 * mib, DecompressBytes: mib, PageBytes: 65536},
		{TotalBytes: 700 * mib, StoreBytes: storeBytes, DecompressBytes: 64 * mib, PageBytes: 512},
	} {
		_, err := Plan(in)
		if !errors.Is(err, ErrTooSmall) {
			t.Fatalf("%+v: err = %v, want ErrTooSmall", in, err)
		}
		l := least(in)
		ok := in
		ok.TotalBytes = l
		if _, err := Plan(ok); err != nil {
			t.Errorf("%+v: the least budget %d is refused: %v", in, l, err)
		}
		ok.TotalBytes = l - mib
		if _, err := Plan(ok); err == nil {
			t.Errorf("%+v: %d, a MiB under the least budget %d, is accepted", in, l-mib, l)
		}
	}
}

// TestPlanCacheOverride: CacheBytes is taken as given, even from a budget
// too small for a cache of its own, and Over is how much it passes the
// share the budget had for it.
func TestPlanCacheOverride(t *testing.T) {
	in := Inputs{TotalBytes: 2 << 30, StoreBytes: storeBytes, DecompressBytes: 64 * mib, PageBytes: 4096}
	share, err := Plan(in)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		cache, over int64
	}{
		{share.Cache / 2, 0},
		{share.Cache, 0},
		{share.Cache + 10*mib, 10 * mib},
	} {
		in.CacheBytes = tc.cache
		s, err := Plan(in)
		if err != nil {
			t.Fatal(err)
		}
		if s.Cache != tc.cache || !s.CacheOverride || s.Over != tc.over {
			t.Errorf("CacheBytes %d: cache %d, override %t, over %d; want over %d", tc.cache, s.Cache, s.CacheOverride, s.Over, tc.over)
		}
	}
	small := Inputs{TotalBytes: 128 * mib, StoreBytes: storeBytes, PageBytes: 4096, CacheBytes: mib}
	if _, err := Plan(small); err != nil {
		t.Errorf("a cache override with a small budget: %v", err)
	}
}

// TestTotal: KDEDUP_MEMORY_BYTES first, then 90% of the container's
// limit, then the default, with where it came from.
func TestTotal(t *testing.T) {
	fail := func() (uint64, error) { return 0, errors.New("cannot read") }
	if n, src := Total(5<<30, func() (uint64, error) { return 1 << 30, nil }); n != 5<<30 || src != "KDEDUP_MEMORY_BYTES" {
		t.Errorf("configured: %d from %q", n, src)
	}
	if n, _ := Total(0, func() (uint64, error) { return 10 << 30, nil }); n != 9<<30 {
		t.Errorf("container 10GiB: %d, want 9GiB", n)
	}
	if n, src := Total(0, fail); n != DefaultTotalBytes || src != "default (the container memory limit could not be read (cannot read))" {
		t.Errorf("unreadable limit: %d from %q", n, src)
	}
}

// TestStoreBytes ties the store's memory this file's figures assume to
// store.Options.MemoryBytes, to the MiB.
func TestStoreBytes(t *testing.T) {
	for _, tc := range []struct {
		flush, want int64
	}{
		{0, storeBytes},
		{2 * mib, storeBytes2MiB},
	} {
		if got := (store.Options{FlushBytes: tc.flush}).MemoryBytes(); got/mib != tc.want/mib {
			t.Errorf("FlushBytes %d: the store holds %d MiB, the figures here assume %d MiB", tc.flush, got/mib, tc.want/mib)
		}
	}
}

// TestPlanRestores: with a restore's memory R given, restores and replays
// get their share of the live memory: MaxRestores of R each, 1 to 8,
// never less than one restore and, below 8, the most that fit in live/32;
// the shares still add up, and the cache gives up exactly that share.
func TestPlanRestores(t *testing.T) {
	const r = 80 * mib
	for total := int64(3 << 30); total <= 64<<30; total += total / 5 {
		in := Inputs{TotalBytes: total, StoreBytes: storeBytes, DecompressBytes: 64 * mib, PageBytes: 4096}
		without, err := Plan(in)
		if err != nil {
			t.Fatal(err)
		}
		in.RestoreBytes = r
		s, err := Plan(in)
		if err != nil {
			t.Fatalf("total %d: %v", total, err)
		}
		live := s.GoLimit - s.Headroom
		want := int(min(max(live/32, r)/r, 8))
		if s.MaxRestores != want || s.Restore != int64(want)*r {
			t.Fatalf("total %d: %d restores, share %d; want %d of %d (live %d)", total, s.MaxRestores, s.Restore, want, r, live)
		}
		if s.Live != s.Runtime+s.Store+s.Fetch+s.Decompress+s.Dirty+s.Restore+s.Cache || s.Headroom+s.Live != s.GoLimit {
			t.Fatalf("total %d: shares do not add up: %+v", total, s)
		}
		if without.Cache-s.Cache != s.Restore || without.MaxRestores != 0 {
			t.Fatalf("total %d: the cache shrank by %d for a restore share of %d; without R, %d restores", total, without.Cache-s.Cache, s.Restore, without.MaxRestores)
		}
	}
}

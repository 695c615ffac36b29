package dedup

import (
	"errors"
	"testing"

	"github.com/kdedup/kdedup/filter"
	"github.com/kdedup/kdedup/internal/optcheck"
	"github.com/kdedup/kdedup/store"
)

// The store owns the page size: an Opener whose filter parameters leave
// it 0 takes the store's, reports it (PageBytes, what the consumer sizes
// transactions with), and its deduplicators' chains use it; a page size
// other than the store's is refused naming both.
func TestOpenerTakesTheStoresPageSize(t *testing.T) {
	db := openDB(t, "", store.Options{PageBytes: 1024})
	o, err := NewOpener(db, Options{Filter: filter.Params{Capacity: 5000}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := o.PageBytes(); got != 1024 {
		t.Errorf("Opener.PageBytes %d, want the store's 1024", got)
	}
	if got := o.Options().Filter.PageBytes; got != 1024 {
		t.Errorf("the Opener's filter parameters hold %d-byte pages, want the store's 1024", got)
	}
	if _, err := NewOpener(db, Options{Filter: filter.Params{PageBytes: 2048}}, nil); !errors.Is(err, ErrOptions) {
		t.Errorf("NewOpener with 2048-byte pages over a 1024-byte store: %v, want ErrOptions", err)
	}
}

// Validate checks the options as given, each problem naming its field:
// MaxOccurrences 0 is refused there (NewOpener and Open take it as 1
// first), above twice the bucket size is refused, and a DeleteValue needs
// a DeleteHeader.
func TestOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    Options
		want []string
	}{
		{"valid", Options{MaxOccurrences: 8}, nil},
		{"zero occurrences as given", Options{}, []string{"MaxOccurrences"}},
		{"over twice the bucket size", Options{MaxOccurrences: 5, Filter: filter.Params{BucketSize: 2}}, []string{"MaxOccurrences"}},
		{"delete value without a header", Options{MaxOccurrences: 1, DeleteValue: "delete"}, []string{"DeleteHeader"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.o.Validate()
			var got []string
			var oe *optcheck.Error
			if errors.As(err, &oe) {
				for _, p := range oe.Problems {
					got = append(got, p.Field)
				}
			}
			if len(got) != len(tc.want) || (len(got) > 0 && got[0] != tc.want[0]) || (err != nil && !errors.Is(err, ErrOptions)) {
				t.Errorf("Validate: %v, want problems naming %v (ErrOptions)", err, tc.want)
			}
		})
	}
	db := openDB(t, "", store.Options{})
	if _, err := NewOpener(db, Options{}, nil); err != nil {
		t.Errorf("NewOpener with MaxOccurrences 0 (the default, 1): %v", err)
	}
}

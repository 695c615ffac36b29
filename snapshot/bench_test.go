package snapshot

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/kdedup/kdedup/filter"
	"github.com/kdedup/kdedup/internal/s3test"
	"github.com/kdedup/kdedup/store"
)

// BenchmarkPut uploads a partition image of 64 MiB of random 4 KiB pages
// (a cuckoo filter's pages near full load look random) to a directory
// store, or with KDEDUP_TEST_S3=versitygw to VersityGW on loopback: the
// encoding, compression, checksum and client cost of one snapshot, apart
// from the Badger export. MB/s is of state.
//
//	go test -run '^$' -bench Put -benchtime 5x ./snapshot
func BenchmarkPut(b *testing.B) {
	const pageBytes, pages = 4096, 16384
	rng := rand.New(rand.NewPCG(1, 2))
	data := make([]byte, pageBytes*pages)
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	src := func(h func(store.Image) error, p func(filter.PageID, []byte) error) (bool, error) {
		if err := h(store.Image{Meta: []byte("meta"), Checkpoint: store.Checkpoint{Offset: 1}, PageBytes: pageBytes}); err != nil {
			return true, err
		}
		for i := range pages {
			if err := p(filter.PageID{Page: uint32(i)}, data[i*pageBytes:(i+1)*pageBytes]); err != nil {
				return true, err
			}
		}
		return true, nil
	}
	url := "file://" + b.TempDir()
	if s3test.Enabled() {
		url = s3test.New(b).URL("bench")
	}
	st, err := Open(context.Background(), url)
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	b.SetBytes(int64(len(data)))
	b.ResetTimer()
	for range b.N {
		if _, err := st.Put(context.Background(), tp, src); err != nil {
			b.Fatal(err)
		}
	}
}

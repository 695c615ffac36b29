package snapshot

import (
	"context"
	"io"
)

// ctxReader is a blob reader that ends with ctx: each Read returns
// ctx.Err() once ctx is done. gocloud.dev's fileblob never looks at the
// context in its reader (fileblob.go, reader.Read) and its writer looks
// only in Close, so without these a cancelled transfer from or to a
// directory store ran to its end; with them it stops within one buffer
// (the zstd block or the io.Copy buffer in flight).
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// ctxWriter is ctxReader's writing side: each Write returns ctx.Err()
// once ctx is done.
type ctxWriter struct {
	ctx context.Context
	w   io.Writer
}

func (c ctxWriter) Write(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.w.Write(p)
}

package h1

import "io"

// Sized reads exactly n bytes of r: it reports io.EOF together with the
// last of them (so that a reader knows the body ended without another
// call), and a stream that ends first as io.ErrUnexpectedEOF. Close does
// nothing: the stream belongs to the connection.
type Sized struct {
	r io.Reader
	n int64
}

// NewSized returns a reader of the n bytes that follow on r.
func NewSized(r io.Reader, n int64) *Sized { return &Sized{r: r, n: n} }

// Remaining is how many bytes of the body are still to be read.
func (b *Sized) Remaining() int64 { return b.n }

func (b *Sized) Read(p []byte) (int, error) {
	if b.n <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > b.n {
		p = p[:b.n]
	}
	n, err := b.r.Read(p)
	b.n -= int64(n)
	switch {
	case b.n == 0:
		return n, io.EOF
	case err == io.EOF:
		return n, io.ErrUnexpectedEOF
	}
	return n, err
}

// Close does nothing (see Sized).
func (b *Sized) Close() error { return nil }

var _ io.ReadCloser = (*Sized)(nil)

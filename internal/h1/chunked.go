package h1

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http/httputil"
	"strconv"

	"golang.org/x/net/http/httpguts"
)

// ChunkedReader reads a chunked body (RFC 9112 section 7.1) and, at its
// end, the trailer section, which it checks and drops (egret relays no
// trailers), so that the connection is left at the next message. The
// chunks are decoded by net/http's decoder (httputil.NewChunkedReader),
// whose errors are returned as they are. A trailer section is taken as
// net/http takes one: field lines ending in CRLF with token names and
// values without control characters, each within br's buffer; a line
// otherwise, or one more than lim.MaxFields, is an *Error (ErrMalformed,
// ErrTooManyFields), as is a section past lim.MaxBytes (ErrHeadTooLarge);
// a stream that ends in it is io.ErrUnexpectedEOF. An error is returned
// again by every later Read. Close does nothing: the stream belongs to the
// connection.
type ChunkedReader struct {
	br  *bufio.Reader
	r   io.Reader
	lim Limits
	err error
}

// NewChunkedReader returns a reader of the chunked body that follows on
// br, its trailer section bounded by lim.
func NewChunkedReader(br *bufio.Reader, lim Limits) *ChunkedReader {
	return &ChunkedReader{br: br, r: httputil.NewChunkedReader(br), lim: lim}
}

func (c *ChunkedReader) Read(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	n, err := c.r.Read(p)
	if err == io.EOF {
		if terr := c.trailer(); terr != nil {
			err = terr
		}
	}
	c.err = err
	return n, err
}

// Close does nothing (see ChunkedReader).
func (c *ChunkedReader) Close() error { return nil }

// trailer reads the trailer section and the empty line that ends it.
func (c *ChunkedReader) trailer() error {
	size := 0
	for fields := 0; ; fields++ {
		line, err := c.br.ReadSlice('\n')
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return fmt.Errorf("reading the trailer: %w", err)
		}
		if size += len(line); c.lim.MaxBytes > 0 && size > c.lim.MaxBytes {
			return errorf(ErrHeadTooLarge, "trailer section")
		}
		if !bytes.HasSuffix(line, []byte("\r\n")) {
			return errorf(ErrMalformed, "trailer line without CRLF")
		}
		if len(line) == 2 {
			return nil
		}
		if c.lim.MaxFields > 0 && fields >= c.lim.MaxFields {
			return errorf(ErrTooManyFields, "trailer section")
		}
		if k, v, ok := bytes.Cut(line[:len(line)-2], []byte(":")); !ok || !httpguts.ValidHeaderFieldName(string(k)) ||
			!httpguts.ValidHeaderFieldValue(string(bytes.Trim(v, " \t"))) {
			return errorf(ErrMalformed, "trailer line %q", clip(string(line)))
		}
	}
}

var _ io.ReadCloser = (*ChunkedReader)(nil)

// WriteChunk writes p to bw as one chunk: its size in hex, CRLF, p, CRLF.
// An empty p writes nothing (a chunk of size 0 would end the body). The
// error is bw's.
func WriteChunk(bw *bufio.Writer, p []byte) error {
	if len(p) == 0 {
		return nil
	}
	bw.Write(strconv.AppendInt(bw.AvailableBuffer(), int64(len(p)), 16))
	bw.WriteString("\r\n")
	bw.Write(p)
	_, err := bw.WriteString("\r\n")
	return err
}

// EndChunks writes the last chunk and an empty trailer section to bw.
func EndChunks(bw *bufio.Writer) error {
	_, err := bw.WriteString("0\r\n\r\n")
	return err
}

package h1

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http/httputil"
	"net/textproto"
)

// ChunkedReader reads a chunked body (RFC 9112 section 7.1) and, at its
// end, the trailer section, which it drops (egret relays no trailers), so
// that the connection is left at the next message. Both are read as
// net/http reads them: the chunks by its decoder (httputil.NewChunkedReader),
// whose errors are returned as they are; the trailer section only if its
// end (its first empty line, ended by CRLF or a bare LF, where net/http
// looks for CRLF CRLF) is within br's buffer (else ErrHeadTooLarge: that
// is its bound), then by net/textproto (a line it refuses is
// ErrMalformed). A stream that ends in it is io.ErrUnexpectedEOF.
// FuzzChunkedReader holds it to net/http's reading of a request body. An error is returned again by
// every later Read. Close does nothing: the stream belongs to the
// connection.
type ChunkedReader struct {
	br  *bufio.Reader
	r   io.Reader
	err error
}

// NewChunkedReader returns a reader of the chunked body that follows on
// br.
func NewChunkedReader(br *bufio.Reader) *ChunkedReader {
	return &ChunkedReader{br: br, r: httputil.NewChunkedReader(br)}
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

// trailer reads the trailer section and the empty line that ends it, as
// net/http's body.readTrailer does, but for where it looks for the end:
// the first empty line, ended by CRLF or by a bare LF (RFC 9112 section
// 2.2 lets a recipient take a bare LF as a line's end, and
// textproto.ReadMIMEHeader, which reads the section, does), where net/http
// waits for a CRLF CRLF, which after a trailer ended by bare LFs only comes
// with the client's next bytes. An error reading the connection is
// returned as it is (a deadline stays a deadline).
func (c *ChunkedReader) trailer() error {
	// The common case, no trailer: the empty line at once. A byte at a
	// time: a bare LF may be the last byte the client sends.
	buf, err := c.br.Peek(1)
	if len(buf) == 1 && buf[0] == '\r' {
		buf, err = c.br.Peek(2)
	}
	if string(buf) == "\r\n" || string(buf) == "\n" {
		c.br.Discard(len(buf))
		return nil
	}
	if err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return fmt.Errorf("reading the trailer: %w", err)
	}
	switch ended, err := upcomingEmptyLine(c.br); {
	case err != nil:
		return fmt.Errorf("reading the trailer: %w", err)
	case !ended:
		return errorf(ErrHeadTooLarge, "trailer section longer than the read buffer")
	}
	if _, err := textproto.NewReader(c.br).ReadMIMEHeader(); err != nil {
		var pe textproto.ProtocolError
		switch {
		case err == io.EOF:
			err = io.ErrUnexpectedEOF
		case errors.As(err, &pe):
			return errorf(ErrMalformed, "trailer section: %v", pe)
		}
		return fmt.Errorf("reading the trailer: %w", err)
	}
	return nil
}

// upcomingEmptyLine reports whether an empty line (LF or CRLF, at the
// start or after a LF) comes within br's buffer, reading no further than
// its end: false when the buffer fills first. The stream's end before it
// is io.ErrUnexpectedEOF; another error of the stream is returned as it
// is.
func upcomingEmptyLine(br *bufio.Reader) (bool, error) {
	for n := 1; ; n++ {
		buf, err := br.Peek(n) // more is read only when n passes what is buffered
		if len(buf) == n && buf[n-1] == '\n' {
			line := buf[:n-1]
			if i := bytes.LastIndexByte(line, '\n'); i >= 0 {
				line = line[i+1:]
			}
			if len(line) == 0 || string(line) == "\r" {
				return true, nil
			}
		}
		switch {
		case err == bufio.ErrBufferFull:
			return false, nil
		case err == io.EOF:
			return false, io.ErrUnexpectedEOF
		case err != nil:
			return false, err
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
	// The size in hex, a byte at a time: a slice of it would escape, or
	// (bw.AvailableBuffer when bw is full) be allocated.
	n := uint(len(p))
	shift := 0
	for n>>shift > 15 {
		shift += 4
	}
	for ; shift >= 0; shift -= 4 {
		bw.WriteByte("0123456789abcdef"[n>>shift&15])
	}
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
